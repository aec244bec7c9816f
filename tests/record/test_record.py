"""The typed run record (osfl.record): round trip, validation that names the
field, files written by an older osfl (tests/fixtures/records/) read and migrated,
and a version this code cannot read refused in one line."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from osfl import report
from osfl.config import load_config
from osfl.errors import DataError
from osfl.experiment import run_experiment
from osfl.fl.method import METHODS
from osfl.record import (
    RECORD_FIELDS,
    SCHEMA_VERSION,
    CurvePoint,
    RecordError,
    RunRecord,
    migrate,
)
from support.paths import FIXTURES, ROOT
from support.tiny import TINY_RECORD

OLD = FIXTURES / "records"

RECORD = {
    "method": "fedavg",
    "seed": 1,
    "point": "",
    "regime": "scratch",
    "train": {"lr": 0.01, "epochs": 1},
    "global_test_accuracy": 0.5,
    "per_class_accuracy": [0.5, None],
    "warnings": ["w"],
    "bytes_up": 10,
    "bytes_down": 20,
    "time_s": {"total": 1.5},
    "curve": [{"round": 0, "global_test_accuracy": 0.5}],
    "server": {"uploads": [1, 2]},
}


def test_a_record_round_trips_with_its_keys_in_order() -> None:
    r = RunRecord.from_dict(RECORD)
    assert r.to_dict() == RECORD and list(r.to_dict()) == list(RECORD)
    assert json.dumps(r.to_dict()) == json.dumps(RECORD)
    assert r.method == "fedavg" and r.seed == 1 and r.bytes_up == 10
    assert r.warnings == ("w",) and r.curve[0].global_test_accuracy == 0.5
    assert r.extras["server"]["uploads"] == (1, 2)
    # a Mapping of the JSON keys, for the readers that index records
    assert r["server"] == {"uploads": [1, 2]} and r.get("nothing") is None
    assert "local_test_accuracy" not in r and "curve" in r and len(r) == len(RECORD)
    assert r == RECORD and dict(r) == RECORD
    # absent optional fields stay absent; None fields written as None stay
    assert "mean_client_accuracy" not in r.to_dict()
    assert RunRecord.from_dict({**RECORD, "train": None}).to_dict()["train"] is None


def test_a_record_is_read_only_and_replace_validates() -> None:
    r = RunRecord.from_dict(RECORD)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.seed = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        r.extras["server"]["uploads"] = []  # type: ignore[index]
    r["server"]["uploads"].append(3)  # a copy: the record does not change
    assert r["server"]["uploads"] == [1, 2]
    audited = r.replace(audit={"rlu": 0.9})
    assert list(audited)[-1] == "audit" and audited.audit == {"rlu": 0.9}
    assert "audit" not in r
    with pytest.raises(RecordError, match="'audit' must be an object"):
        r.replace(audit=[1])
    assert "server" not in r.without("server")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", "1"),
        ("seed", True),
        ("bytes_down", -5),
        ("bytes_up", float("inf")),
        ("global_test_accuracy", "high"),
        ("mean_client_accuracy", [0.5]),
        ("warnings", "one"),
        ("curve", [1]),
        ("time_s", {"total": "1"}),
        ("train", [1]),
    ],
)
def test_a_wrong_field_is_one_error_naming_it(field: str, value: object) -> None:
    with pytest.raises(RecordError, match=f"field '{field}' must be") as e:
        RunRecord.from_dict({**RECORD, field: value})
    assert e.value.field == field
    assert report.record_problem({**RECORD, field: value}) == str(e.value)


def test_a_missing_required_field_and_a_non_object() -> None:
    with pytest.raises(RecordError, match="lacks 'seed'") as e:
        RunRecord.from_dict({"method": "fedavg"})
    assert e.value.field == "seed"
    assert report.record_problem([1]) == "is not an object"
    assert report.record_problem(RECORD) is None
    assert set(RECORD_FIELDS) >= {"method", "seed", "global_test_accuracy", "curve"}


def test_read_metrics_names_the_file_record_and_field(tmp_path: Path) -> None:
    path = report.write_metrics(
        tmp_path / "metrics.json", [RECORD, {**RECORD, "seed": 2}], info={"sweep": []}
    )
    doc = report.read_metrics(path)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert all(isinstance(r, RunRecord) for r in doc["records"])
    assert doc["records"][0].to_dict() == RECORD
    text = json.loads(path.read_text())
    text["records"][1]["bytes_down"] = -5
    path.write_text(json.dumps(text))
    with pytest.raises(DataError) as e:
        report.read_metrics(path)
    assert str(e.value) == (
        f"{path}: damaged (record 1 field 'bytes_down' must be a non-negative number)"
    )


def test_a_newer_or_bad_version_is_refused_in_one_line(tmp_path: Path) -> None:
    path = report.write_metrics(tmp_path / "metrics.json", [RECORD], info={})
    doc = json.loads(path.read_text())
    for version, says in ((SCHEMA_VERSION + 1, "newer osfl"), ("2", "must be an integer")):
        path.write_text(json.dumps({**doc, "schema_version": version}))
        with pytest.raises(RecordError, match=says) as e:
            report.read_metrics(path)
        assert str(e.value).startswith(f"{path}: damaged (field 'schema_version'")
        assert e.value.field == "schema_version"


#: Version 2's names of an own-models or ``local`` record's numbers -> version
#: 3's, written out here (docs/run-directory.md's "Versions"), not taken from
#: the code under test.
RENAMED_WITH_CLIENTS = {
    "per_class_accuracy": "mean_client_per_class_accuracy",
    "validation_accuracy": "mean_client_validation_accuracy",
    "local_test_accuracy": "mean_client_local_test_accuracy",
    "local_test_accuracies": "client_local_test_accuracies",
    "nonfinite_outputs": "client_nonfinite_outputs",
    "server_per_class_accuracy": "per_class_accuracy",
    "server_validation_accuracy": "validation_accuracy",
    "server_local_test_accuracy": "local_test_accuracy",
}
OLD_FILES = sorted(p.stem for p in OLD.glob("v*.json"))


def _renamed_top(before: dict) -> dict:
    """``before``'s keys other than the curve and its blocks, under version 3's names."""
    clients = "mean_client_accuracy" in before
    out = {}
    for k, v in before.items():
        if k in ("curve", "convergence", "best_on_validation"):
            continue
        if clients and k == "server_accuracy":
            continue
        out[RENAMED_WITH_CLIENTS.get(k, k) if clients else k] = v
    return out


def _renamed_point(p: dict, clients: bool) -> dict:
    if not clients:
        return {"round": p["round"], "global_test_accuracy": p["accuracy"]} | {
            k: v for k, v in p.items() if k not in ("round", "accuracy")
        }
    out = {"round": p["round"], "global_test_accuracy": p.get("server_accuracy")}
    out["mean_client_accuracy"] = p["accuracy"]
    for k, v in p.items():
        if k not in ("round", "accuracy", "server_accuracy"):
            out["mean_client_validation_accuracy" if k == "validation_accuracy" else k] = v
    return out


def test_the_old_files_are_of_both_old_versions() -> None:
    versions = {json.loads((OLD / f"{n}.json").read_text())["schema_version"] for n in OLD_FILES}
    assert versions == {1, 2} and SCHEMA_VERSION == 3


@pytest.mark.parametrize("name", OLD_FILES)
def test_an_old_file_reads_into_the_typed_record(name: str) -> None:
    """Every key of an old record is read under version 3's name with its
    value (a record with clients' own models: the clients' numbers renamed,
    the server predictor's ``server_*`` under the plain names; every curve
    point's ``accuracy`` named), in the same order, and nothing else changes
    but a version-1 own-models accuracy (the clients' mean, read as the
    server predictor's)."""
    path = OLD / f"{name}.json"
    old = json.loads(path.read_text())
    doc = report.read_metrics(path)
    assert doc["schema_version"] == SCHEMA_VERSION
    for before, r in zip(old["records"], doc["records"], strict=True):
        assert isinstance(r, RunRecord)
        clients = "mean_client_accuracy" in before
        expected = _renamed_top(before)
        if old["schema_version"] == 1 and clients:
            expected["global_test_accuracy"] = before.get("server_accuracy")
        got = r.to_dict()
        assert [k for k in got if k in expected] == list(expected)  # same order
        assert {k: got[k] for k in expected} == expected
        assert [p.to_dict() for p in r.curve] == [
            _renamed_point(p, clients) for p in before["curve"]
        ]
        assert not {"server_accuracy", "accuracy"} & set(got)
        assert r.train is not None and r.bytes_up == before["bytes_up"]
        assert r.curve and r.total_seconds == before["time_s"]["total"]
        # every number of the record is the old file's: none computed, none lost
        if not clients:
            assert r.ranked_accuracy == before["global_test_accuracy"]
        else:
            assert r.mean_client_accuracy == before["mean_client_accuracy"]


def test_a_version_2_own_models_file_names_every_number() -> None:
    """The version-2 EFTViT run (eval_every=1, a validation split, eval_local):
    its curve, convergence and best round on validation measured the
    clients' mean under the server's names; read, each number is under its
    one name."""
    old = json.loads((OLD / "v2_eftvit.json").read_text())["records"][0]
    (r,) = report.read_metrics(OLD / "v2_eftvit.json")["records"]
    assert r.global_test_accuracy == old["server_accuracy"] == old["global_test_accuracy"]
    assert r.extra("per_class_accuracy") == old["server_per_class_accuracy"]
    assert r.extra("mean_client_per_class_accuracy") == old["per_class_accuracy"]
    assert r.extra("validation_accuracy") == old["server_validation_accuracy"]
    assert r.extra("mean_client_validation_accuracy") == old["validation_accuracy"]
    assert r.local_test_accuracy == old["server_local_test_accuracy"]
    assert r.mean_client_local_test_accuracy == old["local_test_accuracy"]
    assert r.extra("client_local_test_accuracies") == old["local_test_accuracies"]
    assert len(r.curve) == len(old["curve"]) >= 2
    for p, q in zip(r.curve, old["curve"], strict=True):
        assert p.global_test_accuracy == q["server_accuracy"]
        assert p.mean_client_accuracy == q["accuracy"]
        assert p.mean_client_validation_accuracy == q["validation_accuracy"]
    # the old convergence measured the clients' mean, and now says so
    assert r.convergence is not None and old["convergence"] is not None
    assert r.convergence["accuracy_key"] == "mean_client_accuracy"
    assert r.convergence["best_accuracy"] == max(q["accuracy"] for q in old["curve"])
    best = old["best_on_validation"]
    assert dict(r.best_on_validation or {}) == {
        "round": best["round"],
        "mean_client_validation_accuracy": best["validation_accuracy"],
        "mean_client_accuracy": best["accuracy"],
    }


def test_a_version_2_server_predictor_file_names_its_curve() -> None:
    """fedavg's version-2 record kept the server's names; its curve's
    ``accuracy`` is ``global_test_accuracy``, convergence says it measured it,
    and ``local`` (no server predictor) has the clients' names."""
    old = {
        r["method"]: r for r in json.loads((OLD / "v2_fedavg_local.json").read_text())["records"]
    }
    recs = {r.method: r for r in report.read_metrics(OLD / "v2_fedavg_local.json")["records"]}
    fedavg, local = recs["fedavg"], recs["local"]
    assert [p.global_test_accuracy for p in fedavg.curve] == [
        q["accuracy"] for q in old["fedavg"]["curve"]
    ]
    assert fedavg.curve[-1].global_test_accuracy == fedavg.global_test_accuracy
    assert all(p.mean_client_accuracy is None for p in fedavg.curve)
    assert fedavg.convergence is not None
    assert fedavg.convergence["accuracy_key"] == "global_test_accuracy"
    assert fedavg.extra("validation_accuracy") == old["fedavg"]["validation_accuracy"]
    assert fedavg.best_on_validation is not None
    assert set(fedavg.best_on_validation) == {
        "round",
        "validation_accuracy",
        "global_test_accuracy",
    }
    assert local.global_test_accuracy is None
    assert local.mean_client_accuracy == old["local"]["mean_client_accuracy"]
    assert local.extra("mean_client_per_class_accuracy") == old["local"]["per_class_accuracy"]
    assert local.extra("per_class_accuracy") is None


def test_an_old_server_predictor_record_keeps_its_accuracy() -> None:
    doc = report.read_metrics(OLD / "v1_fedavg_ensemble.json")
    old = json.loads((OLD / "v1_fedavg_ensemble.json").read_text())
    for before, r in zip(old["records"], doc["records"], strict=True):
        assert r.global_test_accuracy == before["global_test_accuracy"]
        assert r.ranked_accuracy == before["global_test_accuracy"]
        assert not r.accuracy_is_clients_mean


def test_an_old_own_models_record_is_migrated() -> None:
    """Version 1 wrote the clients' mean as EFTViT's accuracy: read, it is the
    server predictor's, and the clients' mean is only ``mean_client_accuracy``."""
    before = json.loads((OLD / "v1_eftvit.json").read_text())["records"][0]
    assert before["global_test_accuracy"] == before["mean_client_accuracy"]
    (r,) = report.read_metrics(OLD / "v1_eftvit.json")["records"]
    assert r.global_test_accuracy == before["server_accuracy"]
    assert "server_accuracy" not in r.to_dict()  # version 3: one name, global_test_accuracy
    assert r.mean_client_accuracy == before["mean_client_accuracy"]
    assert r.ranked_accuracy == before["server_accuracy"] and not r.accuracy_is_clients_mean
    # `local` has no server predictor: no global accuracy, the clients' mean ranks it
    (local,) = report.read_metrics(OLD / "v1_local.json")["records"]
    mean = json.loads((OLD / "v1_local.json").read_text())["records"][0]["mean_client_accuracy"]
    assert local.global_test_accuracy is None and local["global_test_accuracy"] is None
    assert local.ranked_accuracy == mean and local.accuracy_is_clients_mean


def test_migrate_moves_only_an_accuracy_equal_to_the_clients_mean() -> None:
    own = {"method": "eftvit", "seed": 0, "global_test_accuracy": 0.6}
    own |= {"mean_client_accuracy": 0.6, "server_accuracy": 0.4}
    # version 3 drops server_accuracy: it is global_test_accuracy
    current = {"method": "eftvit", "seed": 0, "global_test_accuracy": 0.4}
    current |= {"mean_client_accuracy": 0.6}
    assert migrate(own, 1) == current
    assert migrate(current, 3) == current  # a current record is left as it is
    v2 = {**current, "server_accuracy": 0.4}
    assert migrate(v2, 2) == current
    differs = {**own, "global_test_accuracy": 0.5}  # not the clients' mean: kept
    assert migrate(differs, 1) == {**current, "global_test_accuracy": 0.5}
    assert migrate({**own, "global_test_accuracy": None}, 1)["global_test_accuracy"] is None
    plain = {"method": "fedavg", "seed": 0, "global_test_accuracy": 0.5}
    assert migrate(plain, 1) == plain
    # a server predictor's record keeps its names; only its curve's accuracy is named
    curve = {**plain, "curve": [{"round": 0, "accuracy": 0.5, "validation_accuracy": 0.4}]}
    assert migrate(curve, 2)["curve"] == [
        {"round": 0, "global_test_accuracy": 0.5, "validation_accuracy": 0.4}
    ]


def test_ranked_accuracy_is_the_servers_else_the_clients_mean() -> None:
    def ranked(**accs: float | None) -> float | None:
        return RunRecord.from_dict({"method": "m", "seed": 0, **accs}).ranked_accuracy

    assert ranked(global_test_accuracy=0.5, mean_client_accuracy=0.7) == 0.5
    assert ranked(global_test_accuracy=None, mean_client_accuracy=0.7) == 0.7
    assert ranked(global_test_accuracy=None) is None
    point = CurvePoint(round=0, global_test_accuracy=None, mean_client_accuracy=0.7)
    assert point.ranked_accuracy == 0.7 and point.ranked_key == "mean_client_accuracy"
    point = CurvePoint(round=0, global_test_accuracy=0.5, mean_client_accuracy=0.7)
    assert point.ranked_accuracy == 0.5 and point.ranked_key == "global_test_accuracy"


def test_a_current_curve_point_with_the_old_accuracy_key_is_refused() -> None:
    with pytest.raises(RecordError, match="'accuracy', a key of schema version 2") as e:
        RunRecord.from_dict({**RECORD, "curve": [{"round": 0, "accuracy": 0.5}]})
    assert e.value.field == "curve"


def test_a_run_writes_one_meaning_of_accuracy() -> None:
    """``run_record``: EFTViT's ``global_test_accuracy`` is its server
    predictor's; ``local`` has none and ranks by its clients' mean, in a marked
    cell with a note that says so."""
    own = METHODS.get("eftvit").card.smoke
    eftvit, local = (
        RunRecord.from_dict(dict(r))
        for r in [
            *run_experiment(load_config(None, [*TINY_RECORD, *own, "methods=[eftvit]"])),
            *run_experiment(load_config(None, [*TINY_RECORD, "methods=[local]"])),
        ]
    )
    assert eftvit.global_test_accuracy is not None and "server_accuracy" not in eftvit.to_dict()
    assert eftvit.mean_client_accuracy is not None and not eftvit.accuracy_is_clients_mean
    assert local.global_test_accuracy is None and "global_test_accuracy" in local
    assert local.ranked_accuracy == local.mean_client_accuracy is not None
    rows = report.summarize([eftvit, local])
    header, cells = report.table_rows(rows)
    acc, clients = header.index("accuracy (%)"), header.index("clients' own models (%)")
    assert cells[0][acc] == f"{100 * eftvit.global_test_accuracy:.2f}"
    assert cells[0][clients] == f"{100 * eftvit.mean_client_accuracy:.2f}"
    assert cells[1][acc] == f"{100 * local.mean_client_accuracy:.2f}{report.CLIENTS_MEAN_MARK}"
    md = report.summary_markdown(rows, title="t")
    assert "† mean of the clients' own models (local: no server predictor)" in md
    per_seed = report.per_seed([eftvit, local])
    assert per_seed[1]["accuracy_of"] == "mean of the clients' own models"
    assert "accuracy_of" not in per_seed[0]


def test_the_run_directory_page_documents_every_field() -> None:
    """docs/run-directory.md's record table names every typed field of
    RunRecord and every key an (old or new) run's record reads as."""
    doc = (ROOT / "docs" / "run-directory.md").read_text()
    documented = {
        name
        for line in doc.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([a-z_]+)`", line.split("|")[1])
    }
    typed = {f.name for f in dataclasses.fields(RunRecord)} - {"extras", "keys_written"}
    assert typed <= documented, sorted(typed - documented)
    for path in sorted(OLD.glob("*.json")):
        for r in report.read_metrics(path)["records"]:
            assert set(r.to_dict()) <= documented, (path.name, sorted(set(r) - documented))
    assert f'"schema_version": {SCHEMA_VERSION},' in doc


def test_a_record_built_field_by_field_writes_what_it_sets() -> None:
    r = RunRecord(method="fedavg", seed=0, global_test_accuracy=0.5, rounds=1, extras={"sweep": {}})
    assert r.to_dict() == {
        "method": "fedavg",
        "seed": 0,
        "global_test_accuracy": 0.5,
        "rounds": 1,
        "sweep": {},
    }
    with pytest.raises(RecordError, match="'bytes_up' must be a non-negative number"):
        RunRecord(method="fedavg", seed=0, bytes_up=-1)


# --------------------------------------------------------------------------- read as types
class _NoItemAccess(RunRecord):
    """A record whose ``Mapping`` view (kept for export only) raises: a reader
    that indexes, iterates, sizes or ``in``-tests it fails here."""

    def __getitem__(self, key: str) -> Any:
        raise AssertionError(f"record[{key!r}] read: osfl's readers use attributes")

    def __iter__(self) -> Any:
        raise AssertionError("a record iterated as a mapping")

    def __len__(self) -> int:
        raise AssertionError("len() of a record")

    def __contains__(self, key: object) -> bool:
        raise AssertionError(f"{key!r} in record: use the attribute or keys_written")


def _strict(records: list[RunRecord]) -> list[RunRecord]:
    return [_NoItemAccess.from_dict(r.to_dict()) for r in records]


@pytest.fixture
def strict_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record read from a metrics.json is a :class:`_NoItemAccess`."""
    import osfl.record.versions

    monkeypatch.setattr(osfl.record.versions, "RunRecord", _NoItemAccess)


def _old_records() -> list[RunRecord]:
    out = []
    for name in OLD_FILES:
        out += report.read_metrics(OLD / f"{name}.json")["records"]
    return out


def test_the_strict_record_does_raise_on_item_access() -> None:
    (r,) = _strict([RunRecord.from_dict(RECORD)])
    for read in (lambda: r["method"], lambda: r.get("seed"), lambda: list(r), lambda: "x" in r):
        with pytest.raises(AssertionError):
            read()
    assert r.to_dict() == RECORD  # the export is not item access


def test_the_report_reads_records_as_types() -> None:
    """Tables, per-seed rows, cost to accuracy, plots and the audit table of
    the old files' records (curves, convergence, validation, own models,
    ``local``) and an audited one, none read by key."""
    from osfl.privacy.audit.tables import audit_markdown, audit_rich_table

    rows = [{"round": 0, "client": 0, "cAcc": 1.0, "iAcc": 0.5}]
    audited = RunRecord.from_dict({**RECORD, "audit": {"rlu": {"per_observation": rows}}})
    records = _strict([*_old_records(), audited])
    summary = report.summarize(records)
    _, cells = report.table_rows(summary)
    assert len(cells) == len({(r.point, r.method) for r in records})
    assert report.summary_markdown(summary, title="t").startswith("# t")
    assert report.rich_table(summary) is not None
    assert len(report.per_seed(records)) == len(summary)
    assert "## Cost to accuracy" in report.convergence_markdown(records)
    assert report.curves_figure(records, link_mbps=8.0) is not None
    assert report.frontier_figure(records) is not None
    assert "| fedavg | rlu |" in audit_markdown(records)
    assert audit_rich_table(records) is not None


def test_the_trackers_read_records_as_types() -> None:
    from osfl.trackers.base import last_round, record_scalars

    for r in _strict(_old_records()):
        scalars = record_scalars(r)
        assert scalars["accuracy"] == r.ranked_accuracy
        assert last_round(r) == (r.rounds or 1) - 1


def test_osfl_table_and_the_scoreboard_read_records_as_types(
    tmp_path: Path, strict_reads: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """``osfl table`` over two run directories of one split (an old run's
    fedavg and local records, one in each)."""
    from osfl.cli import main
    from osfl.scoreboard import merge_runs

    doc = json.loads((OLD / "v2_fedavg_local.json").read_text())
    runs = []
    for rec in doc["records"]:
        (tmp_path / rec["method"]).mkdir()
        (tmp_path / rec["method"] / "metrics.json").write_text(
            json.dumps({**doc, "records": [rec]})
        )
        runs.append(tmp_path / rec["method"])
    merged = merge_runs(runs)
    assert all(isinstance(r, _NoItemAccess) for r in merged)
    assert [r.method for r in merged] == ["fedavg", "local"]
    assert main(["table", *map(str, runs)]) == 0
    out = capsys.readouterr().out
    assert "fedavg" in out and "local" in out


def test_merging_builds_new_records_and_edits_none(tmp_path: Path, strict_reads: None) -> None:
    """Two runs of fedavg in two variants: each merged record is relabelled
    by a new record; the ones read are not changed."""
    from osfl.scoreboard import merge_runs

    doc = json.loads((OLD / "v2_fedavg_local.json").read_text())
    fedavg = next(r for r in doc["records"] if r["method"] == "fedavg")
    other = json.loads(json.dumps(fedavg))
    other["method_config"]["rounds"] = 7
    other["seed"] = 1
    other["partition"]["seed"] = fedavg["partition"]["seed"]
    for name, rec in (("a", fedavg), ("b", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({**doc, "records": [rec]}))
    read = [report.read_metrics(tmp_path / n / "metrics.json")["records"][0] for n in "ab"]
    before = [r.to_dict() for r in read]
    merged = merge_runs([tmp_path / "a", tmp_path / "b"])
    assert [r.method for r in merged] == ["fedavg (rounds=3)", "fedavg (rounds=7)"]
    assert [r.to_dict() for r in read] == before  # nothing read was edited
    assert all(m is not r for m, r in zip(merged, read, strict=True))


def test_the_suite_rows_read_records_as_types(tmp_path: Path, strict_reads: None) -> None:
    from osfl.suite.catalogue import STEPS
    from osfl.suite.rows import step_rows

    step = next(s for s in STEPS if s.kind not in ("pretrain", "mfu", "script"))
    (tmp_path / "metrics.json").write_text((OLD / "v2_fedavg_local.json").read_text())
    rows = {r["method"]: r for r in step_rows(step, tmp_path, ["run", "x.yaml"], dry_run=True)}
    (fedavg,) = [r for m, r in rows.items() if m.startswith("fedavg")]
    old = json.loads((OLD / "v2_fedavg_local.json").read_text())["records"][0]
    assert fedavg["per_seed"] == [100 * old["global_test_accuracy"]]
    assert fedavg["provenance"] == old["provenance"]
