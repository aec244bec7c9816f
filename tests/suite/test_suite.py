"""``osfl suite`` (issues #32, #40): the pack a lent GPU machine carries,
the plan of the runs that fit a budget at measured rates, the catalogue,
and the dry run of the whole path on a CPU.

The dry run here runs the catalogue's own tiny commands (8-px digits, a
one-block ViT) through ``osfl.cli.main``, as ``osfl suite run --dry-run``
does: rates, plan, runs, rows, bundle. Its sections are the encoder, the
frozen-encoder steps and the MFU benchmark; the other steps' tiny commands
run in the slow test of the whole catalogue. The bundle, the import and the
suite's sturdiness: tests/suite/test_bundle.py; the job script:
tests/suite/test_job.py.
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
from osfl.suite.catalogue import STEPS
from osfl.suite.encoder import read_encoder_card
from osfl.suite.execute import SuiteRequest, run_suite, with_overrides
from osfl.suite.pack import pack, read_manifest, sha256_file, unpack_imagefolder
from osfl.suite.plan import select_steps
from osfl.suite.steps import MARGIN, Step, Work
from support.paths import ROOT


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
    assert argv[-len(LENT_MACHINE_LACKS) :] == [
        f"{n}=={importlib.metadata.version(n)}" for n in LENT_MACHINE_LACKS
    ]


# --------------------------------------------------------------------------- runs
def _step(name: str, *, needs: tuple[str, ...] = (), seconds: float = 10.0) -> Step:
    """A benchmark step whose work takes ``seconds`` at rate 1 (no margin
    matters: the tests give their rates and compare estimates)."""
    return Step(name=name, section="s", kind="mfu", argv=("suite", "mfu", "--out", "{out}"),
                tiny=("suite", "mfu", "--out", "{out}"), needs=needs,
                work=Work({"decode": seconds / MARGIN}))  # fmt: skip


def test_overrides_go_where_argparse_reads_them() -> None:
    run = _step("r")
    run = Step(**{**run.__dict__, "kind": "run"})
    assert with_overrides(run, ["run", "c.yaml", "a=1", "--out", "x"], ["b=2"]) == [
        "run", "c.yaml", "a=1", "b=2", "--out", "x"
    ]  # fmt: skip
    bench = _step("m")
    assert with_overrides(bench, ["suite", "mfu", "--steps", "30"], ["--steps", "3"])[-1] == "3"


def _mfu_command(now: list[float], seconds: dict[str, float], seen: list[str]):
    """A stand-in for ``osfl.cli.main``: a benchmark that writes its record
    and advances the fake clock by its step's seconds."""

    def command(argv):
        out = Path(argv[argv.index("--out") + 1])
        seen.append(out.name)
        if out.name == "bad":
            raise RuntimeError("CUDA out of memory")
        now[0] += seconds.get(out.name, 1.0)
        out.mkdir(parents=True)
        mfu_json = {"model": out.name, "dtype": "bfloat16", "batch": 1, "mfu": 0.5,
                    "achieved_tflops": 1.0, "provenance": {"gpu": "NVIDIA H100", "device": "cuda"}}  # fmt: skip
        (out / "mfu.json").write_text(json.dumps(mfu_json))
        return 0

    return command


def test_the_budget_holds_and_a_second_call_goes_on(tmp_path: Path) -> None:
    """Given rates (no measuring), a fake clock: the budget (4 min, of which
    the plan fills 90 %: 216 s) holds the first two steps (100 + 100 s) but
    not the third; a failed step is
    recorded and its dependant skipped; rows are on disk after every step.
    A second call runs only what is left, a dry run into it is refused."""
    now = [0.0]
    seen: list[str] = []
    steps = [_step("one", seconds=100), _step("two", seconds=100), _step("three", seconds=100),
             _step("bad", seconds=1), _step("after_bad", seconds=1, needs=("bad",))]  # fmt: skip
    command = _mfu_command(now, {"one": 100, "two": 100, "three": 100}, seen)
    rates = {"decode": 1.0, "startup_s": 0.0, "resnet18_32": 1.0, "vits16_224": 1.0,
             "resize_224": 1.0}  # fmt: skip
    req = SuiteRequest(out=tmp_path, budget_min=4.0, steps=steps, rates=rates, preflight="none")
    result = run_suite(req, command, clock=lambda: now[0], log=lambda s: None)
    by = {p.step.name: p for p in result.planned}
    assert by["one"].estimate_s == pytest.approx(100.0)
    assert [by[n].status for n in ("one", "two", "three")] == ["done", "done", "skipped"]
    assert by["bad"].status == "failed" and "out of memory" in by["bad"].reason
    assert by["after_bad"].status == "skipped" and "did not finish" in by["after_bad"].reason
    assert [r["step"] for r in result.rows] == ["one", "two"]
    assert all(r["scale"] == "gpu" and r["ours"] == 50.0 for r in result.rows)
    md = (tmp_path / "reproduction_gpu.md").read_text()
    assert "Machine: NVIDIA H100" in md and "three: skipped" in md
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert [s["status"] for s in plan["steps"]][:3] == ["done", "done", "skipped"]
    assert set(plan["steps"][0]["outputs"]) == {"mfu.json"}

    seen.clear()
    again = run_suite(req, command, clock=lambda: now[0], log=lambda s: None)
    assert seen == ["three", "bad"]
    assert [p.status for p in again.planned][:3] == ["done", "done", "done"]
    assert [r["step"] for r in again.rows] == ["one", "two", "three"]
    dry = SuiteRequest(out=tmp_path, budget_min=4.0, steps=steps, dry_run=True, rates=rates,
                       preflight="none")  # fmt: skip
    with pytest.raises(ConfigError, match="another --out"):
        run_suite(dry, command, clock=lambda: now[0], log=lambda s: None)


