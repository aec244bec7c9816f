"""``osfl suite`` (issue #32): the pack a lent GPU machine carries, the plan
of the runs that fit a budget, and the dry run of the whole path on a CPU.

The dry run here runs the catalogue's own tiny commands (8-px digits, a
one-block ViT) through ``osfl.cli.main``, as ``osfl suite run --dry-run``
does: calibration, plan, runs, rows. Its sections are the encoder, the
frozen-encoder steps and the MFU benchmark; the FAFI and EFTViT steps' tiny
commands run in the slow test of the whole catalogue.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from osfl import assembly
from osfl.cli import main
from osfl.config import load_config
from osfl.data import load_data
from osfl.errors import ConfigError, DataError
from osfl.pretrain.config import load_pretrain_config
from osfl.suite import mfu
from osfl.suite.execute import SuiteRequest, run_suite, with_overrides
from osfl.suite.pack import pack, read_manifest, unpack_imagefolder
from osfl.suite.plan import STEPS, Planned, Step, make_plan, select_steps

ROOT = Path(__file__).resolve().parents[1]


def _imagefolder(root: Path, per_class: int = 3) -> Path:
    """A stand-in for CIFAR-10's image folder: two classes of 8-px images, JPEG and PNG."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in ("cat", "dog"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(per_class):
                img = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
                img.save(d / f"{i:04d}.{'jpg' if i % 2 else 'png'}")
    return root


def test_the_pack_round_trip_gives_the_same_files_and_images(tmp_path: Path) -> None:
    src = _imagefolder(tmp_path / "cifar")
    weights = tmp_path / "enc.safetensors"
    weights.write_bytes(b"weights")
    (tmp_path / "enc.card.json").write_text("{}")
    manifest = pack(tmp_path / "gpu_pack", cifar10=src, weights=[weights])
    assert set(manifest["files"]) == {
        "cifar10.npz",
        "pretrained/enc.safetensors",
        "pretrained/enc.card.json",
    }
    assert manifest["files"]["cifar10.npz"]["images"] == {"train": 6, "test": 6}
    assert read_manifest(tmp_path / "gpu_pack") == manifest
    with np.load(tmp_path / "gpu_pack" / "cifar10.npz", allow_pickle=False) as z:
        assert z["train_bytes"].dtype == np.uint8 and z["train_paths"].dtype == np.uint8
    out = unpack_imagefolder(tmp_path / "gpu_pack" / "cifar10.npz", tmp_path / "unpacked")
    originals = sorted(p.relative_to(src) for p in src.glob("*/*/*"))
    assert sorted(p.relative_to(out) for p in out.glob("*/*/*")) == originals
    for rel in originals:  # the files' own bytes: not re-encoded
        assert (out / rel).read_bytes() == (src / rel).read_bytes()
    a, b = load_data(f"imagefolder:{src}"), load_data(f"imagefolder:{out}")
    assert torch.equal(a.train.images, b.train.images) and torch.equal(a.test.labels, b.test.labels)
    assert a.train.classes == b.train.classes
    # unpacked once: a second call finds the stamp and writes nothing
    (out / "train" / "cat" / "0000.png").unlink()
    unpack_imagefolder(tmp_path / "gpu_pack" / "cifar10.npz", tmp_path / "unpacked")
    assert not (out / "train" / "cat" / "0000.png").exists()


def test_a_subset_is_packed_and_a_pack_over_the_limit_is_refused(tmp_path: Path) -> None:
    src = _imagefolder(tmp_path / "cifar", per_class=4)
    m = pack(tmp_path / "small", cifar10=src, max_per_class=1)
    assert m["files"]["cifar10.npz"]["images"] == {"train": 2, "test": 2}
    with pytest.raises(ConfigError, match=r"over the 0 MiB .*--max-per-class"):
        pack(tmp_path / "big", cifar10=src, limit_bytes=100)


def test_a_damaged_pack_is_refused(tmp_path: Path) -> None:
    pack(tmp_path / "p", cifar10=_imagefolder(tmp_path / "cifar"))
    with (tmp_path / "p" / "cifar10.npz").open("ab") as f:
        f.write(b"x")
    with pytest.raises(DataError, match="differs"):
        read_manifest(tmp_path / "p")
    assert read_manifest(tmp_path / "nothing") is None



