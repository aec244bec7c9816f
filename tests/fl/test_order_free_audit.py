"""Every privacy audit ignores the order of what the server received (issue
55): the label-recovery attacks (every one registered in
:data:`osfl.privacy.ATTACKS`) score a recorded run's observations — the real
broadcasts and uploads of a tiny SCAFFOLD run, its scheme history included,
read back from their safetensors files — bit for bit alike when every
observation's tensors are held in another order, and alike up to float
rounding when the observations come in another order of clients."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from osfl import assembly
from osfl.config import load_config
from osfl.data.sources import load_data
from osfl.fl.observation import Observation, load_observations
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.privacy import ATTACKS
from osfl.privacy.audit import AttackSpec, AuditRecorder, aux_set
from osfl.privacy.audit.scoring import score_observations
from support.smoke import one_torch_thread  # noqa: F401  (an autouse fixture)
from support.tiny import TINY_SCAFFOLD

#: a tiny recorded run: digits at 8 px, 3 clients, 2 rounds of SCAFFOLD
#: (a scheme with history, for RLU), plain SGD
RUN = [*TINY_SCAFFOLD, "train.epochs=1"]


#: RLU's Monte Carlo draws per class cut from 4,096 to 64 (seconds instead of
#: a minute); the other attacks with their defaults
FEWER_DRAWS = {"rlu": {"num_samples": 64}}


@pytest.fixture(scope="module")
def observations(tmp_path_factory) -> list[Observation]:
    """The run's observations, written by the audit recorder and read back."""
    cfg = load_config(None, RUN)
    job = assembly.build_job(
        cfg, "scaffold", assembly.seed_context(cfg, assembly.load_splits(cfg), 0)
    )
    root = tmp_path_factory.mktemp("observations")
    SimulationRuntime().execute(job, observers=[AuditRecorder(job.method, job.run, root)])
    return load_observations(root)


def _shuffled(d: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    keys = list(d)
    rng.shuffle(keys)
    return {k: d[k] for k in keys}


def _keys_shuffled(obs: Observation, rng: random.Random) -> Observation:
    return dataclasses.replace(
        obs,
        broadcast=_shuffled(obs.broadcast, rng),
        upload=_shuffled(obs.upload, rng),
        upload_meta=_shuffled(obs.upload_meta, rng),
        history=_shuffled(obs.history, rng),
    )


def _score(obs: list[Observation]) -> dict[str, dict[str, Any]]:
    """Every registered attack on ``obs``, without the wall-clock ``seconds``."""
    aux = aux_set(load_data("digits", image_size=8, max_per_class=12).test, 4)
    attacks = [AttackSpec(name, FEWER_DRAWS.get(name, {})) for name in ATTACKS.names()]
    out = score_observations(obs, attacks, aux)
    for rec in out.values():
        for row in rec["per_observation"]:
            row.pop("seconds")
    return out


def test_every_audit_ignores_the_order_of_keys_and_of_clients(observations) -> None:
    assert len(observations) == 6 and all(o.history or o.round == 0 for o in observations)
    want = _score(observations)
    assert set(want) == set(ATTACKS.names())
    assert any(rec["per_observation"] for rec in want.values())  # the attacks did score
    rng = random.Random(0)
    assert _score([_keys_shuffled(o, rng) for o in observations]) == want

    reversed_order = _score(list(reversed(observations)))
    for name, rec in want.items():
        got = reversed_order[name]
        key = lambda row: (row["round"], row["client"])  # noqa: E731
        assert sorted(got["per_observation"], key=key) == sorted(rec["per_observation"], key=key)
        assert sorted(got["failed"], key=key) == sorted(rec["failed"], key=key)
        for stat in ("cAcc", "iAcc"):
            if stat in rec:
                assert got[stat] == pytest.approx(rec[stat], rel=1e-12)
