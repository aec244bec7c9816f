"""Scoring label-recovery attacks on recorded Observations against their truth
with cAcc/iAcc (Chen & Vikalo, ICML 2024, Appendix B.4)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from osfl.errors import OsflError
from osfl.fl.observation import Observation
from osfl.privacy import ATTACKS, resolve_inputs, run_attack
from osfl.privacy.audit.spec import AttackSpec

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet

log = logging.getLogger(__name__)


def aux_set(test: ImageSet, per_class: int, seed: int = 0) -> ImageSet:
    """``per_class`` images of each class of ``test`` (all of a smaller class), seeded."""
    y = test.labels.numpy()
    rng = np.random.default_rng(seed)
    idx = [rng.permutation(np.flatnonzero(y == c))[:per_class] for c in range(test.num_classes)]
    short = [c for c, i in enumerate(idx) if len(i) < per_class]
    if short:
        log.info("auxiliary set: classes %s have fewer than %d test images", short, per_class)
    return test.subset(np.sort(np.concatenate(idx)))


def stats(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


def score_observations(
    observations: Sequence[Observation],
    attacks: Sequence[AttackSpec],
    aux: ImageSet,
    *,
    transform: Any = None,
    device: torch.device | str = "cpu",
) -> dict[str, dict[str, Any]]:
    """Every attack on every observation with truth; per attack ``{"cAcc",
    "cAcc_std", "iAcc", "iAcc_std", "n", "per_observation", ...}`` (mean ±
    sample std over the observations). An observation an attack cannot use is
    logged and counted in ``failed`` with its reason; the others go on."""
    out: dict[str, dict[str, Any]] = {
        a.key: {
            "attack": a.name,
            "threat_model": ATTACKS.get(a.name).threat_model,
            "options": dict(a.options),
            "per_observation": [],
            "failed": [],
        }
        for a in attacks
    }
    for obs in observations:
        labels = (obs.truth or {}).get("labels")
        if labels is None:
            for a in attacks:
                out[a.key]["failed"].append(_fail(obs, "no ground truth recorded"))
            continue
        try:
            inputs = resolve_inputs(obs)
        except OsflError as e:
            for a in attacks:
                out[a.key]["failed"].append(_fail(obs, str(e)))
            log.warning("audit: %s", e)
            continue
        for a in attacks:
            t = time.perf_counter()
            try:
                res = run_attack(
                    a.name, inputs, aux, transform=transform, device=device, **dict(a.options)
                )
                scores = res.score(torch.as_tensor(labels))
            except OsflError as e:
                out[a.key]["failed"].append(_fail(obs, str(e)))
                log.warning("audit %s: %s", a.key, e)
                continue
            out[a.key]["per_observation"].append(
                {
                    "round": obs.round,
                    "client": obs.client_id,
                    # the setting: attacks that work on the initial model may fail on a
                    # trained one and after many local steps (report both rows)
                    "global_model": global_model_state(obs.round),
                    "local_steps": inputs.train.steps,
                    **scores,
                    "labels": int(torch.as_tensor(labels).numel()),
                    "seconds": round(time.perf_counter() - t, 4),
                }
            )
    for rec in out.values():
        rows = rec["per_observation"]
        rec["n"] = len(rows)
        if rows:
            rec["cAcc"], rec["cAcc_std"] = stats([r["cAcc"] for r in rows])
            rec["iAcc"], rec["iAcc_std"] = stats([r["iAcc"] for r in rows])
    return out


def global_model_state(round: int) -> str:
    """``initial`` for round 0 (the model every client starts from: random, or
    the pretrained weights), ``trained`` after a round of FL."""
    return "initial" if round == 0 else "trained"


def _fail(obs: Observation, why: str) -> dict[str, Any]:
    return {"round": obs.round, "client": obs.client_id, "reason": why}