def test_the_wheels_the_lent_machine_lacks_are_packed_and_pinned(tmp_path: Path) -> None:
    import importlib.metadata

    from osfl.suite.pack import LENT_MACHINE_LACKS, wheel_download_command

    wheel = tmp_path / "omegaconf-2.4.0-py3-none-any.whl"
    wheel.write_bytes(b"PK stand-in")
    m = pack(tmp_path / "p", cifar10=None, wheels=[wheel])
    assert m["files"]["wheels/" + wheel.name]["bytes"] == len(b"PK stand-in")
    assert read_manifest(tmp_path / "p") == m
    with pytest.raises(ConfigError, match="not a wheel"):
        pack(tmp_path / "q", cifar10=None, wheels=[tmp_path / "p" / "MANIFEST.json"])
    argv = wheel_download_command(tmp_path / "w")
    # the machine's Python and binary wheels only, no dependencies, versions as installed here
    assert argv[argv.index("--python-version") + 1] == "3.12"
    assert "--no-deps" in argv and "--only-binary=:all:" in argv
    assert argv[-len(LENT_MACHINE_LACKS):] == [
        f"{n}=={importlib.metadata.version(n)}" for n in LENT_MACHINE_LACKS
    ]


# --------------------------------------------------------------------------- plan
def _step(name: str, *, needs: tuple[str, ...] = (), ratio: float = 10.0) -> Step:
    return Step(name=name, section="s", kind="mfu", argv=("suite", "mfu"), calibrate=(),
                ratio=ratio, tiny=("suite", "mfu"), needs=needs)  # fmt: skip


def test_the_plan_takes_steps_in_order_of_value_while_they_fit() -> None:
    est = {"a": 50.0, "b": 80.0, "c": 30.0, "d": 10.0, "e": 5.0}
    planned = [Planned(_step(n, needs=("b",) if n == "d" else ()), estimate_s=s)
               for n, s in est.items()]  # fmt: skip
    make_plan(planned, budget_s=100.0)
    status = {p.step.name: p.status for p in planned}
    # a fits; b does not (80 > 50 left); c does (a later, cheaper step); d needs b; e fits
    assert status == {
        "a": "planned",
        "b": "skipped",
        "c": "planned",
        "d": "skipped",
        "e": "planned",
    }
    assert "needs b" in planned[3].reason and "80 s > 50 s" in planned[1].reason


def test_overrides_go_where_argparse_reads_them() -> None:
    run = _step("r")
    run = Step(**{**run.__dict__, "kind": "run"})
    assert with_overrides(run, ["run", "c.yaml", "a=1", "--out", "x"], ["b=2"]) == [
        "run", "c.yaml", "a=1", "b=2", "--out", "x"
    ]  # fmt: skip
    bench = _step("m")
    assert with_overrides(bench, ["suite", "mfu", "--steps", "30"], ["--steps", "3"])[-1] == "3"


def test_estimates_come_from_the_calibration_and_the_budget_holds(tmp_path: Path) -> None:
    """A fake clock and command: each calibration takes 1 s, each run its
    ratio's worth; the budget (4 min) holds the first two runs' estimates
    (100 + 100 s) but not the third's, and a step needing a failed one is
    skipped. Rows are written after every finished step."""
    now = [0.0]
    seen: list[list[str]] = []
    steps = [_step("one", ratio=100), _step("two", ratio=100), _step("three", ratio=100),
             _step("bad", ratio=1), _step("after_bad", ratio=1, needs=("bad",))]  # fmt: skip

    def command(argv):
        seen.append(list(argv))
        out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else None
        calibrating = "calibration" in str(out)
        name = out.name
        if name == "bad" and not calibrating:
            raise RuntimeError("CUDA out of memory")
        now[0] += 1.0 if calibrating else 100.0
        out.mkdir(parents=True)
        mfu_json = {"model": name, "dtype": "bfloat16", "batch": 1, "mfu": 0.5,
                    "achieved_tflops": 1.0, "provenance": {"gpu": "NVIDIA H100", "device": "cuda"}}  # fmt: skip
        (out / "mfu.json").write_text(json.dumps(mfu_json))
        if not calibrating and name == "two":  # rows of step one are already on disk
            assert json.loads((tmp_path / "rows.json").read_text())[0]["step"] == "one"
        return 0

    steps = [Step(**{**s.__dict__, "argv": ("suite", "mfu", "--out", "{out}")}) for s in steps]
    req = SuiteRequest(out=tmp_path, budget_min=4.0, steps=steps)
    result = run_suite(req, command, clock=lambda: now[0], log=lambda s: None)
    by = {p.step.name: p for p in result.planned}
    assert by["one"].calibration_s == 1.0 and by["one"].estimate_s == 100.0
    assert [by[n].status for n in ("one", "two", "three")] == ["done", "done", "skipped"]
    assert by["bad"].status == "failed" and "out of memory" in by["bad"].reason
    assert by["after_bad"].status == "skipped" and "did not finish" in by["after_bad"].reason
    assert [r["step"] for r in result.rows] == ["one", "two"]
    assert all(r["scale"] == "gpu" and r["ours"] == 50.0 for r in result.rows)
    md = (tmp_path / "reproduction_gpu.md").read_text()
    assert "Machine: NVIDIA H100" in md and "three: skipped" in md
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["status"] for s in plan["steps"]][:3] == ["done", "done", "skipped"]

    # a second call into the same directory goes on: nothing calibrated again,
    # the finished steps kept with their rows, the skipped one run now
    seen.clear()
    again = run_suite(req, command, clock=lambda: now[0], log=lambda s: None)
    assert [a[a.index("--out") + 1].split("/")[-2:] for a in seen] == [
        ["runs", "three"],
        ["runs", "bad"],
    ]
    assert [p.status for p in again.planned][:3] == ["done", "done", "done"]
    assert [r["step"] for r in again.rows] == ["one", "two", "three"]
    dry = SuiteRequest(out=tmp_path, budget_min=4.0, steps=steps, dry_run=True)
    with pytest.raises(ConfigError, match="another --out"):
        run_suite(dry, command, clock=lambda: now[0], log=lambda s: None)


