"""How a server combines its clients' model states: FedAvg's weighted mean and
the Byzantine-robust rules a server can use instead (``server.aggregator``).

Each rule maps the round's states (and their data-size weights, and the
broadcast ``reference`` they started from) to one state, in float64, never
raising on states that passed validation:

- ``mean``: the weighted average (McMahan et al., "Communication-Efficient
  Learning of Deep Networks from Decentralized Data", AISTATS 2017, Alg. 1).
- ``median`` and ``trimmed_mean``: coordinate-wise median, and the mean of
  each coordinate after cutting the ⌈``trim_fraction``·n⌉ largest and smallest
  values (Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates", ICML 2018, Alg. 1, options I and II).
- ``krum`` and ``multi_krum``: the update closest to its n − f − 2 nearest
  neighbours, or the mean of the m best by that score (Blanchard et al.,
  "Machine Learning with Adversaries: Byzantine Tolerant Gradient Descent",
  NeurIPS 2017, §4). Its guarantee needs n > 2f + 2; the rule always runs on
  the uploads that arrived, with f capped to the most those survivors allow
  (logged), never switched for another rule: a refused upload must not
  change what the server does with the rest.
- ``norm_clip``: each update (state − reference) clipped to L2 norm τ
  (``clip_norm``; default the round's median update norm), then the weighted
  mean (Sun et al., "Can You Really Backdoor Federated Learning?", 2019, §4).
- ``centered_clip``: centered clipping (Karimireddy, He, Jaggi, "Learning
  from History for Byzantine Robust Optimization", ICML 2021, Alg. 2), a rule
  built for heterogeneous (non-IID) clients: from the broadcast ``v`` (the
  role of their momentum), ``v ← v + (1/n) Σ_i (x_i − v) min(1, τ/‖x_i − v‖)``
  until it stops moving (relative change below 1e-6) or ``cc_iterations``
  times; τ = ``clip_norm``, or the median of the clients' initial distances
  ‖x_i − v₀‖. As in the paper each client counts 1/n, whatever its data size:
  a poisoned client moves the centre by at most τ/n per step.
- ``dnc``: Divide-and-Conquer (Shejwalkar, Houmansadr, "Manipulating the
  Byzantine: Optimizing Model Poisoning Attacks and Defenses for Federated
  Learning", NDSS 2021, Alg. 2), a spectral filter meant to keep working
  where clients differ: ``niters`` = 5 times, on ``b`` = 10,000 randomly
  chosen coordinates of the updates, score each client by its squared
  projection on the top singular vector of the centred updates and keep the
  n − c·f lowest (c = 1, f = ``byzantine``); the clients kept every time are
  averaged (weighted by data size, like Multi-Krum). As in the paper the
  coordinates are drawn afresh every round, so that no client can plan its
  poison around them: from the round's draw seed (:func:`draw_seed`: the run
  seed and the round in a simulation, so a re-run gives the same model; on
  real sites also the server's own per-run secret, which no message carries,
  so no client can know the draw). If no client is kept every time, the n − f
  with the lowest summed score are (the paper does not say; logged).

The result never depends on the order of anything the server received: the
states are combined in the order of their clients' ids (``clients``; their
positions when not given), so a tie (two equal Krum or DnC scores) goes to
the lower id; and every state's tensors are flattened in the sorted order of
their names, whatever order a decoded upload's dict holds them in.

Integer buffers (BatchNorm's ``num_batches_tracked``) always take the
weighted mean, rounded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from osfl.fl.seeds import derive_seed
from osfl.registry import Registry

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]


class RuleParams(Protocol):
    """The knobs of the robust rules (``ServerConfig`` has them)."""

    trim_fraction: float
    byzantine: int
    krum_select: int | None
    clip_norm: float | None
    cc_iterations: int


#: ``(states, weights, reference, params, seed) -> state``: the states in their
#: clients' order, normalised weights, the broadcast they started from, the
#: server's knobs and the round's draw seed (:func:`draw_seed`; only a rule
#: that samples reads it).
Aggregator = Callable[
    [
        Sequence[Mapping[str, torch.Tensor]],
        np.ndarray,
        Mapping[str, torch.Tensor] | None,
        RuleParams,
        int,
    ],
    StateDict,
]
AGGREGATORS: Registry[Aggregator] = Registry("aggregator")


def draw_seed(run_seed: int, round: int, secret: str | None = None) -> int:
    """The seed of round ``round``'s random draws by the server's rule (DnC's
    coordinates): a function of the run seed and the round, so a simulated
    round re-runs to the same model and every round draws afresh; and, on
    real sites, of ``secret``, the server's own per-run random secret
    (:attr:`osfl.fl.context.RunContext.server_secret`), which no message
    carries, so that no client, though it knows the seed and the round, can
    know the draw."""
    return derive_seed("server-draw", run_seed, round, secret)


def _normalised(weights: Sequence[float]) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    total = w.sum()
    if not (np.isfinite(total) and total > 0):  # degenerate weights: uniform
        return np.full(len(w), 1.0 / len(w))
    return w / total


def weighted_mean(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> StateDict:
    """The weighted average, buffers included, accumulated in float64 so that
    averaging identical models returns them bit for bit (one model with
    weight 1 is returned exactly); integer buffers take the rounded mean.
    Its keys come out sorted, whatever order the states' dicts hold them in."""
    if not states:
        raise ValueError("weighted_mean needs at least one state")
    w = _normalised(weights)
    out: StateDict = {}
    for name in sorted(states[0]):
        ref = states[0][name]
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for wi, st in zip(w, states, strict=True):
            acc += float(wi) * st[name].to(torch.float64)
        out[name] = acc.round().to(ref.dtype) if not ref.is_floating_point() else acc.to(ref.dtype)
    return out