def test_sections_and_step_names_bring_the_steps_they_need() -> None:
    with pytest.raises(ConfigError, match="valid: fafi"):
        select_steps(["nope"])
    eftvit = [s.name for s in select_steps(["eftvit"])]
    assert eftvit == ["pretrain_vitti16", "eftvit_t1_b0.1_fedhead", "eftvit_t1_b0.1_fedlora",
                      "eftvit_t1_b0.1_eftvit"]  # fmt: skip
    assert [s.section for s in select_steps([])] == [s.section for s in STEPS]
    assert [s.name for s in select_steps([], names=["falcon_a0.1"])] == [
        "pretrain_vitti16",
        "falcon_a0.1",
    ]
    with pytest.raises(ConfigError, match="unknown suite step"):
        select_steps([], names=["nope"])


# --------------------------------------------------------------------------- catalogue
def test_the_catalogue_is_in_the_issues_order_with_one_headline_row_per_seed() -> None:
    """FAFI Table 1 at α 0.1 first (the paper's 50- and 100-epoch FAFI rows
    before the 200-epoch CE and SALT steps), then RLU Table 2 and Fig. 1,
    FedMITR Table I, FALCON Table 2, EFTViT Table 1; FAFI's CE and SALT
    clients are separate steps of one headline row."""
    names = [s.name for s in STEPS]
    assert names[:5] == ["fafi_salt_e50_a0.1_seed0", "fafi_salt_e100_a0.1_seed0",
                         "fafi_ce_a0.1_seed0", "fafi_salt_part1_a0.1_seed0",
                         "fafi_salt_a0.1_seed0"]  # fmt: skip
    first = {sec: min(i for i, s in enumerate(STEPS) if s.section == sec)
             for sec in ("fafi", "rlu", "fedmitr", "frozen", "eftvit")}  # fmt: skip
    assert list(first) == sorted(first, key=first.get)
    heads = {s.headline for s in STEPS if s.section != "pretrain" and s.section != "mfu"}
    assert {"fafi_t1_a0.1", "rlu_t2", "rlu_fig1", "fedmitr_t1_a0.1", "falcon_t2_a0.1",
            "eftvit_t1_b0.1"} <= heads  # fmt: skip
    by = {s.name: s for s in STEPS}
    assert by["fafi_ce_a0.1_seed0"].headline == by["fafi_salt_a0.1_seed0"].headline
    assert by["fafi_salt_e50_a0.1_seed0"].paper == {"fafi": 63.55}
    # both FAFI halves fill and read the same client cache
    for name in ("fafi_ce_a0.1_seed0", "fafi_salt_part1_a0.1_seed0", "fafi_salt_a0.1_seed0"):
        assert "cache_dir=null" not in by[name].argv
    for s in STEPS:  # a substitute is stated in its row, and the self-pretrained backbone
        if "{encoder}" in " ".join(s.argv):
            assert "substitute" in s.scale_note, s.name
            assert s.needs == ("pretrain_vitti16",) and "self-pretrained" in s.backbone, s.name
            assert "model.name=vit_tiny_patch16_224" in s.argv, s.name
        else:
            assert not s.backbone, s.name


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_every_catalogue_command_loads(step: Step, monkeypatch) -> None:
    """Each paper-scale command parses into a valid config (the configs it
    names exist and are not stale), without running."""
    monkeypatch.chdir(ROOT)
    argv = [a.replace("{out}", "/tmp/x").replace("{encoder}", "enc.safetensors") for a in step.argv]
    if step.kind == "mfu":
        assert argv[:2] == ["suite", "mfu"]
        mfu._parser().parse_args(argv[2:])
        return
    if step.kind == "script":
        from omegaconf import OmegaConf

        script, _which, config, *overrides = argv[1:]
        assert (ROOT / script).is_file()
        cfg = OmegaConf.merge(OmegaConf.load(config), OmegaConf.from_dotlist(overrides))
        assert cfg.scale == "gpu" and cfg.out_dir == "/tmp/x"
        return
    items = [a for a in argv[1:] if "=" in a or a.endswith(".yaml")]
    config, overrides = items[0], items[1:]
    if step.kind == "pretrain":
        cfg = load_pretrain_config(config, overrides)
        assert cfg.device == "cuda"
        # the pack decodes only the upstream classes (indices of CIFAR-10's ten)
        assert [int(c) for c in cfg.upstream.options["classes"]] == [
            int(c) for c in cfg.upstream.classes
        ]
        return
    cfg = load_config(config, overrides)
    assembly.check_names(cfg)
    assert cfg.device == "cuda" and cfg.scale == "gpu"
    # a step that selects classes decodes only those (the image folder's option)
    assert cfg.data.options.get("classes") == cfg.data.classes


