"""The typed run record (osfl.record): round trip, validation that names the
field, files written by an older osfl (tests/fixtures/records/) read and migrated,
and a version this code cannot read refused in one line."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from osfl import report
from osfl.config import load_config
from osfl.errors import DataError
from osfl.experiment import run_experiment
from osfl.fl.method import METHODS
from osfl.record import (
    RECORD_FIELDS,
    SCHEMA_VERSION,
    RecordError,
    RunRecord,
    migrate,
    ranked_accuracy,
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
    "curve": [{"round": 0, "accuracy": 0.5}],
    "server": {"uploads": [1, 2]},
}


def test_a_record_round_trips_with_its_keys_in_order() -> None:
    r = RunRecord.from_dict(RECORD)
    assert r.to_dict() == RECORD and list(r.to_dict()) == list(RECORD)
    assert json.dumps(r.to_dict()) == json.dumps(RECORD)
    assert r.method == "fedavg" and r.seed == 1 and r.bytes_up == 10
    assert r.warnings == ("w",) and r.curve[0]["accuracy"] == 0.5
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


@pytest.mark.parametrize("name", ["v1_fedavg_ensemble", "v1_eftvit", "v1_local"])
def test_an_old_file_reads_into_the_typed_record(name: str) -> None:
    path = OLD / f"{name}.json"
    old = json.loads(path.read_text())
    assert old["schema_version"] == 1
    doc = report.read_metrics(path)
    assert doc["schema_version"] == SCHEMA_VERSION
    for before, r in zip(old["records"], doc["records"], strict=True):
        assert isinstance(r, RunRecord)
        assert list(r) == list(before)  # the same keys, in the same order
        changed = {k for k in before if r[k] != before[k]}
        assert changed <= {"global_test_accuracy"}
        assert r.train is not None and r.bytes_up == before["bytes_up"]
        assert r.curve and r.time_s["total"] == before["time_s"]["total"]


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
    assert r.global_test_accuracy == before["server_accuracy"] == r.server_accuracy
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
    assert migrate(own, 1)["global_test_accuracy"] == 0.4
    assert migrate(own, 2) == own  # a current record is left as it is
    differs = {**own, "global_test_accuracy": 0.5}
    assert migrate(differs, 1) == differs
    assert migrate({**own, "global_test_accuracy": None}, 1)["global_test_accuracy"] is None
    plain = {"method": "fedavg", "seed": 0, "global_test_accuracy": 0.5}
    assert migrate(plain, 1) == plain


def test_ranked_accuracy_of_plain_dicts() -> None:
    assert ranked_accuracy({"global_test_accuracy": 0.5, "mean_client_accuracy": 0.7}) == 0.5
    assert ranked_accuracy({"global_test_accuracy": None, "mean_client_accuracy": 0.7}) == 0.7
    assert ranked_accuracy({"global_test_accuracy": None}) is None


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
    assert eftvit.global_test_accuracy == eftvit.server_accuracy is not None
    assert eftvit.mean_client_accuracy is not None and not eftvit.accuracy_is_clients_mean
    assert local.global_test_accuracy is None and "global_test_accuracy" in local
    assert local.ranked_accuracy == local.mean_client_accuracy is not None
    rows = report.summarize([eftvit, local])
    header, cells = report.table_rows(rows)
    acc, clients = header.index("accuracy (%)"), header.index("clients' own models (%)")
    assert cells[0][acc] == f"{100 * eftvit.server_accuracy:.2f}"
    assert cells[0][clients] == f"{100 * eftvit.mean_client_accuracy:.2f}"
    assert cells[1][acc] == f"{100 * local.mean_client_accuracy:.2f}{report.CLIENTS_MEAN_MARK}"
    md = report.summary_markdown(rows, title="t")
    assert "† mean of the clients' own models (local: no server predictor)" in md
    per_seed = report.per_seed([eftvit, local])
    assert per_seed[1]["accuracy_of"] == "mean of the clients' own models"
    assert "accuracy_of" not in per_seed[0]


def test_the_run_directory_page_documents_every_field() -> None:
    """docs/run-directory.md's record table names every typed field of
    RunRecord and every key an (old or new) run writes."""
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
        for r in json.loads(path.read_text())["records"]:
            assert set(r) <= documented, (path.name, sorted(set(r) - documented))
    assert f'"schema_version": {SCHEMA_VERSION},' in doc


def test_a_record_built_field_by_field_writes_what_it_sets() -> None:
    r = RunRecord(method="fedavg", seed=0, global_test_accuracy=0.5, extras={"rounds": 1})
    assert r.to_dict() == {"method": "fedavg", "seed": 0, "global_test_accuracy": 0.5, "rounds": 1}
    with pytest.raises(RecordError, match="'bytes_up' must be a non-negative number"):
        RunRecord(method="fedavg", seed=0, bytes_up=-1)
