"""``osfl table``: several run directories on the same clients merged into one
scoreboard per regime; variants of one method labelled (options flattened to
dotted keys, non-strings as key-sorted JSON, a missing option shown as an em
dash: mutation survivors, TESTING.md); different clients refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from osfl.cli import main
from osfl.errors import DataError
from osfl.record import RunRecord
from osfl.scoreboard import _flat, merge_runs, variant_labels
from support.paths import FIXTURES


def _record(method: str, seed: int, acc: float, *, regime="scratch", key="k0", **cfg) -> dict:
    return {
        "method": method,
        "seed": seed,
        "point": "partition.alpha=0.1",
        "regime": regime,
        "global_test_accuracy": acc,
        "bytes_up": 1000,
        "bytes_down": 1000,
        "method_config": cfg,
        "partition": {"key": f"{key}-{seed}", "scheme": "dirichlet"},
    }


def _run(root: Path, name: str, records: list[dict]) -> Path:
    d = root / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"schema_version": 1, "records": records}))
    return d


def test_variant_labels_name_only_the_options_that_differ():
    a = {"blocks": 2, "classifier": "average", "opt": {"lr": 0.1}}
    b = {"blocks": 2, "classifier": "heads", "opt": {"lr": 0.01}}
    assert variant_labels([a, b]) == [
        "classifier=average, opt.lr=0.1",
        "classifier=heads, opt.lr=0.01",
    ]
    assert variant_labels([a, dict(a)]) == ["", ""]


def test_merge_relabels_variants_and_keeps_a_grid_point_together(tmp_path):
    r1 = _run(
        tmp_path,
        "a",
        [_record("fedavg", 0, 0.2), _record("fusefl", 0, 0.25, classifier="average")],
    )
    r2 = _run(tmp_path, "b", [_record("fusefl", 0, 0.3, classifier="heads")])
    merged = merge_runs([r1, r2])
    assert [r["method"] for r in merged] == [
        "fedavg",
        "fusefl (classifier=average)",
        "fusefl (classifier=heads)",
    ]
    assert all("_run" not in r for r in merged)


def test_a_method_trained_with_another_recipe_is_its_own_row(tmp_path):
    a = {**_record("eftvit", 0, 0.5), "train": {"lr": 0.0003, "epochs": 1}}
    b = {**_record("eftvit", 0, 0.6), "train": {"lr": 1e-05, "epochs": 1}}
    merged = merge_runs([_run(tmp_path, "a", [a]), _run(tmp_path, "b", [b])])
    assert [r["method"] for r in merged] == ["eftvit (train.lr=0.0003)", "eftvit (train.lr=1e-05)"]


def test_a_recipe_is_one_row_whichever_layer_set_it(tmp_path):
    """``train_sources`` says where a value came from; the variant is the recipe itself:
    train.grad_clip=1 and fafi_code's own default of 1 are the same clients."""
    train = {"lr": 0.05, "grad_clip": 1.0}
    a = {**_record("fafi_code", 0, 0.5), "train": train, "train_sources": {}}
    b = {
        **_record("fafi_code", 1, 0.6),
        "train": train,
        "train_sources": {"grad_clip": "fafi_code default"},
    }
    c = {
        **_record("fafi_code", 2, 0.7),
        "train": {**train, "grad_clip": 0.5},
        "train_sources": {"grad_clip": "method_train.fafi_code"},
    }
    merged = merge_runs([_run(tmp_path, "a", [a, b]), _run(tmp_path, "c", [c])])
    assert [r["method"] for r in merged] == [
        "fafi_code (train.grad_clip=1.0)",
        "fafi_code (train.grad_clip=1.0)",
        "fafi_code (train.grad_clip=0.5)",
    ]


def test_runs_on_different_clients_are_refused(tmp_path):
    r1 = _run(tmp_path, "a", [_record("fedavg", 0, 0.2, key="x")])
    r2 = _run(tmp_path, "b", [_record("ensemble", 0, 0.3, key="y")])
    with pytest.raises(DataError, match="split the data differently"):
        merge_runs([r1, r2])


def test_the_same_seed_of_a_row_in_two_runs_is_refused(tmp_path):
    r1 = _run(tmp_path, "a", [_record("fedavg", 0, 0.2)])
    r2 = _run(tmp_path, "b", [_record("fedavg", 0, 0.3)])
    with pytest.raises(DataError, match="both hold fedavg seed 0"):
        merge_runs([r1, r2])


