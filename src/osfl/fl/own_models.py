"""The scoring of clients' own models (:class:`~osfl.fl.method.OwnModels`), in
one place: what a client scores, how the scores of a round's clients become
the record's metrics.

EFTViT (§3.3, "inference on each client"; :mod:`osfl.methods.eftvit.method`)
evaluates each client's own model, its private local module under the
broadcast global module, not the server's predictor. Every client scores the
predictor the method builds from the broadcast and its own state with the
job's evaluator (:func:`score_client_predictor`); the transports only carry
the call to where the states are (:func:`score_kept_states` for the
simulation's in-process clients, the osfl ClientApp's node-side handler under
Flower), so a client scores the same model with the same numbers under both.
:func:`own_model_metrics` puts the round's scores together beside the server
predictor's (:func:`merge_client_models`), the way the ``local`` floor reports
the mean of its clients' accuracies (:mod:`osfl.fl.evaluate`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from osfl.errors import ConfigError, DataError
from osfl.fl.context import ClientState
from osfl.fl.method import Method, OwnModels, capability
from osfl.fl.runtime.base import Evaluator
from osfl.fl.upload import Broadcast

log = logging.getLogger(__name__)

#: ``(metrics, failures)`` by client id.
ClientScores = tuple[dict[int, dict[str, Any]], dict[int, str]]


def score_client_predictor(
    method: Method,
    evaluator: Evaluator | None,
    *,
    client: int,
    payload: bytes,
    state: bytes | None = None,
) -> dict[str, Any]:
    """A client's score of its own model: the predictor the method builds
    from the broadcast ``payload`` and the client's ``state`` (``None``: never
    sampled, an empty state), scored by ``evaluator`` (the job's). Wherever
    the client's state lives (the simulation, a Flower node), this is the call."""
    own = capability(method, OwnModels)
    if own is None:
        raise ConfigError(f"{method.name} has no per-client models to score")
    if evaluator is None:
        raise ConfigError(f"client {client} has no test set to score its own model on")
    broadcast = Broadcast.from_bytes(payload, client=client)
    kept = ClientState.from_bytes(state, client=client) if state else ClientState()
    return dict(evaluator(own.client_predictor(broadcast, kept)))


def score_kept_states(
    method: Method,
    evaluator: Evaluator | None,
    states: Mapping[int, bytes | None],
    payload: bytes,
    clients: Sequence[int],
) -> ClientScores:
    """Each of ``clients`` scores its own model from its state in ``states``
    (the in-process clients'); the clients with no state yet have one and the
    same model, scored once."""
    scores: dict[int, dict[str, Any]] = {}
    fresh: dict[str, Any] | None = None
    for c in clients:
        state = states.get(c)
        if not state and fresh is not None:
            scores[c] = dict(fresh)
            continue
        scores[c] = score_client_predictor(
            method, evaluator, client=c, payload=payload, state=state
        )
        if not state:
            fresh = scores[c]
    return scores, {}


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def merge_client_models(
    server: Mapping[str, Any], scores: Mapping[int, Mapping[str, Any]], num_clients: int
) -> dict[str, Any]:
    """The metrics of a method whose clients keep models of their own
    (``OwnModels``), from the evaluator's metrics of the server's predictor
    (``server``) and of each client's own model (``scores``, by client id; a
    client missing from it did not score).

    As for the ``local`` floor, the accuracy keys are the clients': the mean
    over the clients that scored (``global_test_accuracy`` =
    ``mean_client_accuracy``; ``per_class_accuracy``, ``validation_accuracy``
    averaged the same way; ``local_test_accuracies``: client ``i``'s own model
    on its own label mix), ``client_accuracies`` by client id (null for one that
    did not score). The server predictor's are ``server_accuracy``,
    ``server_per_class_accuracy`` and, where measured,
    ``server_validation_accuracy`` and ``server_local_test_accuracy``."""
    clients = sorted(scores)
    if not clients:
        raise DataError("no client scored its own model")
    accs = {c: float(scores[c]["global_test_accuracy"]) for c in clients}
    mean = _mean(list(accs.values()))
    num_classes = len(server["per_class_accuracy"])
    per_class = [
        None
        if any(scores[c]["per_class_accuracy"][k] is None for c in clients)
        else _mean([scores[c]["per_class_accuracy"][k] for c in clients])
        for k in range(num_classes)
    ]
    out: dict[str, Any] = {
        "global_test_accuracy": mean,
        "per_class_accuracy": per_class,
        "num_samples": server["num_samples"],
        "mean_client_accuracy": mean,
        "client_accuracies": [accs.get(c) for c in range(num_clients)],
        "server_accuracy": server["global_test_accuracy"],
        "server_per_class_accuracy": list(server["per_class_accuracy"]),
    }
    if "validation_accuracy" in server:
        out["validation_accuracy"] = _mean([scores[c]["validation_accuracy"] for c in clients])
        out["server_validation_accuracy"] = server["validation_accuracy"]
    if "local_test_accuracies" in server:
        own = [float(scores[c]["local_test_accuracies"][c]) for c in clients]
        out["local_test_accuracies"] = own
        out["local_test_accuracy"] = _mean(own)
        out["server_local_test_accuracy"] = server["local_test_accuracy"]
    bad = sum(int(scores[c].get("nonfinite_outputs", 0)) for c in clients)
    if bad:
        out["nonfinite_outputs"] = bad
    warnings = [f"server predictor: {w}" for w in server.get("warnings", [])]
    warnings += [
        f"client {c}'s own model: {w}" for c in clients for w in scores[c].get("warnings", [])
    ]
    if warnings:
        out["warnings"] = warnings
    return out


def own_model_metrics(
    server: dict[str, Any],
    scores: Mapping[int, Mapping[str, Any]],
    failures: Mapping[int, str],
    *,
    num_clients: int,
    asked: set[int],
) -> dict[str, Any]:
    """A round's metrics from the server predictor's (``server``) and what
    the clients answered (``scores``, ``failures``): :func:`merge_client_models`,
    with ``clients_not_sampled`` (the clients not in ``asked``, i.e. no round
    so far sampled them, whose state is still empty) and a warning per client
    that did not score. When no client scored (real sites, whose nodes hold
    no test set of the server's), the server predictor's, saying so."""
    for c, why in failures.items():
        log.warning("client %d did not score its own model: %s", c, why)
    if not scores:
        return {
            **server,
            "server_accuracy": server["global_test_accuracy"],
            "warnings": [
                *server.get("warnings", []),
                "no client scored its own model, so the accuracy is the server "
                f"predictor's ({next(iter(failures.values()), 'no client')})",
            ],
        }
    out = merge_client_models(server, scores, num_clients)
    out["clients_not_sampled"] = [c for c in range(num_clients) if c not in asked]
    if failures:
        out["warnings"] = [
            *out.get("warnings", []),
            *(f"client {c} did not score its own model: {why}" for c, why in failures.items()),
        ]
    return out