def test_sections_bring_the_steps_they_need() -> None:
    with pytest.raises(ConfigError, match="valid: pretrain"):
        select_steps(["nope"])
    assert [s.name for s in select_steps(["eftvit"])] == ["pretrain_vits16", "eftvit_t1_b0.1"]
    assert [s.section for s in select_steps([])] == [s.section for s in STEPS]


# --------------------------------------------------------------------------- catalogue
@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_every_catalogue_command_loads(step: Step, monkeypatch) -> None:
    """Each paper-scale command and its calibration parse into a valid config
    (the configs it names exist and are not stale), without running."""
    monkeypatch.chdir(ROOT)
    argv = [a.replace("{out}", "/tmp/x").replace("{encoder}", "enc.safetensors")
            for a in with_overrides(step, step.argv, step.calibrate)]  # fmt: skip
    if step.kind == "mfu":
        assert argv[:2] == ["suite", "mfu"]
        mfu._parser().parse_args(argv[2:])
        return
    items = [a for a in argv[1:] if "=" in a or a.endswith(".yaml")]
    config, overrides = items[0], items[1:]
    if step.kind == "pretrain":
        cfg = load_pretrain_config(config, overrides)
        assert cfg.device == "cuda" and cfg.train.epochs == 1
        return
    cfg = load_config(config, overrides)
    assembly.check_names(cfg)
    assert cfg.device == "cuda" and cfg.scale == "gpu"


# --------------------------------------------------------------------------- mfu
def test_mfu_counts_the_step_and_knows_the_peaks(tmp_path: Path) -> None:
    assert mfu.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
    assert mfu.peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert mfu.peak_tflops("Some GPU", "bfloat16") is None
    args = mfu._parser().parse_args(
        ["--model", "vit_tiny_patch2_16", "--img-size", "8", "--batch", "2", "--steps", "1",
         "--warmup", "0", "--dtype", "float32", "--device", "cpu", "--out", str(tmp_path)]
    )  # fmt: skip
    r = mfu.measure(args)
    # a one-block ViT (dim 32, 16 patches + cls): forward >= the blocks' matmuls, x3 with backward
    tokens, dim = 17, 32
    block = 2 * tokens * dim * (3 * dim + dim + 2 * 4 * dim)  # qkv, proj, MLP (ratio 4)
    assert r["flops_per_step"] >= 3 * 2 * block
    assert r["mfu"] is None and r["peak_tflops"] is None  # no peak on a CPU


