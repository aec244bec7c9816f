"""Audit plumbing: parsing the config's ``audit`` list, the ground truth (the
labels of every local step, summing to m*|B|), the recorded scheme history,
the inline audit in the record and summary, and the audit tables
(``osfl audit RUN_DIR`` itself: ``tests/test_audit_dir.py``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl.data.imageset import ImageSet
from osfl.errors import ConfigError
from osfl.fl.observation import load_observations
from osfl.privacy.audit import (
    AttackSpec,
    AuditSpec,
    audit_markdown,
    audit_truth,
    aux_set,
    parse_audit,
)


def test_parse_audit_items() -> None:
    assert parse_audit([]) is None
    spec = parse_audit(
        [
            "rlu",
            {"attack": "llg+", "label": "llg-a"},
            "record",
            {"options": {"clients": [0], "rounds": [0, -1], "aux_per_class": 5}},
        ]
    )
    assert isinstance(spec, AuditSpec)
    assert [a.key for a in spec.attacks] == ["rlu", "llg-a"]
    assert spec.clients == (0,) and spec.rounds == (0, -1) and spec.aux_per_class == 5
    assert parse_audit(["record"]).attacks == ()


@pytest.mark.parametrize(
    ("items", "match"),
    [
        (["nope"], "unknown attack"),
        ([{"attack": "rlu", "bogus": 1}], "no option"),
        ([{"options": {"bogus": 1}}], "unknown audit option"),
        (["rlu", "rlu"], "twice"),
        ([3], "not an attack name"),
        ([{"options": {"aux_per_class": 0}}], "aux_per_class"),
    ],
)
def test_parse_audit_refuses_bad_items(items, match) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_audit(items)


def test_audit_truth() -> None:
    labels = torch.tensor([0, 1, 1])
    steps = {"labels": labels, "num_classes": 2, "label_source": "steps"}
    assert audit_truth(steps, {"train": {"epochs": 3}})["labels"] is labels
    data = {"labels": labels, "num_classes": 2, "label_source": "data"}
    out = audit_truth(data, {"train": {"epochs": 3, "steps": None}})
    assert out["label_source"] == "data_x_epochs" and out["labels"].tolist() == [0, 1, 1] * 3
    approx = audit_truth(data, {"train": {"epochs": 3, "steps": 5}})
    assert approx["approximate"] is True
    assert audit_truth(None, {}) is None


def test_audit_truth_one_epoch_is_exact_and_drop_last_is_approximate(caplog) -> None:
    """One full epoch uses every sample once (exact, repeated once); with
    ``drop_last`` some samples are never used, so the data labels are only
    an approximation of the step labels, and the log says so."""
    labels = torch.tensor([0, 1, 1])
    data = {"labels": labels, "num_classes": 2}  # no label_source: the data labels
    once = audit_truth(data, {"train": {"epochs": 1}})
    assert once["label_source"] == "data_x_epochs" and once["labels"].tolist() == [0, 1, 1]
    assert "approximate" not in once
    with caplog.at_level(logging.WARNING):
        dropped = audit_truth(data, {"train": {"epochs": 3, "drop_last": True}})
    assert dropped["approximate"] is True and dropped["labels"] is labels
    assert [r.getMessage() for r in caplog.records] == [
        "audit truth is the client's data labels, not its step labels (approximate)"
    ]


def test_aux_set_takes_per_class_and_is_seeded() -> None:
    labels = torch.tensor([0] * 10 + [1] * 3 + [2] * 7)
    test = ImageSet(torch.zeros(20, 1, 2, 2, dtype=torch.uint8), labels, ("a", "b", "c"))
    aux = aux_set(test, 5, seed=1)
    assert np.bincount(aux.labels.numpy()).tolist() == [5, 3, 5]
    assert torch.equal(aux_set(test, 5, seed=1).labels, aux.labels)


@pytest.fixture
def recorded(audited_run: Path) -> Path:
    """The root conftest's audited run, read only."""
    return audited_run


