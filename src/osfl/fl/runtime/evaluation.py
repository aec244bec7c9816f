"""The round loop's evaluation (docs/design.md §1): what a round's metrics
are, out of :class:`~osfl.fl.runtime.rounds.RoundLoop`, whose one call is
:meth:`RoundEvaluation.metrics` (or :meth:`RoundEvaluation.at_sites` when the
sites hold the test data).

The server scores its predictor with the job's evaluator. For a method whose
clients keep models of their own (:class:`~osfl.fl.method.OwnModels`), every
client also scores the predictor the method builds from the broadcast it
would receive next and its own state, wherever that state lives: the
transport carries the call (:class:`Scoring`) and
:mod:`osfl.fl.own_models` does the scoring and the merging, once for every
transport.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping, Sequence
from typing import Any, Protocol

from osfl.errors import UploadError
from osfl.fl.method import OwnModels, PerClientPredictor, capability, release_for_sites
from osfl.fl.own_models import ClientScores, clients_only, own_model_metrics
from osfl.fl.runtime.base import Job, RoundRecord
from osfl.fl.runtime.sites import SiteScore, merge_site_scores
from osfl.fl.state_codec import state_to_bytes

log = logging.getLogger(__name__)


class Scoring(Protocol):
    """What the evaluation asks of a transport (part of
    :class:`~osfl.fl.runtime.rounds.Transport`): carry a payload to the
    clients, where their data and states are, and bring back their scores."""

    def evaluate(
        self, payload: bytes, clients: list[int]
    ) -> tuple[dict[int, SiteScore], dict[int, str]]:
        """Have ``clients`` score the released final state (``payload``) on
        their own test sets: ``(scores, failures)`` by client."""
        ...

    def score_client_models(self, payload: bytes, clients: list[int]) -> ClientScores:
        """Have ``clients`` score the predictor the method builds from the
        broadcast ``payload`` and each one's own state, with the job's evaluator
        (:func:`~osfl.fl.own_models.score_client_predictor`, wherever the
        state lives): ``(metrics, failures)`` by client."""
        ...


class RoundEvaluation:
    """One job's evaluations over ``transport``; the seconds they take go to
    ``times["eval"]``."""

    def __init__(self, job: Job, transport: Scoring, times: MutableMapping[str, float]):
        self.job, self.method, self.transport, self.times = job, job.method, transport, times

    def due(self, r: int) -> bool:
        """Whether the server's predictor is scored after round ``r``, before
        the last (every ``eval_every`` rounds, when the job has an evaluator;
        the last round is always scored)."""
        every = self.job.eval_every
        return every > 0 and (r + 1) % every == 0 and self.job.evaluator is not None

    def metrics(
        self, state: Any, predictor: Any, r: int, records: Sequence[RoundRecord]
    ) -> dict[str, Any]:
        """The evaluator's metrics of ``predictor``, the server's after round
        ``r``, under the names every record uses (docs/run-directory.md): for
        a method whose clients keep their own models, the clients' numbers
        beside the server predictor's
        (:func:`~osfl.fl.own_models.own_model_metrics`); for a predictor that
        is only the clients' models (``local``), the clients' names and a null
        ``global_test_accuracy`` (:func:`~osfl.fl.own_models.clients_only`)."""
        evaluator = self.job.evaluator
        if evaluator is None:
            return {}
        t = time.perf_counter()
        out = dict(evaluator(predictor))
        if isinstance(predictor, PerClientPredictor):  # `local`: no server predictor
            out = clients_only(out)
        elif capability(self.method, OwnModels) is not None:
            # what every client would receive next: the broadcast of round r + 1
            payload = self.method.broadcast(state, r + 1).to_bytes()
            clients = list(range(self.job.num_clients))
            scores, failures = self.transport.score_client_models(payload, clients)
            out = own_model_metrics(
                out,
                scores,
                failures,
                num_clients=len(clients),
                asked={c for rec in records for c in rec.clients},
            )
        self.times["eval"] += time.perf_counter() - t
        return out

    def at_sites(self, state: Any) -> dict[str, Any]:
        """The sites score the method's released final state on their own test
        sets; the server adds up their counts (it holds no test set)."""
        t = time.perf_counter()
        payload = state_to_bytes(release_for_sites(self.method, state))
        clients = list(range(self.job.num_clients))
        scores, failures = self.transport.evaluate(payload, clients)
        for c, why in failures.items():
            log.warning("site %d did not evaluate the final model: %s", c, why)
        if not scores:
            raise UploadError(f"no site evaluated the final model ({'; '.join(failures.values())})")
        out = merge_site_scores(scores, self.job.run.num_classes)
        out["bytes_down_evaluation"] = len(payload) * len(clients)
        out["warnings"] = [
            *out.get("warnings", []),
            *(f"site {c} did not evaluate the final model: {why}" for c, why in failures.items()),
        ]
        if capability(self.method, OwnModels) is not None:
            out["warnings"].append(
                "the sites scored the server's released model only, not their own models"
            )
        self.times["eval"] += time.perf_counter() - t
        return out