# --------------------------------------------------------------------------- dry run
def test_the_dry_run_runs_the_suite_end_to_end(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("OSFL_CIFAR10", raising=False)
    torch.set_num_threads(1)
    pack(tmp_path / "gpu_pack", cifar10=_imagefolder(tmp_path / "cifar"))
    out = tmp_path / "suite"
    argv = ["suite", "run", "--budget", "10", "--dry-run", "--out", str(out),
            "--sections", "pretrain,frozen,mfu", "--pack", str(tmp_path / "gpu_pack"),
            "--unpack-to", str(tmp_path / "unpacked")]  # fmt: skip
    assert main(argv) == 0
    import os

    assert os.environ["OSFL_CIFAR10"] == str(tmp_path / "unpacked" / "cifar10")
    plan = json.loads((out / "plan.json").read_text())
    assert {s["step"]["name"]: s["status"] for s in plan["steps"]} == {
        "pretrain_vits16": "done",
        "frozen_closed_a0.1": "done",
        "falcon_a0.1": "done",
        "mfu_vitb16_bf16": "done",
    }
    assert all(s["calibration_s"] > 0 and s["estimate_s"] > 0 for s in plan["steps"])
    rows = json.loads((out / "rows.json").read_text())
    methods = [(r["step"], r["method"]) for r in rows]
    assert ("frozen_closed_a0.1", "fedcgs") in methods and ("falcon_a0.1", "falcon") in methods
    assert all(r["scale"] == "dry-run" for r in rows)
    run_dir = out / "runs" / "frozen_closed_a0.1"
    records = json.loads((run_dir / "metrics.json").read_text())["records"]
    fedcgs = next(r for r in records if r["method"] == "fedcgs")
    row = next(r for r in rows if r["method"] == "fedcgs")
    assert row["per_seed"] == [100 * fedcgs["global_test_accuracy"]]
    # the frozen steps read the encoder the suite trained, the calibration its own
    encoder = out / "runs" / "pretrain_vits16" / "pretrained" / "cifar5_vits16_sup.safetensors"
    assert fedcgs["provenance"]["pretrained_sha256"] is not None and encoder.is_file()
    assert str(encoder) in row["command"]
    assert shlex.split(row["command"])[:3] == ["osfl", "run", "configs/falcon_label_gpu.yaml"]
    md = (out / "reproduction_gpu.md").read_text()
    assert "| frozen_closed_a0.1 | fedcgs |" in md and "## Not run\n\n- nothing" in md


@pytest.mark.slow
def test_the_dry_run_of_the_whole_catalogue(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "suite"
    assert main(["suite", "run", "--budget", "30", "--dry-run", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert all(s["status"] == "done" for s in plan["steps"]), plan


# The packages a lent GPU machine lacks and the suite does not carry (Flower and
# cryptography serve deployments only): the suite's commands must not import them.
_WITHOUT_FLOWER = """
import importlib.abc, runpy, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("flwr", "cryptography"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())
runpy.run_module("osfl", run_name="__main__")
"""


def test_the_suite_runs_where_flower_and_cryptography_are_absent(tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "suite"
    argv = ["suite", "run", "--budget", "10", "--dry-run", "--out", str(out),
            "--sections", "frozen", "--pack", str(tmp_path / "no_pack")]  # fmt: skip
    env = {k: v for k, v in __import__("os").environ.items() if k != "OSFL_CIFAR10"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-c", _WITHOUT_FLOWER, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads((out / "plan.json").read_text())
    assert {s["step"]["name"]: s["status"] for s in plan["steps"]} == {
        "pretrain_vits16": "done",
        "frozen_closed_a0.1": "done",
        "falcon_a0.1": "done",
    }
    certs = subprocess.run([sys.executable, "-c", _WITHOUT_FLOWER, "flower", "certs", "x"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert certs.returncode == 2 and "needs the cryptography package" in certs.stderr


def test_a_cost_measured_on_this_kind_of_gpu_replaces_the_calibration(tmp_path: Path) -> None:
    """On the GPU a step was measured on, its estimate is that measurement
    with the margin, and no calibration runs; elsewhere it is calibrated."""
    from osfl.suite.plan import MEASURED_MARGIN

    measured = Step(**{**_step("known", ratio=100).__dict__, "argv": ("suite", "mfu", "--out", "{out}"),
                       "measured_s": {"NVIDIA H200": 20.0}, "measured_note": "on an H200"})  # fmt: skip
    ran: list[str] = []

    def command(argv):
        out = Path(argv[argv.index("--out") + 1])
        ran.append(out.parent.name)  # "calibration" or "runs"
        out.mkdir(parents=True)
        (out / "mfu.json").write_text(json.dumps({"model": "m", "dtype": "bf16", "batch": 1,
                                                  "mfu": 0.3, "achieved_tflops": 1.0, "provenance": {}}))  # fmt: skip
        return 0

    for machine, calibrated in (("NVIDIA H200", False), ("NVIDIA H100 80GB HBM3", True)):
        ran.clear()
        req = SuiteRequest(out=tmp_path / machine, budget_min=4.0, steps=[measured], machine=machine)
        p = run_suite(req, command, clock=lambda: 0.0, log=lambda s: None).planned[0]
        assert p.status == "done"
        assert ran == (["calibration", "runs"] if calibrated else ["runs"])
        if not calibrated:
            assert p.estimate_s == MEASURED_MARGIN * 20.0 and "on an H200" in p.estimate_from
            doc = json.loads((tmp_path / machine / "plan.json").read_text())
            assert doc["steps"][0]["estimate_from"] == p.estimate_from
        else:
            assert p.estimate_from == "calibration"


def test_the_measured_h200_costs_plan_the_encoder_and_its_rows_in_one_call() -> None:
    """The costs measured on the first lent H200 (2026-11-25): a 9-minute call
    there plans the encoder, the closed-form frozen step and the MFU benchmark."""
    steps = select_steps(["pretrain", "frozen", "mfu"])
    planned = [Planned(s, estimate_s=s.measured("NVIDIA H200")) for s in steps]
    status = {p.step.name: p.status for p in make_plan(planned, 9 * 60)}
    assert status["pretrain_vits16"] == "planned" and status["frozen_closed_a0.1"] == "planned"
    assert status["mfu_vitb16_bf16"] == "planned" and status["falcon_a0.1"] == "skipped"


def test_measured_steps_keep_their_time_and_their_dependents_wait_a_call(tmp_path: Path) -> None:
    """A measured encoder leaves no calibration output, so the step that reads
    it is calibrated in the next call, on the finished encoder's output; a
    calibration that would eat into the measured steps' time is not run."""
    now = [0.0]
    argvs: list[list[str]] = []

    def mfu_step(name, **kw):
        base = _step(name, ratio=10).__dict__
        return Step(**{**base, "argv": ("suite", "mfu", "--out", "{out}", "--in", "{encoder}"), **kw})

    enc = Step(**{**mfu_step("pretrain_vits16").__dict__, "measured_s": {"G": 100.0}, "measured_note": "m"})
    reader = mfu_step("reader", needs=("pretrain_vits16",))
    late = mfu_step("late")

    def command(argv):
        argvs.append(list(argv))
        out = Path(argv[argv.index("--out") + 1])
        now[0] += 5.0 if "calibration" in str(out) else 20.0
        out.mkdir(parents=True)
        (out / "mfu.json").write_text(json.dumps({"model": "m", "dtype": "bf16", "batch": 1,
                                                  "mfu": 0.3, "achieved_tflops": 1.0, "provenance": {}}))  # fmt: skip
        return 0

    def call(budget_min):
        req = SuiteRequest(out=tmp_path, budget_min=budget_min, steps=[enc, reader, late], machine="G")
        start = now[0]
        res = run_suite(req, command, clock=lambda: now[0] - start, log=lambda s: None)
        return {p.step.name: p for p in res.planned}

    first = call(4.0)  # 240 s: 115 reserved for the encoder, 125 left: "late" calibrates
    assert first["pretrain_vits16"].status == "done" and first["late"].status == "done"
    assert first["reader"].status == "skipped" and "a call after it has run" in first["reader"].reason
    argvs.clear()
    second = call(4.0)  # the encoder is done: the reader calibrates on its output
    assert second["reader"].status == "done"
    cal = next(a for a in argvs if "calibration" in a[a.index("--out") + 1])
    assert cal[cal.index("--in") + 1].startswith(str(tmp_path / "runs" / "pretrain_vits16"))
    tight = call(1.0)  # nothing pending but the done steps: nothing to calibrate
    assert all(p.status == "done" for p in tight.values())

    crowded = SuiteRequest(out=tmp_path / "c", budget_min=2.5, steps=[enc, late], machine="G")
    by = {p.step.name: p for p in run_suite(crowded, command, clock=lambda: 0.0, log=lambda s: None).planned}
    # 150 s - 115 reserved = 35 s < CALIBRATION_MIN_S: "late" is not calibrated
    assert by["late"].status == "skipped" and "no time to calibrate" in by["late"].reason
    assert by["pretrain_vits16"].status == "done"


def test_rows_print_seeds_as_reproduction_does() -> None:
    from osfl.report import mean_std_text

    assert mean_std_text([67.2]) == "67.20"  # one seed: no std
    assert mean_std_text([67.2, 67.08, 67.68]) == "67.32 ± 0.32"  # sample std (n - 1)
