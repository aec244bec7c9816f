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
predictor's (:func:`merge_client_models`): the server predictor's numbers keep
the evaluator's names, the clients' have names of their own
(:data:`CLIENT_NAMES`), as the ``local`` floor's do (:func:`clients_only`).
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


#: The evaluator's names of a client's numbers -> the names of the clients'
#: mean (and list) beside the server predictor's, which keep the plain names
#: (docs/run-directory.md: one name per number).
CLIENT_NAMES = {
    "global_test_accuracy": "mean_client_accuracy",
    "per_class_accuracy": "mean_client_per_class_accuracy",
    "validation_accuracy": "mean_client_validation_accuracy",
    "local_test_accuracy": "mean_client_local_test_accuracy",
    "local_test_accuracies": "client_local_test_accuracies",
    "nonfinite_outputs": "client_nonfinite_outputs",
}


def _per_class_mean(scores: Mapping[int, Mapping[str, Any]], clients: list[int], k: int) -> list:
    """Each class's accuracy averaged over ``clients`` (``None`` where one lacks it)."""
    return [
        None
        if any(scores[c]["per_class_accuracy"][i] is None for c in clients)
        else _mean([scores[c]["per_class_accuracy"][i] for c in clients])
        for i in range(k)
    ]


def _client_warnings(server: Mapping[str, Any], scores: Mapping[int, Mapping[str, Any]]) -> list:
    """The server predictor's evaluation warnings, then each client's, named."""
    warnings = [f"server predictor: {w}" for w in server.get("warnings", [])]
    return warnings + [
        f"client {c}'s own model: {w}"
        for c in sorted(scores)
        for w in scores[c].get("warnings", [])
    ]


def merge_client_models(
    server: Mapping[str, Any], scores: Mapping[int, Mapping[str, Any]], num_clients: int
) -> dict[str, Any]:
    """The metrics of a method whose clients keep models of their own
    (``OwnModels``), from the evaluator's metrics of the server's predictor
    (``server``) and of each client's own model (``scores``, by client id; a
    client missing from it did not score).

    The server predictor's numbers keep the evaluator's names
    (``global_test_accuracy``, ``per_class_accuracy``, ``validation_accuracy``,
    ``local_test_accuracy``): one name, one meaning, in every method's round
    events, curve and record. The clients' are beside them under their own
    names (:data:`CLIENT_NAMES`): the mean over the clients that scored
    (``mean_client_accuracy``, ``mean_client_per_class_accuracy``,
    ``mean_client_validation_accuracy``; ``client_local_test_accuracies``:
    client ``i``'s own model on its own label mix, and their mean), and
    ``client_accuracies`` by client id (null for one that did not score)."""
    clients = sorted(scores)
    if not clients:
        raise DataError("no client scored its own model")
    accs = {c: float(scores[c]["global_test_accuracy"]) for c in clients}
    out: dict[str, Any] = {k: v for k, v in server.items() if k != "warnings"}
    out["mean_client_accuracy"] = _mean(list(accs.values()))
    out["client_accuracies"] = [accs.get(c) for c in range(num_clients)]
    k = len(server["per_class_accuracy"])
    out["mean_client_per_class_accuracy"] = _per_class_mean(scores, clients, k)
    if "validation_accuracy" in server:
        out["mean_client_validation_accuracy"] = _mean(
            [scores[c]["validation_accuracy"] for c in clients]
        )
    if "local_test_accuracies" in server:
        own = [float(scores[c]["local_test_accuracies"][c]) for c in clients]
        out["client_local_test_accuracies"] = own
        out["mean_client_local_test_accuracy"] = _mean(own)
    bad = sum(int(scores[c].get("nonfinite_outputs", 0)) for c in clients)
    if bad:  # the server predictor's count keeps its name, ``nonfinite_outputs``
        out["client_nonfinite_outputs"] = bad
    warnings = _client_warnings(server, scores)
    if warnings:
        out["warnings"] = warnings
    return out


def clients_only(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluator's metrics of a predictor that is only the clients' own
    models (``local``'s ``PerClientPredictor``: no server predictor) under the
    clients' names (:data:`CLIENT_NAMES`), ``global_test_accuracy`` null: the
    evaluator's accuracy of such a predictor is the clients' mean, which is
    ``mean_client_accuracy``, never the server's name."""
    out: dict[str, Any] = {"global_test_accuracy": None}
    for k, v in metrics.items():
        if k == "global_test_accuracy":
            continue
        out[CLIENT_NAMES.get(k, k)] = v
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