def test_truth_counts_sum_to_m_times_batch(recorded: Path) -> None:
    from osfl.privacy import resolve_inputs

    rec_dirs = sorted((recorded / "observations").iterdir())
    assert [d.name for d in rec_dirs] == ["scaffold-seed0"]
    obs = load_observations(rec_dirs[0])
    assert len(obs) == 3 * 2  # every client of both rounds
    for o in obs:
        n = o.upload_meta["num_samples"]
        labels = o.truth["labels"]
        assert o.truth["label_source"] == "steps"
        # full epochs without drop_last: each sample once per epoch
        assert labels.numel() == 2 * n
        assert labels.numel() == resolve_inputs(o).total_labels  # m*|B| as the attacks count it
        assert o.hparams["fl"]["scheme"] == "scaffold" and o.hparams["model"]["name"] == "cnn_small"


def test_scheme_history_is_recorded_from_round_one(recorded: Path) -> None:
    from osfl.privacy import resolve_inputs

    obs = load_observations(recorded / "observations" / "scaffold-seed0")
    for o in obs:
        keys = [k for k in o.upload if k.startswith("history.")]
        if o.round == 0:
            assert keys == []  # all zero in round 0: nothing recorded
            continue
        x = resolve_inputs(o)
        c, ci = x.history("history.scaffold.c"), x.history("history.scaffold.c_i")
        assert c is not None and ci is not None and c.shape == (10,)
        assert np.abs(ci).sum() > 0  # the client took part in round 0


def test_inline_audit_lands_in_metrics_and_summary(recorded: Path) -> None:
    doc = json.loads((recorded / "metrics.json").read_text())
    res = doc["records"][0]["audit"]["llg+"]
    assert res["n"] == 6 and 0.0 <= res["iAcc"] <= 1.0 and 0.0 <= res["cAcc"] <= 1.0
    assert len(res["per_observation"]) == 6
    assert res["threat_model"] == "honest-but-curious server"
    for o in res["per_observation"]:
        assert o["global_model"] == ("initial" if o["round"] == 0 else "trained")
        assert o["local_steps"] >= 1
    assert "## Privacy audit" in (recorded / "summary.md").read_text()


def test_audit_markdown_pools_observations() -> None:
    rows = [
        {"round": 0, "client": 0, "cAcc": 1.0, "iAcc": 0.5},
        {"round": 0, "client": 1, "cAcc": 0.5, "iAcc": 1.0},
    ]
    rec = {"method": "fedavg", "seed": 0, "point": "", "audit": {"rlu": {"per_observation": rows}}}
    md = audit_markdown([rec, {**rec, "seed": 1}])
    assert "| fedavg | rlu | — | — | — | 4 | 75.0 ± 28.9 | 75.0 ± 28.9 | 0 |" in md  # an old record


def test_audit_rows_split_the_initial_and_the_trained_model() -> None:
    """Attacks that work on the initial model may fail on a trained one: one row each,
    with the threat model and the local steps."""
    rows = [
        {"round": 0, "client": 0, "cAcc": 1.0, "iAcc": 1.0, "global_model": "initial",
         "local_steps": 5},
        {"round": 3, "client": 0, "cAcc": 0.5, "iAcc": 0.25, "global_model": "trained",
         "local_steps": 5},
        {"round": 4, "client": 1, "cAcc": 0.5, "iAcc": 0.75, "global_model": "trained",
         "local_steps": 7},
    ]  # fmt: skip
    audit = {"per_observation": rows, "threat_model": "honest-but-curious server"}
    md = audit_markdown([{"method": "fedavg", "seed": 0, "audit": {"rlu": audit}}])
    server = "honest-but-curious server"
    assert f"| fedavg | rlu | {server} | initial | 5 | 1 | 100.0 ± 0.0 | 100.0 ± 0.0 | 0 |" in md
    assert f"| fedavg | rlu | {server} | trained | 5–7 | 2 | 50.0 ± 0.0 | 50.0 ± 35.4 | 0 |" in md
    assert AttackSpec("rlu", {}, "x").key == "x"


def test_an_observation_without_truth_is_a_failure_of_every_attack_with_its_place() -> None:
    """No recorded labels: each attack lists the observation as failed, with
    its round, client and the reason, and scores nothing."""
    from osfl.fl.observation import Observation
    from osfl.privacy.audit.scoring import score_observations

    obs = Observation(client_id=3, round=2, truth=None)
    aux = ImageSet(
        torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]), classes=("a", "b")
    )
    out = score_observations([obs], [AttackSpec("llg+"), AttackSpec("rlu", label="r")], aux)
    for key in ("llg+", "r"):
        assert out[key]["failed"] == [
            {"round": 2, "client": 3, "reason": "no ground truth recorded"}
        ]
        assert out[key]["per_observation"] == []