def test_cli_prints_one_table_per_regime(tmp_path, capsys):
    r1 = _run(tmp_path, "a", [_record("fedavg", 0, 0.2), _record("fedavg", 1, 0.4, key="k0")])
    r2 = _run(tmp_path, "b", [_record("fedcgs", 0, 0.6, regime="frozen_encoder")])
    assert main(["table", str(r1), str(r2), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("## regime `scratch`") == 1 and out.count("## regime `frozen_encoder`") == 1
    scratch, frozen = out.split("## regime `frozen_encoder`")
    assert "30.00 ± 14.14" in scratch and "fedcgs" not in scratch  # never ranked together
    assert "60.00" in frozen and "fedavg" not in frozen


def test_old_runs_merge_as_typed_records_ranked_by_one_accuracy(tmp_path, capsys):
    """Version-1 run directories (tests/fixtures/records) read into typed records,
    migrated: EFTViT ranks by its server predictor, with the clients' mean in
    its own column; ``local`` (no server predictor) by its clients' mean, in a
    marked cell with the note that says so."""
    old = FIXTURES / "records"
    dirs = []
    for name in ("v1_local", "v1_fedavg_ensemble"):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.json").write_text((old / f"{name}.json").read_text())
        dirs.append(d)
    records = merge_runs(dirs)
    assert all(isinstance(r, RunRecord) for r in records)
    assert [r.method for r in records] == ["local", "fedavg", "ensemble"]
    assert records[0].global_test_accuracy is None and records[0].accuracy_is_clients_mean
    assert main(["table", *map(str, dirs), "--markdown"]) == 0
    out = capsys.readouterr().out
    mean = 100 * records[0].mean_client_accuracy
    assert f"| local | 1 | {mean:.2f}† |" in out
    assert "† mean of the clients' own models (local: no server predictor)" in out
    eftvit = tmp_path / "v1_eftvit"
    eftvit.mkdir()
    (eftvit / "metrics.json").write_text((old / "v1_eftvit.json").read_text())
    (r,) = merge_runs([eftvit])
    before = json.loads((old / "v1_eftvit.json").read_text())["records"][0]
    assert r.global_test_accuracy == before["server_accuracy"] != r.mean_client_accuracy
    assert main(["table", str(eftvit), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "clients' own models (%)" in out and "†" not in out
    row = (
        f"| eftvit | 1 | {100 * r.global_test_accuracy:.2f} | {100 * r.mean_client_accuracy:.2f} |"
    )
    assert row in out


def test_cli_writes_each_rows_per_seed_values(tmp_path):
    """``--per-seed``: the accuracies (%) behind each mean ± std, by seed."""
    r1 = _run(tmp_path, "a", [_record("fedavg", 0, 0.2), _record("fedavg", 1, 0.4)])
    r2 = _run(tmp_path, "b", [_record("fedcgs", 0, 0.6, regime="frozen_encoder")])
    out = tmp_path / "seeds.json"
    assert main(["table", str(r1), str(r2), "--per-seed", str(out)]) == 0
    assert json.loads(out.read_text()) == [
        {"point": "partition.alpha=0.1", "method": "fedavg", "regime": "scratch",
         "accuracy": {"0": 20.0, "1": 40.0}, "mean": 30.0, "std": 14.1421},
        {"point": "partition.alpha=0.1", "method": "fedcgs", "regime": "frozen_encoder",
         "accuracy": {"0": 60.0}, "mean": 60.0, "std": 0.0},
    ]  # fmt: skip


def test_cli_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["table", str(tmp_path)])
    assert e.value.code == 2
    assert "not an osfl run directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("regime", "pretrained", "regime"),
        ("task", {"data": {"image_size": 32}}, "task"),
        ("provenance", {"data": {"test": "other-test-set"}}, "test set"),
        ("train", {"lr": 0.5}, "training recipe"),
        ("partition", {"key": "k0-1", "scheme": "iid"}, "partition scheme"),
    ],
)
def test_a_row_whose_seeds_are_not_comparable_is_refused(tmp_path, field, value, name):
    """Seed 0 from one run and seed 1 from another may form one row only when
    nothing but the seed differs (a scratch and a pretrained record of one
    method once became one "2 seeds" row)."""
    base = {"task": {"data": {"image_size": 16}}, "provenance": {"data": {"test": "t"}}}
    a = {**_record("fedavg", 0, 0.2), **base}
    b = {**_record("fedavg", 1, 0.3), **base, field: value}
    if field == "train":  # a recipe is a variant (its own row) unless the labels coincide
        a["train"] = {"lr": 0.1}
        b["method"] = a["method"]
        with pytest.raises(DataError, match="differ in their training recipe"):
            _check_rows([a, b])
        return
    with pytest.raises(DataError, match=f"differ in their {name}"):
        merge_runs([_run(tmp_path, "a", [a]), _run(tmp_path, "b", [b])])


def _check_rows(records):
    from osfl.scoreboard import Entry, _check_comparable_rows

    _check_comparable_rows([Entry(RunRecord.from_dict(r), "x") for r in records])


def test_a_record_without_a_split_key_needs_the_flag(tmp_path):
    old = _record("fedavg", 0, 0.2)
    del old["partition"]["key"]
    run = _run(tmp_path, "old", [old])
    with pytest.raises(DataError, match="no split key"):
        merge_runs([run])
    assert merge_runs([run], allow_unkeyed=True)[0]["method"] == "fedavg"
    sites = {**_record("fedavg", 0, 0.2), "partition": {"scheme": "sites", "num_clients": 3}}
    assert merge_runs([_run(tmp_path, "sites", [sites])])  # real sites: the sites are the split


def test_options_flatten_to_dotted_keys_with_sorted_json_values() -> None:
    tree = {"a": {"b": 1, "c": "x"}, "d": {"z": 1, "y": [2, 3]}, "e": True}
    assert _flat({"a": tree["a"], "e": True}) == {"a.b": "1", "a.c": "x", "e": "true"}
    assert _flat({"m": {"opt": {"z": 1, "y": 2}}}, prefix="p.") == {
        "p.m.opt.z": "1",
        "p.m.opt.y": "2",
    }
    assert _flat({"o": [{"z": 1, "y": 2}]}) == {"o": '[{"y": 2, "z": 1}]'}


def test_variant_labels_name_only_what_differs_and_mark_absent_options() -> None:
    configs = [{"lr": 0.1, "k": "a"}, {"lr": 0.2, "k": "a"}, {"k": "a", "extra": {"n": 3}}]
    assert variant_labels(configs) == [
        "extra.n=—, lr=0.1",
        "extra.n=—, lr=0.2",
        "extra.n=3, lr=—",
    ]
    assert variant_labels([{"k": 1}, {"k": 1}]) == ["", ""]