def _per_coordinate(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: np.ndarray,
    combine: Callable[[torch.Tensor], torch.Tensor],
) -> StateDict:
    """``combine`` over the client axis of every float tensor; integer buffers
    by the weighted mean."""
    means = weighted_mean(states, weights)
    out: StateDict = {}
    for name in sorted(states[0]):
        ref = states[0][name]
        if not ref.is_floating_point():
            out[name] = means[name]
            continue
        stack = torch.stack([s[name].to(torch.float64) for s in states])
        out[name] = combine(stack).to(ref.dtype)
    return out


@AGGREGATORS.register("mean")
def _mean(states, weights, reference, params, seed) -> StateDict:
    return weighted_mean(states, weights)


@AGGREGATORS.register("median")
def _median(states, weights, reference, params, seed) -> StateDict:
    # the mean of the two middle values for an even count (torch.median takes the lower)
    return _per_coordinate(states, weights, lambda x: x.quantile(0.5, dim=0))


@AGGREGATORS.register("trimmed_mean")
def _trimmed_mean(states, weights, reference, params, seed) -> StateDict:
    n = len(states)
    # ceil: any positive fraction cuts at least one value at each end
    cut = min(math.ceil(params.trim_fraction * n), (n - 1) // 2)

    def trimmed(x: torch.Tensor) -> torch.Tensor:
        ordered, _ = x.sort(dim=0)
        return ordered[cut : n - cut].mean(dim=0)

    return _per_coordinate(states, weights, trimmed)


def _updates(
    states: Sequence[Mapping[str, torch.Tensor]], reference: Mapping[str, torch.Tensor] | None
) -> tuple[list[str], torch.Tensor]:
    """(float keys, n × d matrix of the flattened updates state − reference),
    the keys in sorted order: a coordinate's column never depends on the
    order a decoded upload's dict holds its tensors in."""
    keys = sorted(k for k, v in states[0].items() if v.is_floating_point())
    rows = []
    for s in states:
        parts = [
            (
                s[k].to(torch.float64) - (reference[k].to(torch.float64) if reference else 0)
            ).flatten()
            for k in keys
        ]
        rows.append(torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64))
    return keys, torch.stack(rows)


def krum_scores(updates: torch.Tensor, f: int) -> torch.Tensor:
    """Each update's summed squared distance to its n − f − 2 nearest others."""
    n = updates.shape[0]
    dist = torch.cdist(updates, updates).pow(2)
    k = max(1, n - f - 2)
    nearest, _ = dist.sort(dim=1)
    return nearest[:, 1 : k + 1].sum(dim=1)  # column 0 is the distance to itself


