"""Rounds and time to a target accuracy under a link model.

Multi-round methods for weak clients are compared by what it costs to reach
an accuracy, not only by where they end: EFTViT (Wu et al., "EFTViT:
Efficient Federated Training of Vision Transformers with Masked Images on
Resource-Constrained Clients", Table 2) reports rounds to a target and the
total training time, computation plus communication. A record's ``curve``
(``eval_every > 0``) carries, per evaluated round, the accuracies and the
cumulative bytes and compute seconds; here they become

- ``accuracy_key``: which accuracy of the curve the entry measures, the one a
  table ranks (:attr:`osfl.record.RunRecord.ranked_accuracy`): the server
  predictor's ``global_test_accuracy``, or ``mean_client_accuracy`` for a
  method without a server predictor (``local``); EFTViT's clients' own
  models, the paper's number, are the curve's ``mean_client_accuracy``;
- ``best_accuracy`` / ``best_round``: the best of that accuracy and its round;

- ``rounds_to_target``: the first evaluated round (1-based) whose accuracy
  reaches ``target_accuracy``, ``None`` when none does;
- ``time_to_target_s`` / ``total_time_s``: compute seconds plus the bytes sent
  both ways over one shared link of ``link_mbps`` megabit/s (the server's:
  every upload and download of a round passes through it).

The compute seconds are this machine's: the simulation trains a round's
clients one after another, so they are the sum over clients, where sites
training in parallel would take about the slowest one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["convergence", "link_seconds"]


def link_seconds(point: Mapping[str, Any], link_mbps: float) -> float:
    """Compute seconds plus transfer seconds of one cumulative curve point."""
    return float(point["seconds"]) + 8.0 * float(point["bytes"]) / (link_mbps * 1e6)


def _ranked_key(curve: Sequence[Mapping[str, Any]]) -> str:
    """The accuracy a curve is ranked by: the server predictor's where every
    point has it, else the clients' own models' mean."""
    if all(p.get("global_test_accuracy") is not None for p in curve):
        return "global_test_accuracy"
    return "mean_client_accuracy"


def convergence(
    curve: Sequence[Mapping[str, Any]], *, target_accuracy: float | None, link_mbps: float
) -> dict[str, Any] | None:
    """The record's ``convergence`` entry (see the module docstring), or ``None``
    when the curve has fewer than two points, lacks the cumulative costs or
    the accuracy it would measure."""
    if len(curve) < 2 or not all("seconds" in p and "bytes" in p for p in curve):
        return None
    key = _ranked_key(curve)
    if any(p.get(key) is None for p in curve):
        return None
    best = max(curve, key=lambda p: p[key])
    out: dict[str, Any] = {
        "link_mbps": link_mbps,
        "accuracy_key": key,
        "best_accuracy": best[key],
        "best_round": best["round"] + 1,
        "total_time_s": round(link_seconds(curve[-1], link_mbps), 3),
        "target_accuracy": target_accuracy,
        "rounds_to_target": None,
        "time_to_target_s": None,
    }
    if target_accuracy is not None:
        hit = next((p for p in curve if p[key] >= target_accuracy), None)
        if hit is not None:
            out["rounds_to_target"] = hit["round"] + 1
            out["time_to_target_s"] = round(link_seconds(hit, link_mbps), 3)
    return out
