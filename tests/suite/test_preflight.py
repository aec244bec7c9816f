"""The first minute of a job proves the GPU path (issue #50): before any
step, ``osfl suite run`` imports what the catalogue needs and runs every
registered method once on the device (``osfl.suite.preflight``). On a CPU
the device is the simulated one of ``tests/support/simulated_device.py``
(every op checked against CUDA's placement rules; its limits are that
module's: the ``device.type == "cuda"`` branches take their CPU path); a
failure, injected here, stops the job in one line naming the method and the
op, and comes back in the bundle's ``plan.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import osfl.suite.execute
from osfl.cli import main
from osfl.models.cnn import SmallCNN
from osfl.suite import preflight
from osfl.suite.execute import SuiteRequest, run_suite
from osfl.suite.preflight import PreflightError, check_imports, check_methods, run_preflight
from osfl.suite.steps import Step, Work
from support.paths import ROOT
from support.simulated_device import DEVICE_TYPE, simulated_device
from support.smoke import one_torch_thread  # noqa: F401  (an autouse fixture)
from support.suite_fakes import mfu_command

RATES = {"decode": 1.0, "startup_s": 0.0, "resnet18_32": 1.0, "vits16_224": 1.0, "resize_224": 1.0}


def test_the_imports_the_catalogue_needs_are_checked(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert {"datasets", "flwr_datasets", "omegaconf", "osfl.methods"} <= set(preflight.IMPORTS)
    done = check_imports(("json",), ["benchmarks/repro_rlu.py"])
    assert done == ["json", "benchmarks/repro_rlu.py"]
    with pytest.raises(PreflightError, match=r"cannot import no_such_module_osfl \(Module"):
        check_imports(("json", "no_such_module_osfl"))
    with pytest.raises(PreflightError, match="does not exist"):
        check_imports((), ["benchmarks/no_such_script.py"])


def test_methods_run_on_the_simulated_device_the_catalogues_first() -> None:
    """FedAvg once on the simulated GPU (every method, FAFI's SALT views with
    ColorJitter drawn on the device among them: the slow test below); the
    catalogue's methods go first."""
    with simulated_device() as dev:
        report = check_methods(dev, ["fedavg"])
    assert [m["method"] for m in report["methods"]] == ["fedavg"]
    order = preflight.method_order(["scaffold", "eftvit", "local", "fafi", "fedavg"])
    assert order == ["fafi", "fedavg", "eftvit", "scaffold", "local"]
    assert report["not_reached"] == [] and all(m["seconds"] >= 0 for m in report["methods"])


def _cpu_tensor_in_the_model(monkeypatch) -> None:
    """The bug the preflight exists for: a tensor made on the CPU meets the
    model's output on the GPU."""
    forward = SmallCNN.forward

    def bad(self, x):
        return forward(self, x) + torch.zeros(self.num_classes)

    monkeypatch.setattr(SmallCNN, "forward", bad)


def test_a_failure_names_the_method_and_the_op(monkeypatch) -> None:
    _cpu_tensor_in_the_model(monkeypatch)
    with simulated_device() as dev, pytest.raises(PreflightError) as e:
        check_methods(dev, ["fedavg", "ensemble"])
    text = str(e.value)
    assert text.startswith(
        f"preflight on {DEVICE_TYPE}:0: method fedavg failed at op aten.add.Tensor"
    )
    assert "osfl/" in text and "same device" in text and "\n" not in text
    assert e.value.details["method"] == "fedavg" and e.value.details["op"] == "aten.add.Tensor"


def test_methods_past_the_budget_are_listed_not_failed() -> None:
    now = [0.0]

    def run(name, device, splits):
        now[0] += 50.0

    report = check_methods("cpu", ["fafi", "fedavg", "ensemble"], clock=lambda: now[0], run=run)
    assert [m["method"] for m in report["methods"]] == ["fafi", "fedavg"]
    assert report["not_reached"] == ["ensemble"] and report["seconds"] == 100.0


def test_the_method_runs_need_cuda_unless_given_a_device() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(PreflightError, match="need a CUDA device"):
        run_preflight("all", [])


def test_a_failed_preflight_stops_the_job_in_one_line_and_comes_back_in_the_bundle(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Through ``osfl suite run``: exit status 2, one line naming the method
    and the op; no step runs; the bundle's ``plan.json`` holds the report."""
    _cpu_tensor_in_the_model(monkeypatch)
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps(RATES))
    out = tmp_path / "suite"
    with simulated_device() as dev:
        monkeypatch.setattr(osfl.suite.execute, "run_preflight",
                            lambda mode, scripts: run_preflight(mode, (), device=dev,
                                                                names=["fedavg"]))  # fmt: skip
        argv = ["suite", "run", "--budget", "5", "--out", str(out), "--sections", "mfu",
                "--rates", str(rates), "--preflight", "all"]  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("osfl: error: preflight on simgpu:0: method fedavg")
    assert "aten.add.Tensor" in err and "\n" not in err
    plan = json.loads((out / "bundle" / "plan.json").read_text())
    assert plan["preflight"]["ok"] is False and plan["preflight"]["method"] == "fedavg"
    assert [s["status"] for s in plan["steps"]] == ["pending"]
    assert not (out / "runs").exists()


def test_a_passed_preflight_is_not_run_again_in_the_later_command(tmp_path: Path) -> None:
    calls: list[str] = []

    def check(mode, scripts):
        calls.append(mode)
        return {"imports": ["json"]}

    step = Step(name="one", section="s", kind="mfu", argv=("suite", "mfu", "--out", "{out}"),
                tiny=(), work=Work({"decode": 1.0}))  # fmt: skip

    command = mfu_command

    for _ in range(2):
        req = SuiteRequest(out=tmp_path, budget_min=5, steps=[step], rates=RATES, preflight="all")
        run_suite(req, command, log=lambda s: None, preflight=check)
    assert calls == ["all"]


@pytest.mark.slow
def test_every_registered_method_passes_the_preflight_on_the_simulated_device() -> None:
    with simulated_device() as dev:
        report = check_methods(dev, budget_s=3600.0)
    import osfl.methods  # noqa: F401
    from osfl.fl.method import METHODS

    assert sorted(m["method"] for m in report["methods"]) == sorted(METHODS.names())