def krum_tolerance(n: int, f: int) -> int:
    """The Byzantine count Krum assumes among ``n`` uploads: ``f``, capped to
    the largest value with n > 2f + 2 (its guarantee's condition), logged
    when capped."""
    most = max(0, (n - 3) // 2)
    if f > most:
        log.warning(
            "krum: %d upload(s) in the round allow at most f=%d Byzantine (n > 2f + 2); "
            "scoring with f=%d instead of server.byzantine=%d",
            n,
            most,
            most,
            f,
        )
    return min(f, most)


def _krum_select(states, weights, reference, f: int, m: int) -> StateDict:
    _, updates = _updates(states, reference)
    # a stable sort: equal scores keep the clients' order (the lower id wins a tie)
    chosen = torch.argsort(krum_scores(updates, f), stable=True)[:m].tolist()
    log.debug("krum: kept clients at positions %s of %d", chosen, len(states))
    return weighted_mean([states[i] for i in chosen], [weights[i] for i in chosen])


@AGGREGATORS.register("krum")
def _krum(states, weights, reference, params, seed) -> StateDict:
    f = krum_tolerance(len(states), params.byzantine)
    return _krum_select(states, weights, reference, f, 1)


@AGGREGATORS.register("multi_krum")
def _multi_krum(states, weights, reference, params, seed) -> StateDict:
    n = len(states)
    f = krum_tolerance(n, params.byzantine)
    m = min(n, params.krum_select) if params.krum_select else max(1, n - f)
    return _krum_select(states, weights, reference, f, m)


@AGGREGATORS.register("norm_clip")
def _norm_clip(states, weights, reference, params, seed) -> StateDict:
    if reference is None:  # no broadcast to measure updates against: plain mean
        return weighted_mean(states, weights)
    keys, updates = _updates(states, reference)
    norms = updates.norm(dim=1)
    tau = params.clip_norm if params.clip_norm is not None else float(norms.median())
    scale = torch.clamp(tau / norms.clamp(min=1e-12), max=1.0)
    clipped = []
    for s, k in zip(states, scale.tolist(), strict=True):
        c = dict(s)
        for name in keys:
            ref = reference[name].to(torch.float64)
            c[name] = (ref + k * (s[name].to(torch.float64) - ref)).to(s[name].dtype)
        clipped.append(c)
    return weighted_mean(clipped, weights)


@AGGREGATORS.register("centered_clip")
def _centered_clip(states, weights, reference, params, seed) -> StateDict:
    if reference is None:  # no broadcast to centre on: the median is the start
        reference = _median(states, weights, None, params, seed)
    keys, updates = _updates(states, reference)
    n = updates.shape[0]
    first = updates.norm(dim=1)
    tau = params.clip_norm if params.clip_norm is not None else float(first.median())
    center = torch.zeros(updates.shape[1], dtype=torch.float64)
    for _ in range(params.cc_iterations):
        diff = updates - center
        norms = diff.norm(dim=1, keepdim=True).clamp(min=1e-12)
        step = (diff * torch.clamp(tau / norms, max=1.0)).sum(dim=0) / n
        center = center + step
        if float(step.norm()) <= 1e-6 * max(float(center.norm()), 1e-12):
            break
    out = weighted_mean(states, weights)  # integer buffers: the weighted mean, rounded
    offset = 0
    for name in keys:
        ref = reference[name].to(torch.float64)
        part = center[offset : offset + ref.numel()].reshape(ref.shape)
        out[name] = (ref + part).to(states[0][name].dtype)
        offset += ref.numel()
    return out


#: Divide-and-Conquer's defaults (NDSS 2021, §VI-B): iterations, subsampled
#: coordinates per iteration, and the filtering fraction c.
DNC_ITERATIONS, DNC_SUBSAMPLE, DNC_FILTER = 5, 10_000, 1.0


def dnc_scores(updates: torch.Tensor, dims: torch.Tensor | slice) -> torch.Tensor:
    """Each client's outlier score on coordinates ``dims``: the squared
    projection of its centred update on the centred updates' top right
    singular vector (NDSS 2021, Alg. 2, lines 4-7)."""
    sub = updates[:, dims]
    centred = sub - sub.mean(dim=0)
    top = torch.linalg.svd(centred, full_matrices=False).Vh[0]
    return (centred @ top).pow(2)


def dnc_select(scores: Sequence[torch.Tensor], keep: int) -> list[int]:
    """The positions among the ``keep`` lowest scores of every iteration (an
    intersection); when none is, the ``keep`` lowest summed scores (logged).
    Equal scores go to the lower position (a stable sort)."""
    kept: set[int] | None = None
    for s in scores:
        good = set(torch.argsort(s, stable=True)[:keep].tolist())
        kept = good if kept is None else kept & good
    if not kept:
        log.warning(
            "dnc: no client kept in all %d iterations; keeping the %d lowest summed scores",
            len(scores),
            keep,
        )
        kept = set(torch.argsort(torch.stack(list(scores)).sum(dim=0), stable=True)[:keep].tolist())
    return sorted(kept)


def dnc_draws(
    d: int, *, iterations: int = DNC_ITERATIONS, subsample: int = DNC_SUBSAMPLE, seed: int = 0
) -> list[torch.Tensor | slice]:
    """The coordinates each of DnC's ``iterations`` scores: ``subsample`` of
    the ``d`` drawn without replacement from ``seed`` (all of them when d is
    not larger)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randperm(d, generator=gen)[:subsample] if d > subsample else slice(None)
        for _ in range(iterations)
    ]


def dnc_keep(
    updates: torch.Tensor,
    f: int,
    *,
    iterations: int = DNC_ITERATIONS,
    subsample: int = DNC_SUBSAMPLE,
    seed: int = 0,
) -> list[int]:
    """The positions Divide-and-Conquer keeps of ``updates`` (n × d): it scores
    the :func:`dnc_draws` of ``seed`` (the round's :func:`draw_seed` in a run)
    and keeps n − c·f clients (at least one). With no float coordinate
    (d = 0) there is no direction to be an outlier along: every client is
    kept, as every other rule averages them all."""
    n, d = updates.shape
    if d == 0:
        return list(range(n))
    keep = max(1, n - math.floor(DNC_FILTER * f))
    draws = dnc_draws(d, iterations=iterations, subsample=subsample, seed=seed)
    return dnc_select([dnc_scores(updates, dims) for dims in draws], keep)


@AGGREGATORS.register("dnc")
def _dnc(states, weights, reference, params, seed) -> StateDict:
    _, updates = _updates(states, reference)
    chosen = dnc_keep(updates, params.byzantine, seed=seed)
    log.debug("dnc: kept clients at positions %s of %d", chosen, len(states))
    return weighted_mean([states[i] for i in chosen], [weights[i] for i in chosen])


def aggregate_states(
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    params: RuleParams,
    *,
    rule: str = "mean",
    reference: Mapping[str, torch.Tensor] | None = None,
    clients: Sequence[int] | None = None,
    seed: int = 0,
) -> StateDict:
    """Combine ``states`` with the registered ``rule`` and its ``params`` (a
    :class:`~osfl.fl.server_config.ServerConfig`; see the module docstring).

    ``clients``: the states' client ids; the rule sees the states sorted by
    them, so the result is the same, bit for bit, whatever order the uploads
    arrived in, and a tie goes to the lower id (default: the positions are
    the ids). ``seed``: the round's draw seed (:func:`draw_seed`), for a rule
    that samples."""
    if not states:
        raise ValueError("aggregate_states needs at least one state")
    if clients is not None:
        if len(clients) != len(states) or len(set(clients)) != len(clients):
            raise ValueError("aggregate_states needs one distinct client id per state")
        order = sorted(range(len(states)), key=lambda i: clients[i])
        states = [states[i] for i in order]
        weights = [weights[i] for i in order]
    return AGGREGATORS.get(rule)(states, _normalised(weights), reference, params, seed)