# --------------------------------------------------------------------------- rates
def test_the_rates_are_measured_on_a_cpu_in_the_dry_run() -> None:
    """The measurement phase's own code, at its tiny shapes (the dry run's)."""
    from osfl.suite.rates import RATE_KEYS, check_rates, measure_rates

    torch.set_num_threads(1)
    r = measure_rates(tiny=True, device="cpu")
    check_rates(r)
    assert set(RATE_KEYS) <= set(r) and r["machine"] == "cpu" and r["tiny"] is True
    with pytest.raises(DataError, match="decode must be a positive number"):
        check_rates({**r, "decode": float("nan")})
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        measure_rates(tiny=False, device="cpu")


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
            "--sections", "pretrain,frozen,mfu", "--pack", str(tmp_path / "gpu_pack")]  # fmt: skip
    assert main(argv) == 0
    import os

    assert os.environ["OSFL_CIFAR10"] == str(tmp_path / "gpu_pack" / "cifar10.npz")
    plan = json.loads((out / "plan.json").read_text())
    assert {s["step"]["name"]: s["status"] for s in plan["steps"]} == {
        "pretrain_vitti16": "done",
        "frozen_closed_a0.1": "done",
        "falcon_a0.1": "done",
        "mfu_vitb16_bf16": "done",
    }
    assert all(s["estimate_s"] > 0 and s["outputs"] for s in plan["steps"])
    assert json.loads((out / "rates.json").read_text())["tiny"] is True
    rows = json.loads((out / "rows.json").read_text())
    methods = [(r["step"], r["method"]) for r in rows]
    assert ("frozen_closed_a0.1", "fedcgs") in methods and ("falcon_a0.1", "falcon") in methods
    assert all(r["scale"] == "dry-run" for r in rows)
    run_dir = out / "runs" / "frozen_closed_a0.1"
    records = json.loads((run_dir / "metrics.json").read_text())["records"]
    fedcgs = next(r for r in records if r["method"] == "fedcgs")
    row = next(r for r in rows if r["method"] == "fedcgs")
    assert row["per_seed"] == [100 * fedcgs["global_test_accuracy"]]
    assert row["row"] == "falcon_t2_a0.1"
    # the frozen steps read the encoder the suite trained, stored in bf16 beside its card
    encoder = out / "runs" / "pretrain_vitti16" / "pretrained" / "cifar5_vitti16_sup.safetensors"
    assert fedcgs["provenance"]["pretrained_sha256"] == sha256_file(encoder)
    assert str(encoder) in row["command"]
    assert shlex.split(row["command"])[:3] == ["osfl", "run", "configs/falcon_label_gpu.yaml"]
    assert "self-pretrained ViT-Ti/16" in row["backbone"]
    md = (out / "reproduction_gpu.md").read_text()
    assert "| frozen_closed_a0.1 | fedcgs |" in md and "## Not run\n\n- nothing" in md
    assert "| self-pretrained ViT-Ti/16" in md
    # the preflight (imports only, in a dry run) ran first and is in the plan
    assert plan["preflight"]["ok"] is True and "flwr_datasets" in plan["preflight"]["imports"]
    # the bundle returns the encoder and its card as they are
    bundle = sorted(p.name for p in (out / "bundle").iterdir())
    assert bundle == ["cifar5_vitti16_sup.card.json", "cifar5_vitti16_sup.safetensors",
                      "plan.json", "rates.json", "records.tar.gz", "reproduction_gpu.md",
                      "rows.json"]  # fmt: skip
    returned = out / "bundle" / "cifar5_vitti16_sup.safetensors"
    assert returned.read_bytes() == encoder.read_bytes()
    card = read_encoder_card(out / "bundle" / "cifar5_vitti16_sup.card.json", returned)
    assert card["weights"]["dtype"] == "bfloat16" and card["weights"]["converted_from"]["sha256"]


