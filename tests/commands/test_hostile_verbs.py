"""Issue 43, "tracebacks and silent acceptances in the new verbs" and "smaller":
each hostile argument or damaged file is one line and exit 2 (never a
traceback, never a silent acceptance), and a refused command leaves nothing
behind — no folder, no file, nothing printed before the refusal."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch

from osfl.cli import main
from support.smoke import exit_2

needs_cryptography = pytest.mark.skipif(
    importlib.util.find_spec("cryptography") is None, reason="osfl flower certs needs it"
)


# --------------------------------------------------------------------------- osfl flower certs
@needs_cryptography
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--days", "3000000"], "of at most 36500"),  # an OverflowError before
        (["--days", "0"], "of at most 36500"),
        (["--host", "999.1.1.1"], "neither an IP address nor a valid DNS name"),
        (["--host", "bad host"], "neither an IP address nor a valid DNS name"),
        (["--port", "-5"], "from 1 to 65535"),
        (["--port", "65536"], "from 1 to 65535"),
        (["--port", "9101"], "SuperNodes serve on"),
        (["--node-keys", "100000"], "from 0 to 1000"),
    ],
)
def test_certs_refuses_before_making_or_printing_anything(tmp_path, capsys, args, says) -> None:
    out = tmp_path / "tls"
    line = exit_2(capsys, ["flower", "certs", str(out), *args])
    assert says in line, line
    assert not out.exists()  # no empty folder left behind
    assert capsys.readouterr().out == ""  # no start commands with the bad value in them


@needs_cryptography
def test_certs_accepts_ip_addresses_and_rfc1123_host_names() -> None:
    from osfl.flower_app.certs import _check_hosts

    assert len(_check_hosts(["10.0.0.5", "::1", "link", "my-host.example.org", "3com.com"])) == 5


@needs_cryptography
def test_certs_refuses_an_existing_node_key_before_writing_the_certificates(tmp_path, capsys):
    (tmp_path / "supernode-1.pub").write_text("an earlier key\n")
    line = exit_2(capsys, ["flower", "certs", str(tmp_path), "--node-keys", "2"])
    assert "supernode-1.pub" in line and "--overwrite" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["supernode-1.pub"]


# --------------------------------------------------------------------------- osfl table
def _record(method: str, seed: int, **extra) -> dict:
    return {
        "method": method,
        "seed": seed,
        "regime": "scratch",
        "global_test_accuracy": 0.5,
        "bytes_up": 1000,
        "bytes_down": 1000,
        "partition": {"key": f"k-{seed}", "scheme": "dirichlet"},
        **extra,
    }


def _run(root: Path, name: str, records: list[dict]) -> Path:
    d = root / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"schema_version": 1, "records": records}))
    return d


def test_table_does_not_overwrite_a_per_seed_file_unless_told(tmp_path, capsys) -> None:
    run = _run(tmp_path, "a", [_record("fedavg", 0)])
    kept = tmp_path / "seeds.json"
    kept.write_text("earlier values\n")
    line = exit_2(capsys, ["table", str(run), "--per-seed", str(kept)])
    assert "exists" in line and "--overwrite" in line
    assert kept.read_text() == "earlier values\n"
    assert main(["table", str(run), "--per-seed", str(kept), "--overwrite"]) == 0
    assert json.loads(kept.read_text())[0]["method"] == "fedavg"


def test_table_checks_its_output_files_before_printing_or_writing(tmp_path, capsys) -> None:
    run = _run(tmp_path, "a", [_record("fedavg", 0)])
    seeds = tmp_path / "seeds.json"
    # one method: no frontier, refused before the per-seed file is written
    line = exit_2(
        capsys, ["table", str(run), "--per-seed", str(seeds), "--frontier", str(tmp_path / "f.png")]
    )
    assert "at least two methods" in line
    assert not seeds.exists() and not (tmp_path / "f.png").exists()
    line = exit_2(capsys, ["table", str(run), "--per-seed", str(tmp_path / "no" / "s.json")])
    assert "does not exist" in line
    assert not (tmp_path / "no").exists()
    assert "is a directory" in exit_2(capsys, ["table", str(run), "--per-seed", str(tmp_path)])


def test_table_of_runs_without_records_is_refused(tmp_path, capsys) -> None:
    a, b = _run(tmp_path, "a", []), _run(tmp_path, "b", [])
    line = exit_2(capsys, ["table", str(a), str(b)])
    assert "no finished record" in line and str(a) in line
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("value", [-5, -0.5, True, "12", None])
def test_table_refuses_a_byte_count_that_is_not_a_non_negative_number(tmp_path, capsys, value):
    run = _run(tmp_path, "a", [_record("fedavg", 0, bytes_down=value)])
    line = exit_2(capsys, ["table", str(run)])
    assert "'bytes_down' must be a non-negative number" in line, line


def test_a_byte_count_of_any_size_is_a_record() -> None:
    from osfl.report import record_problem

    assert record_problem(_record("fedavg", 0, bytes_up=10**400, bytes_down=0.0)) is None


# --------------------------------------------------------------------------- osfl list
@pytest.mark.parametrize("name", ["", "  ", "nosuch"])
def test_list_refuses_an_empty_or_unknown_method(capsys, name) -> None:
    line = exit_2(capsys, ["list", "--method", name])
    assert "method" in line
    assert capsys.readouterr().out == ""  # not the whole catalogue


# --------------------------------------------------------------------------- osfl partition
def test_partition_refuses_a_directory_for_a_file_before_writing(tmp_path, capsys) -> None:
    out = tmp_path / "new" / "p.json"
    args = ["partition", "--dataset", "digits", "--scheme", "iid", "--clients", "2"]
    line = exit_2(capsys, [*args, "--out", str(out), "--plot", str(tmp_path)])
    assert "--plot" in line and "is a directory" in line
    assert not (tmp_path / "new").exists()
    assert "--out" in exit_2(capsys, [*args, "--out", str(tmp_path)])


# --------------------------------------------------------------------------- config messages
def test_byzantine_count_must_be_an_integer(capsys) -> None:
    line = exit_2(capsys, ["run", "byzantine.count=abc"])
    assert "byzantine.count must be an integer, got 'abc'" in line, line
    line = exit_2(capsys, ["run", "byzantine.pick=largest", "byzantine.count=2.5"])
    assert "byzantine.count must be an integer, got 2.5" in line, line


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("method.fens.holdout=2", "method.fens: holdout must lie in [0, 1)"),
        ("method.fens.local.steps=0", "method.fens.local: batch_size and steps"),
        ("method.fens.quantize=x", "method.fens: quantize must be one of"),
    ],
)
def test_a_method_option_is_named_once(capsys, option, says) -> None:
    line = exit_2(capsys, ["run", "methods=[fens]", option])
    assert says in line and "method.fens: method.fens" not in line, line


# --------------------------------------------------------------------------- run directory
def test_a_stopped_run_says_what_metrics_json_holds(tmp_path, caplog) -> None:
    from osfl.report import write_metrics
    from osfl.rundir import RunDir

    log = caplog.at_level(logging.ERROR, logger="osfl.rundir")
    with log, pytest.raises(RuntimeError), RunDir(tmp_path / "none"):
        raise RuntimeError("boom")
    assert "no record finished: metrics.json holds none" in caplog.text
    assert "finished records are in" not in caplog.text
    caplog.clear()
    log = caplog.at_level(logging.ERROR, logger="osfl.rundir")
    with log, pytest.raises(RuntimeError), RunDir(tmp_path / "one") as rd:
        write_metrics(rd.path / "metrics.json", [_record("fedavg", 0)], info={})
        raise RuntimeError("boom")
    assert "1 finished record(s) are in metrics.json" in caplog.text


# --------------------------------------------------------------------------- upload refusals
def test_a_refusal_quotes_a_peers_values_bounded() -> None:
    from osfl.errors import UploadError
    from osfl.fl.upload import MetaSpec, TensorSpec, Upload, UploadSpec, receive

    spec = UploadSpec(
        tensors={"w": TensorSpec((2,), torch.float32)},
        meta={"num_samples": MetaSpec("int", low=1, high=10**7)},
    )
    hostile = [
        ({"num_samples": 10**400}, {"w": torch.zeros(2)}),  # 401 digits
        ({"num_samples": 3, "x" * 500: 1}, {"w": torch.zeros(2)}),
        ({"num_samples": 3}, {"w": torch.zeros(2), "k" * 500: torch.zeros(1)}),
        ({"num_samples": 3}, {"w": torch.zeros([1] * 300)}),
    ]
    for meta, tensors in hostile:
        raw = Upload(tensors=tensors, meta=meta).to_bytes()
        with pytest.raises(UploadError) as e:
            receive(raw, spec, client=3, limit=1 << 30)
        assert len(str(e.value)) < 160 and "\u2026" in str(e.value), str(e.value)


# --------------------------------------------------------------------------- osfl audit
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--aux-per-class", "0"], "--aux-per-class must be >= 1"),  # was accepted
        (["--aux-per-class", "-3"], "--aux-per-class must be >= 1"),
        (["--aux-seed", "-1"], "--aux-seed must be from 0"),  # was a ValueError traceback
        (["--device", "bogus"], "--device 'bogus'"),  # was a RuntimeError traceback
        (["--device", "cuda:99"], "cuda"),  # was an AssertionError traceback on a CPU
    ],
)
def test_audit_refuses_bad_arguments_before_reading_the_run(tmp_path, capsys, args, says):
    line = exit_2(capsys, ["audit", str(tmp_path), "--attack", "rlu", *args])
    assert says in line, line
    assert not list(tmp_path.iterdir())  # no audit.json
