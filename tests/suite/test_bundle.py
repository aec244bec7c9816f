"""``osfl suite`` survives the job (issue #40): the bundle a lent machine
hands back after every finished step, ``osfl suite import`` into
``reproduction/`` and REPRODUCTION.md, the skipping of rows already in the
repository, ``resume``'s hash check, and the suite's sturdiness (Ctrl-C,
damaged ``plan.json`` / ``rows.json``, a missing ``rows.json``, a budget of
nan or inf). Fake commands and given rates keep every test here fast: the
real commands' dry run is tests/suite/test_suite.py's.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.errors import DataError
from osfl.suite.bundle import BUNDLE_FILES, FILE_LIMIT, make_archive, read_bundle, write_bundle
from osfl.suite.execute import SuiteRequest, rows_in_repo, run_suite
from osfl.suite.importer import import_bundle
from osfl.suite.steps import Step, Work
from support.paths import ROOT

RATES = {"decode": 1.0, "startup_s": 0.0, "resnet18_32": 1.0, "vits16_224": 1.0, "resize_224": 1.0}
PROVENANCE = {"gpu": "NVIDIA H100 80GB HBM3", "cuda_driver": "580.1", "cuda": "13.0",
              "torch": "2.11.0", "dtype": "bfloat16", "device": "cuda"}  # fmt: skip


def _step(name: str, section: str = "fafi", row: str = "") -> Step:
    return Step(name=name, section=section, kind="mfu", argv=("suite", "mfu", "--out", "{out}"),
                tiny=("suite", "mfu", "--out", "{out}"), work=Work({"decode": 10.0}), row=row,
                paper={"mfu": 40.0})  # fmt: skip


STEPS = [_step("one"), _step("two"), _step("three")]


def _command(seen: list[str], interrupt_at: str | None = None, value: float = 0.5):
    """A stand-in for ``osfl.cli.main`` that writes a benchmark record; at
    ``interrupt_at`` it answers as osfl does to Ctrl-C (exit status 130)."""

    def command(argv):
        out = Path(argv[argv.index("--out") + 1])
        seen.append(out.name)
        out.mkdir(parents=True)
        if out.name == interrupt_at:
            (out / "partial.json").write_text("{}")
            raise SystemExit(130)
        record = {"model": out.name, "dtype": "bfloat16", "batch": 1, "mfu": value,
                  "achieved_tflops": 1.0, "provenance": PROVENANCE}  # fmt: skip
        (out / "mfu.json").write_text(json.dumps(record))
        return 0

    return command


def _run(out: Path, command, **kw) -> list:
    req = SuiteRequest(out=out, budget_min=10.0, steps=STEPS, rates=RATES, preflight="none", **kw)
    return run_suite(req, command, log=lambda s: None).planned


# --------------------------------------------------------------------------- bundle
def test_the_bundle_fits_the_return_limits_and_keeps_records(tmp_path: Path) -> None:
    _run(tmp_path / "suite", _command([]), bundle=tmp_path / "OUT")
    files = sorted((tmp_path / "OUT").iterdir())
    assert [f.name for f in files] == sorted(BUNDLE_FILES)
    assert len(files) <= 8 and all(f.is_file() and f.stat().st_size <= FILE_LIMIT for f in files)
    import tarfile

    with tarfile.open(tmp_path / "OUT" / "records.tar.gz") as tar:
        names = tar.getnames()
    assert {"one/mfu.json", "two/mfu.json", "three/mfu.json", "suite.log"} <= set(names)
    assert max(n.count("/") for n in names) <= 1  # step folder / file: nothing deeper
    plan, rows = read_bundle(tmp_path / "OUT")
    assert [r["step"] for r in rows] == ["one", "two", "three"] and plan["bundle_left_out"] == []


def test_an_archive_over_the_limit_leaves_out_its_largest_members(tmp_path: Path) -> None:
    import os

    big, small = tmp_path / "big.log", tmp_path / "small.json"
    big.write_bytes(os.urandom(50_000))  # does not compress
    small.write_text("{}")
    data, dropped = make_archive([("a/big.log", big), ("a/small.json", small)], limit=20_000)
    assert dropped == ["a/big.log"] and len(data) <= 20_000


def test_a_kill_mid_step_returns_the_finished_steps(tmp_path: Path) -> None:
    """Ctrl-C (or the job's inner timeout, SIGINT) in step two: the suite
    stops (no step three), marks two interrupted, and the bundle holds one."""
    seen: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "suite", _command(seen, interrupt_at="two"), bundle=tmp_path / "OUT")
    assert seen == ["one", "two"]
    plan, rows = read_bundle(tmp_path / "OUT")
    status = {s["step"]["name"]: (s["status"], s["reason"]) for s in plan["steps"]}
    assert status["one"][0] == "done"
    assert status["two"][0] == "failed" and "interrupted" in status["two"][1]
    assert status["three"] == ("skipped", "the suite was interrupted")
    assert [r["step"] for r in rows] == ["one"]
    # the next call runs what the killed one left, afresh
    seen.clear()
    _run(tmp_path / "suite", _command(seen), bundle=tmp_path / "OUT")
    assert seen == ["two", "three"]
    assert not (tmp_path / "suite" / "runs" / "two" / "partial.json").exists()


def test_ctrl_c_in_a_real_command_exits_130_and_runs_nothing_more(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Through ``osfl suite run``: Ctrl-C inside the encoder step's ``osfl
    pretrain`` stops the suite with exit status 130; no frozen step runs."""
    import osfl.commands.pretrain

    monkeypatch.chdir(ROOT)

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(osfl.commands.pretrain, "cmd_pretrain", interrupted)
    rates = tmp_path / "rates.json"
    fast = {k: 1e9 for k in RATES}  # every tiny step fits
    rates.write_text(json.dumps({**fast, "startup_s": 0.0, "tiny": True}))
    out = tmp_path / "suite"
    argv = ["suite", "run", "--budget", "5", "--dry-run", "--sections", "frozen",
            "--out", str(out), "--rates", str(rates)]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 130
    plan = json.loads((out / "plan.json").read_text())
    status = {s["step"]["name"]: s["status"] for s in plan["steps"]}
    assert status == {"pretrain_vitti16": "failed", "frozen_closed_a0.1": "skipped",
                      "falcon_a0.1": "skipped"}  # fmt: skip
    assert not (out / "runs" / "frozen_closed_a0.1").exists()


# --------------------------------------------------------------------------- resume
def test_resume_trusts_done_only_while_the_outputs_hash_the_same(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    _run(out, _command([]))
    (out / "runs" / "one" / "mfu.json").write_text('{"changed": true}')
    (out / "runs" / "two" / "mfu.json").unlink()
    seen: list[str] = []
    planned = _run(out, _command(seen))
    assert seen == ["one", "two"] and all(p.status == "done" for p in planned)


def test_a_call_with_other_steps_keeps_what_earlier_calls_finished(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    req = SuiteRequest(
        out=out, budget_min=10.0, steps=STEPS, rates=RATES, step_names=["two"], preflight="none"
    )
    run_suite(req, _command([]), log=lambda s: None)
    seen: list[str] = []
    req = SuiteRequest(
        out=out, budget_min=10.0, steps=STEPS, rates=RATES, step_names=["three"], preflight="none"
    )
    planned = run_suite(req, _command(seen), log=lambda s: None).planned
    assert seen == ["three"]
    assert [(p.step.name, p.status) for p in planned] == [("two", "done"), ("three", "done")]
    assert [r["step"] for r in json.loads((out / "bundle" / "rows.json").read_text())] == [
        "two",
        "three",
    ]


def test_forced_steps_and_what_they_need_run_whatever_their_estimates(tmp_path: Path) -> None:
    slow = {**RATES, "decode": 1e-3}  # every step: 10,000 s, over any budget and the cap
    reader = Step(**{**_step("reader").__dict__, "needs": ("one",)})
    seen: list[str] = []
    req = SuiteRequest(out=tmp_path, budget_min=1.0, steps=[*STEPS, reader], rates=slow,
                       step_names=["reader"], preflight="none")  # fmt: skip
    planned = run_suite(req, _command(seen), log=lambda s: None).planned
    assert seen == ["one", "reader"]
    assert [(p.step.name, p.status, p.reason) for p in planned] == [
        ("one", "done", ""),
        ("reader", "done", ""),
    ]


def test_a_missing_rows_json_is_rebuilt_from_the_finished_steps(tmp_path: Path) -> None:
    out = tmp_path / "suite"
    _run(out, _command([]))
    before = json.loads((out / "rows.json").read_text())
    (out / "rows.json").unlink()
    seen: list[str] = []
    _run(out, _command(seen))
    assert seen == []  # nothing re-run
    assert json.loads((out / "rows.json").read_text()) == before


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("plan.json", "{not json"),
        ("plan.json", "[1, 2]"),
        ("plan.json", '{"dry_run": false}'),
        ("plan.json", '{"dry_run": false, "steps": [{"step": 3, "status": "done"}]}'),
        (
            "plan.json",
            '{"dry_run": false, "steps": [{"step": {"name": "mfu_vitb16_bf16"}, "status": "done"}]}',
        ),
        ("plan.json", "\xff\xfe"),
        (
            "plan.json",
            '{"dry_run": false, "steps": [{"step": {"name": "mfu_vitb16_bf16"}, '
            '"status": "done", "out": "x", "outputs": [1, 2], "seconds": 1}]}',
        ),
        ("rows.json", "{not json"),
        ("rows.json", '{"a": 1}'),
        ("rates.json", '{"decode": "fast"}'),
    ],
)
def test_a_damaged_suite_file_is_one_line(tmp_path: Path, capsys, name: str, text: str) -> None:
    out = tmp_path / "suite"
    _run(out, _command([]))
    (out / name).write_text(text)
    argv = ["suite", "run", "--budget", "5", "--out", str(out), "--sections", "mfu",
            "--preflight", "none"]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("osfl: error:") and name in err
    assert "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("budget", ["nan", "inf", "-inf", "-1", "0"])
def test_a_budget_that_is_not_a_positive_finite_number_is_refused(
    tmp_path: Path, capsys, budget: str
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["suite", "run", f"--budget={budget}", "--dry-run", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "positive, finite number of minutes" in err and "\n" not in err
    assert not (tmp_path / "s").exists()
    if budget == "0":  # no later command: a valid --then
        return
    with pytest.raises(SystemExit) as e:
        main(["suite", "run", "--budget", "5", f"--then={budget}", "--dry-run",
              "--out", str(tmp_path / "t")])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "the later command must be a non-negative" in err
    assert not (tmp_path / "t").exists()


# --------------------------------------------------------------------------- import
PAGE = """# Reproductions

## FAFI

Some cpu rows.

## RLU

More rows.
"""


def _bundle(folder: Path, values: dict[int, float], step: str, scale: str = "gpu") -> Path:
    rows = [{"section": "fafi", "step": step, "row": "fafi_t1_a0.1", "method": "fafi",
             "setting": "", "paper": 77.83, "ours": statistics.mean(values.values()),
             "seeds": list(values), "per_seed": list(values.values()), "scale": scale,
             "command": f"osfl run configs/fafi_cifar10_gpu.yaml seeds=[{min(values)}]",
             "paper_note": "FAFI Table 1", "scale_note": "the paper's setting",
             "provenance": PROVENANCE}]  # fmt: skip
    write_bundle(folder, plan={"machine": "NVIDIA H100", "steps": []}, rows=rows,
                 markdown="", rates=RATES, members=[])  # fmt: skip
    return folder


def test_import_puts_rows_into_reproduction_and_merges_seeds(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    import_bundle(_bundle(tmp_path / "b0", {0: 70.0}, "fafi_salt_a0.1_seed0"), repo)
    import_bundle(_bundle(tmp_path / "b1", {1: 72.0}, "fafi_salt_a0.1_seed1"), repo)
    import_bundle(_bundle(tmp_path / "b1", {1: 72.0}, "fafi_salt_a0.1_seed1"), repo)  # again
    entries = json.loads((repo / "reproduction" / "gpu_suite_fafi.json").read_text())
    assert len(entries) == 1
    e = entries[0]
    assert e["accuracy"] == {"0": 70.0, "1": 72.0} and e["mean"] == 71.0
    assert e["std"] == pytest.approx(statistics.stdev([70.0, 72.0]), abs=1e-4)
    assert e["steps"] == ["fafi_salt_a0.1_seed0", "fafi_salt_a0.1_seed1"]
    assert e["machine"].startswith("NVIDIA H100 80GB HBM3, driver 580.1, CUDA 13.0")
    page = (repo / "REPRODUCTION.md").read_text()
    assert page.count("<!-- osfl suite import: fafi -->") == 1
    fafi, rlu = page.index("## FAFI"), page.index("## RLU")
    assert fafi < page.index("<!-- osfl suite import: fafi -->") < rlu  # in its own chapter
    assert "| 71.00 ± 1.41 |" in page and "reproduction/gpu_suite_fafi.json" in page
    assert "\n## " not in page.split("<!-- osfl suite import: fafi -->")[1].split("<!-- end")[0]
    # the next job skips the steps whose rows are in the repository
    assert rows_in_repo(repo) == {
        "fafi_salt_a0.1_seed0": "reproduction/gpu_suite_fafi.json",
        "fafi_salt_a0.1_seed1": "reproduction/gpu_suite_fafi.json",
    }
    steps = [_step("fafi_salt_a0.1_seed0"), _step("fafi_salt_a0.1_seed2")]
    seen: list[str] = []
    req = SuiteRequest(out=tmp_path / "s", budget_min=10, steps=steps, rates=RATES, repo=repo,
                       preflight="none")  # fmt: skip
    planned = run_suite(req, _command(seen), log=lambda s: None).planned
    assert seen == ["fafi_salt_a0.1_seed2"]
    assert planned[0].status == "in_repo" and "gpu_suite_fafi.json" in planned[0].reason
    # but a step in the repository whose output a pending step reads runs again
    reader = Step(**{**_step("reader").__dict__, "needs": ("fafi_salt_a0.1_seed0",)})
    seen.clear()
    req = SuiteRequest(out=tmp_path / "s2", budget_min=10, steps=[steps[0], reader],
                       rates=RATES, repo=repo, preflight="none")  # fmt: skip
    planned = run_suite(req, _command(seen), log=lambda s: None).planned
    assert seen == ["fafi_salt_a0.1_seed0", "reader"]
    # a part of a row's clients (train_clients, ``feeds``) is done with its row
    part = Step(**{**_step("fafi_salt_part1_a0.1_seed0").__dict__, "feeds": steps[0].name})
    row = Step(**{**steps[0].__dict__, "needs": (part.name,)})
    seen.clear()
    req = SuiteRequest(out=tmp_path / "s3", budget_min=10, steps=[part, row], rates=RATES,
                       repo=repo, preflight="none")  # fmt: skip
    planned = run_suite(req, _command(seen), log=lambda s: None).planned
    assert seen == [] and [p.status for p in planned] == ["in_repo", "in_repo"]


def test_import_refuses_a_dry_run_and_a_damaged_bundle(tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    dry = _bundle(tmp_path / "dry", {0: 1.0}, "x", scale="dry-run")
    with pytest.raises(DataError, match="dry run"):
        import_bundle(dry, repo)
    (dry / "rows.json").write_text("[{}]")
    with pytest.raises(SystemExit) as e:
        main(["suite", "import", str(dry), "--repo", str(repo)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "row 0 lacks" in err and "\n" not in err
    assert (repo / "REPRODUCTION.md").read_text() == PAGE  # nothing written


def test_the_rlu_scripts_records_become_rows_with_the_papers_numbers(tmp_path: Path) -> None:
    """A ``script`` step's rows: one per attack and setting, iAcc as a
    fraction, the paper's number where the paper has that setting."""
    from osfl.suite.catalogue import STEPS as CATALOGUE
    from osfl.suite.rows import step_rows

    t2 = next(s for s in CATALOGUE if s.name == "rlu_t2")
    out = tmp_path / "t2"
    out.mkdir()
    row = {"model": "vgg16", "act": "relu", "batch_size": 64, "steps": 10, "seconds": 1.0,
           "rlu": {"cAcc": 1.0, "iAcc": 0.982, "n": 10}, "llg+": {"cAcc": 0.9, "iAcc": 0.95, "n": 10}}  # fmt: skip
    (out / "table2.json").write_text(json.dumps({"config": {}, "rows": [row]}))
    argv = ["script", "benchmarks/repro_rlu.py", "table2", "c.yaml", "out_dir=x"]
    rows = {r["method"]: r for r in step_rows(t2, out, argv, dry_run=False)}
    assert set(rows) == {"rlu", "llg+"}
    assert rows["rlu"]["setting"] == "vgg16 relu B64 m10" and rows["rlu"]["ours"] == 0.982
    assert rows["rlu"]["paper"] == 0.946 and rows["llg+"]["paper"] is None
    assert rows["rlu"]["unit"] == "fraction" and rows["rlu"]["command"].startswith("python bench")
    fig1 = next(s for s in CATALOGUE if s.name == "rlu_fig1")
    out = tmp_path / "fig1"
    out.mkdir()
    (out / "fig1.json").write_text(
        json.dumps({"rows": [{"round": 5, "train_acc": 0.5, "rlu": 0.8}]})
    )
    (r,) = step_rows(fig1, out, argv, dry_run=False)
    assert (r["method"], r["setting"], r["ours"]) == ("rlu", "round 5 (train acc 0.500)", 0.8)


# --------------------------------------------------------------------------- issue #50
def test_an_unknown_section_or_step_leaves_no_out(tmp_path: Path, capsys) -> None:
    for bad in (["--sections", "nosuch"], ["--steps", "nosuch"]):
        out = tmp_path / "never"
        with pytest.raises(SystemExit) as e:
            main(["suite", "run", "--budget", "5", "--dry-run", "--out", str(out), *bad])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and "unknown suite" in err and "\n" not in err
        assert not out.exists()


@pytest.mark.parametrize("name", ["plan.json", "rows.json", "rates.json"])
def test_a_deeply_nested_suite_file_is_one_line(tmp_path: Path, capsys, name: str) -> None:
    """``json.loads`` recurses per level: 100,000 brackets would be a
    RecursionError; the suite's reader bounds the depth first (osfl.jsonio)."""
    out = tmp_path / "suite"
    _run(out, _command([]))
    (out / name).write_text("[" * 100_000 + "]" * 100_000)
    argv = ["suite", "run", "--budget", "5", "--out", str(out), "--sections", "mfu",
            "--preflight", "none"]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and name in err and "nested" in err and "\n" not in err


def test_a_deeply_nested_or_special_pack_manifest_is_one_line(tmp_path: Path, capsys) -> None:
    import os

    pack_dir = tmp_path / "gpu_pack"
    pack_dir.mkdir()
    (pack_dir / "MANIFEST.json").write_text("{" * 50_000 + "}" * 50_000)
    argv = ["suite", "run", "--budget", "5", "--dry-run", "--out", str(tmp_path / "s"),
            "--pack", str(pack_dir), "--sections", "mfu"]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "MANIFEST.json is unreadable" in err and "\n" not in err
    (pack_dir / "MANIFEST.json").unlink()
    os.mkfifo(pack_dir / "MANIFEST.json")  # a reader must not hang on it
    from osfl.suite.pack import read_manifest

    assert read_manifest(pack_dir) is None


def test_a_bundle_holds_at_most_eight_files_with_the_job_log(tmp_path: Path) -> None:
    from osfl.suite.bundle import MAX_FILES, returned_files

    files = []
    for i in range(4):
        f = tmp_path / f"w{i}.safetensors"
        f.write_bytes(b"x")
        files.append(f)
    big = tmp_path / "big.safetensors"
    with big.open("wb") as fh:
        fh.truncate(FILE_LIMIT + 1)
    kept, left = returned_files([big, *files])
    assert kept == files[:2] and len(BUNDLE_FILES) + len(kept) + 1 == MAX_FILES
    assert left[0].startswith("big.safetensors (16.0 MiB, over 16)")
    assert left[1:] == ["w2.safetensors (no room in the bundle)",
                        "w3.safetensors (no room in the bundle)"]  # fmt: skip


def _encoder_bundle(folder: Path, *, tamper: bool = False) -> Path:
    """A bundle returning a (toy) bf16 encoder and its card, as the
    encoder step's ``post`` leaves them."""
    import hashlib

    import torch
    from safetensors.torch import save_file

    from osfl.suite.steps import ENCODER

    write_bundle(folder, plan={"machine": "NVIDIA H100", "steps": [], "started": "t0"},
                 rows=[], markdown="", rates=RATES, members=[])  # fmt: skip
    name = Path(ENCODER).name
    weights = folder / name
    save_file({"head.weight": torch.ones(2, 3, dtype=torch.bfloat16)}, str(weights))
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    card = {"schema": "osfl.pretrain.card/1", "weights": {"file": name, "dtype": "bfloat16",
            "sha256": "0" * 64 if tamper else sha}}  # fmt: skip
    (folder / name.replace(".safetensors", ".card.json")).write_text(json.dumps(card))
    return folder


def test_import_commits_the_returned_encoder_and_later_jobs_read_it(tmp_path: Path) -> None:
    """The encoder a bundle returns (bf16, its card's sha256) goes into
    reproduction/gpu_suite/; the next job's encoder step is ``in_repo`` and
    the steps that need it read that copy (no pretraining in the lease)."""
    from osfl.suite.encoder import COMMITTED, committed_encoder

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    counts = import_bundle(_encoder_bundle(tmp_path / "b"), repo)
    assert counts == {"encoder": 1}
    copy = committed_encoder(repo)
    assert copy == repo / COMMITTED / "cifar5_vitti16_sup.safetensors"
    assert copy.read_bytes() == (tmp_path / "b" / copy.name).read_bytes()
    encoder_step = Step(name="pretrain_vitti16", section="pretrain", kind="mfu",
                        argv=("suite", "mfu", "--out", "{out}"), tiny=(), work=Work({"decode": 1.0}))  # fmt: skip
    reader = Step(name="reader", section="frozen", kind="mfu",
                  argv=("suite", "mfu", "--enc", "{encoder}", "--out", "{out}"), tiny=(),
                  work=Work({"decode": 1.0}), needs=("pretrain_vitti16",))  # fmt: skip
    seen: list[str] = []
    argvs: list[list[str]] = []

    def command(argv):
        argvs.append(list(argv))
        return _command(seen)(argv)

    req = SuiteRequest(out=tmp_path / "s", budget_min=10, steps=[encoder_step, reader],
                       rates=RATES, repo=repo, preflight="none")  # fmt: skip
    planned = run_suite(req, command, log=lambda s: None).planned
    assert seen == ["reader"] and planned[0].status == "in_repo"
    assert "the encoder is committed at" in planned[0].reason
    assert argvs[0][argvs[0].index("--enc") + 1] == str(copy.resolve())


def test_a_tampered_encoder_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, capsys
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    bundle = _encoder_bundle(tmp_path / "b", tamper=True)
    with pytest.raises(SystemExit) as e:
        main(["suite", "import", str(bundle), "--repo", str(repo)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "sha256 differs" in err and "\n" not in err
    assert sorted(p.name for p in repo.iterdir()) == ["REPRODUCTION.md"]


def test_import_writes_the_measured_rates_and_mfu_into_benchmarks(tmp_path: Path) -> None:
    """A GPU job's bundle (rates measured there, the MFU step's variants):
    BENCHMARKS.md's GPU section gets a generated table with the machine,
    replaced (not repeated) when the same job is imported again; the job's
    seconds go to reproduction/gpu_suite/state.json."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    (repo / "BENCHMARKS.md").write_text("# Benchmarks\n\n## On a lent GPU (one H200)\n\nOld.\n")
    rates = {**RATES, "resnet18_32": 31_234.5, "vits16_224": 4_900.0, "vitti16_224": 12_000.0,
             "machine": "NVIDIA H200"}  # fmt: skip
    mfu_rows = [{"section": "mfu", "step": "mfu_vitb16_bf16", "row": "mfu_vitb16_bf16",
                 "method": f"MFU vit_base_patch16_224 bfloat16 ({v})", "setting": f"batch {b}",
                 "paper": 40.0, "ours": m, "per_seed": [m], "scale": "gpu", "command": "osfl suite mfu",
                 "achieved_tflops": t, "provenance": PROVENANCE}
                for v, b, m, t in (("eager", 128, 26.1, 258.0), ("fused+compile+b256", 256, 41.5, 410.6))]  # fmt: skip
    plan = {"machine": "NVIDIA H200", "started": "2026-12-01T10:00:00+00:00", "dry_run": False,
            "overheads": {"preflight_s": 41.0, "rates_s": 28.0},
            "steps": [{"step": {"name": "mfu_vitb16_bf16"}, "status": "done", "seconds": 150.0,
                       "base_s": 120.0, "kind": "fixed", "estimate_s": 120.0}]}  # fmt: skip
    write_bundle(tmp_path / "b", plan=plan, rows=mfu_rows, markdown="", rates=rates, members=[])
    import_bundle(tmp_path / "b", repo)
    import_bundle(tmp_path / "b", repo)  # again: the same job, replaced
    page = (repo / "BENCHMARKS.md").read_text()
    assert page.count("<!-- osfl suite import: gpu -->") == 1 and page.index("Old.") < page.index(
        "<!-- osfl suite import: gpu -->"
    )
    line = next(x for x in page.splitlines() if x.startswith("| 2026-12-01"))
    assert "NVIDIA H100 80GB HBM3, driver 580.1, CUDA 13.0, torch 2.11.0" in line
    assert "| 31,234 | 4,900 | 12,000 |" in line
    assert "eager: 26.1 % (258 TFLOP/s, batch 128); fused+compile+b256: 41.5 % (411 TFLOP/s" in line
    state = json.loads((repo / "reproduction" / "gpu_suite" / "state.json").read_text())
    assert len(state["jobs"]) == 1 and state["jobs"][0]["preflight_s"] == 41.0
    assert state["jobs"][0]["steps"] == [{"step": "mfu_vitb16_bf16", "kind": "fixed",
                                          "status": "done", "seconds": 150.0, "base_s": 120.0,
                                          "estimate_s": 120.0}]  # fmt: skip


def test_rows_on_a_self_pretrained_backbone_say_so_beside_the_papers_number(tmp_path: Path) -> None:
    from osfl.suite.step_parts import BACKBONE

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text("# R\n\n## FedMITR\n")
    row = {"section": "fedmitr", "step": "fedmitr_t1_a0.1_seed0", "row": "fedmitr_t1_a0.1",
           "method": "fedmitr", "setting": "", "paper": 36.97, "ours": 51.2, "seeds": [0],
           "per_seed": [51.2], "scale": "gpu", "command": "osfl run ...", "backbone": BACKBONE,
           "paper_note": "FedMITR Table I", "scale_note": "substitutes: ...",
           "provenance": PROVENANCE}  # fmt: skip
    write_bundle(tmp_path / "b", plan={"steps": []}, rows=[row], markdown="", rates=RATES,
                 members=[])  # fmt: skip
    import_bundle(tmp_path / "b", repo)
    line = next(
        x for x in (repo / "REPRODUCTION.md").read_text().splitlines() if "| fedmitr |" in x
    )
    assert "| 36.97 | 51.20 |" in line and "| self-pretrained ViT-Ti/16" in line
    assert "not the paper's backbone" in line


@pytest.mark.parametrize(
    "plan", [{"steps": [{"step": 3, "status": "done", "seconds": 1.0, "base_s": 1.0}]},
             {"steps": "nope"}, {"steps": [[]]}],
)  # fmt: skip
def test_a_damaged_bundle_plan_is_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys, plan: dict
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    bundle = _bundle(tmp_path / "b", {0: 70.0}, "fafi_salt_a0.1_seed0")
    (bundle / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(SystemExit) as e:
        main(["suite", "import", str(bundle), "--repo", str(repo)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "is damaged" in err and "\n" not in err
    assert sorted(p.name for p in repo.iterdir()) == ["REPRODUCTION.md"]


def test_what_a_bundle_cannot_teach_is_left_out_of_the_state(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "REPRODUCTION.md").write_text(PAGE)
    bundle = _bundle(tmp_path / "b", {0: 70.0}, "fafi_salt_a0.1_seed0")
    steps = [{"step": {"name": "x"}, "status": "done", "seconds": "long", "base_s": 1.0},
             {"step": {"name": "y"}, "status": "failed", "reason": "OOM", "seconds": 3.0,
              "base_s": 1.0}]  # fmt: skip
    (bundle / "plan.json").write_text(json.dumps({"steps": steps, "started": 7}))
    import_bundle(bundle, repo)
    state = json.loads((repo / "reproduction" / "gpu_suite" / "state.json").read_text())
    assert state["jobs"][0]["started"] == "7" and state["jobs"][0]["steps"] == []