def test_the_fafi_salt_row_is_made_from_its_client_part(tmp_path: Path, monkeypatch) -> None:
    """``--steps fafi_salt_a0.1_seed0`` brings the ``train_clients`` part it
    needs: the part trains its client into the shared cache and has no row;
    the row's step then trains the other client, finds the part's in the
    cache, and makes the row."""
    monkeypatch.chdir(ROOT)
    torch.set_num_threads(1)
    out = tmp_path / "suite"
    argv = ["suite", "run", "--budget", "10", "--dry-run", "--out", str(out),
            "--steps", "fafi_salt_a0.1_seed0"]  # fmt: skip
    assert main(argv) == 0
    plan = json.loads((out / "plan.json").read_text())
    names = ["fafi_salt_part1_a0.1_seed0", "fafi_salt_a0.1_seed0"]
    assert [(s["step"]["name"], s["status"]) for s in plan["steps"]] == [(n, "done") for n in names]
    records = {n: json.loads((out / "runs" / n / "metrics.json").read_text())["records"][0]
               for n in names}  # fmt: skip
    part, row = records[names[0]], records[names[1]]
    assert part["global_test_accuracy"] is None and part["trained_clients"] == [0]
    assert row["cache"] == {"hits": 1, "misses": 1}
    rows = json.loads((out / "rows.json").read_text())
    assert [(r["step"], r["method"]) for r in rows] == [("fafi_salt_a0.1_seed0", "fafi")]
    assert rows[0]["per_seed"] == [100 * row["global_test_accuracy"]]


@pytest.mark.slow
def test_the_dry_run_of_the_whole_catalogue(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    out = tmp_path / "suite"
    assert main(["suite", "run", "--budget", "30", "--dry-run", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    status = {s["step"]["name"]: (s["status"], s["reason"]) for s in plan["steps"]}
    assert all(s == "done" for s, _ in status.values()), status
    rows = json.loads((out / "rows.json").read_text())
    assert {r["step"] for r in rows} >= {"rlu_t2", "rlu_fig1"}  # on 1-channel digits


# --------------------------------------------------------------------------- RLU scripts
def test_the_rlu_scripts_read_one_channel_digits_and_each_schemes_history() -> None:
    """The RLU steps' scripts (benchmarks/rlu_common.py, scheme_driver.py): the
    data's ``channels`` reach the loader and the models (the dry run's digits);
    a scheme's history comes from its AuditHistory capability (FedAvg has none)."""
    from omegaconf import OmegaConf

    from osfl.fl.train_config import TrainConfig
    from support.scripts import load_script

    rlu = load_script("benchmarks/rlu_common.py")
    driver = load_script("benchmarks/scheme_driver.py")
    torch.set_num_threads(1)
    cfg = OmegaConf.create({
        "seed": 0, "aux_per_class": 2, "train_eval_size": 10, "device": "cpu",
        "data": {"spec": "digits", "image_size": 16, "channels": 1, "max_per_class": 6,
                 "test_max_per_class": 3, "cache_dir": None},
    })  # fmt: skip
    setup = rlu.Setup.from_config(cfg)
    assert setup.channels == 1 and tuple(setup.data.train.image_shape) == (1, 16, 16)
    assert setup.model_kwargs("lenet5", "relu") == {"act": "relu", "img_size": 16, "in_chans": 1}
    model = rlu.build_model(setup, "lenet5", "relu", 0)
    clients = rlu.make_clients(setup.data.train, 2, 0.5, 0)
    train = TrainConfig(steps=1, batch_size=4, lr=0.05, optimizer="sgd", drop_last=False, amp=False)
    run = driver.make_run(setup, "lenet5", "relu", train, len(clients), 0)
    history = {}
    for scheme in ("fedavg", "scaffold"):
        seen: list = []
        driver.drive(scheme, {}, run, clients, 2,
                     init_state={k: v.detach().clone() for k, v in model.state_dict().items()},
                     watch=lambda r, c, obs, seen=seen: seen.append(obs), watch_rounds={1})  # fmt: skip
        assert len(seen) == len(clients)
        history[scheme] = seen[0].history
    assert history["fedavg"] == {} and history["scaffold"]


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
        "pretrain_vitti16": "done",
        "frozen_closed_a0.1": "done",
        "falcon_a0.1": "done",
    }
    certs = subprocess.run([sys.executable, "-c", _WITHOUT_FLOWER, "flower", "certs", "x"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert certs.returncode == 2 and "needs the cryptography package" in certs.stderr


def test_rows_print_seeds_as_reproduction_does() -> None:
    from osfl.report import mean_std_text

    assert mean_std_text([67.2]) == "67.20"  # one seed: no std
    assert mean_std_text([67.2, 67.08, 67.68]) == "67.32 ± 0.32"  # sample std (n - 1)
