"""The client side shared by the model-upload baselines (one-shot FedAvg,
Ensemble, Local and every one-shot method that starts from the same locally
trained clients: FedDF, DENSE, Co-Boosting, DeepInversion, FedMITR).

All of them train each client once from the *same* initial weights — a
function of the run seed that the server broadcasts in round 0 — through the
content-keyed client cache (docs/design.md §2), so a comparison of many one-shot
methods trains every client exactly once. :func:`trained_client` is that
shared step; use it (not a private copy) so that cache keys agree.

Aggregation helpers follow McMahan et al., "Communication-Efficient Learning
of Deep Networks from Decentralized Data" (AISTATS 2017): parameters averaged
with weights proportional to the clients' sample counts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.errors import UploadError
from osfl.fl.aggregators import aggregate_states, draw_seed, weighted_mean
from osfl.fl.client_training import train_client
from osfl.fl.context import ClientContext, RunContext, SharedTraining
from osfl.fl.method import Method, MethodCard, Predictor, Screening, SharedTrainingStep
from osfl.fl.seeds import derive_seed
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import init_model
from osfl.fl.upload import NUM_SAMPLES, Broadcast, Upload, UploadSpec, spec_from_state_dict
from osfl.registry import Registry

log = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]


def initial_state(run: RunContext) -> StateDict:
    """The global model's initial weights (:func:`osfl.fl.training.init_model`:
    seeded by the run seed only), so every method of a run and every runtime
    starts its clients from the same point. Built on the server, in one
    thread: the clients receive it in the broadcast and never touch the global
    torch RNG (which is what makes thread-parallel clients deterministic)."""
    return cpu_state(init_model(run))


def model_from_state(run: RunContext, state: Mapping[str, torch.Tensor]) -> nn.Module:
    """A fresh model of the run's architecture holding ``state`` (exact copy)."""
    model = run.model.build(run.num_classes)
    model.load_state_dict(dict(state), strict=True)
    return model


def cpu_state(model: nn.Module) -> StateDict:
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def trained_client(
    ctx: ClientContext,
    data: ImageSet,
    init: Mapping[str, torch.Tensor],
    cfg: TrainConfig | None = None,
) -> nn.Module:
    """The client's model trained with ``ctx.run.train`` from ``init``, via the cache.

    The cache key (data fingerprint, model, train config, seed, client id and
    the hash of ``init``) is the same for every method that calls this, which
    is what lets Ensemble reuse the clients one-shot FedAvg trained.
    """
    return train_client(ctx, data, model=model_from_state(ctx.run, init), cfg=cfg)


def model_upload(model: nn.Module, num_samples: int) -> Upload:
    """A state-dict upload carrying the client's sample count (for weighting)."""
    return Upload(tensors=cpu_state(model), meta={"num_samples": int(num_samples)})


def model_upload_spec(reference: Mapping[str, torch.Tensor]) -> UploadSpec:
    """Exactly the reference state dict's keys, shapes and dtypes + ``num_samples``."""
    spec = spec_from_state_dict(reference)
    return UploadSpec(tensors=spec.tensors, meta={"num_samples": NUM_SAMPLES})


def state_broadcast(state: Mapping[str, torch.Tensor]) -> Broadcast:
    return Broadcast(tensors=dict(state))


# --------------------------------------------------------------------------- weighting
WEIGHTINGS: Registry[Callable[[Sequence[int]], np.ndarray]] = Registry("client weighting")
WEIGHTINGS.add("data_size", lambda n: np.asarray(n, dtype=np.float64) / float(sum(n)))
WEIGHTINGS.add("uniform", lambda n: np.full(len(n), 1.0 / len(n)))


def sample_counts(uploads: Mapping[int, Upload]) -> dict[int, int]:
    """``meta.num_samples`` of each upload; a client whose count is not a
    positive integer is left out (logged), as a refused upload would be."""
    counts: dict[int, int] = {}
    for c, up in uploads.items():
        n = up.meta.get("num_samples")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            counts[c] = n
        else:
            log.warning("client %s: meta.num_samples=%r is not a positive integer; dropped", c, n)
    if not counts:
        raise UploadError("no upload carries a valid meta.num_samples", field="meta.num_samples")
    return counts


def average_states(
    states: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> StateDict:
    """Weighted parameter average (FedAvg), buffers included
    (:func:`osfl.fl.aggregators.weighted_mean`)."""
    return weighted_mean(states, weights)


def combine_states(
    run: RunContext,
    states: Sequence[Mapping[str, torch.Tensor]],
    weights: Sequence[float],
    reference: Mapping[str, torch.Tensor] | None,
    *,
    round: int,
) -> StateDict:
    """The clients' states (in client order) combined with the server's rule
    (``server.aggregator``: the weighted mean, or a Byzantine-robust rule;
    ``reference`` is the state they started from). A rule that samples (DnC)
    draws from round ``round``'s seed (:func:`~osfl.fl.aggregators.draw_seed`:
    the run seed, the round and, on real sites, the server's secret)."""
    server = run.server
    seed = draw_seed(run.seed, round, run.server_secret)
    return aggregate_states(
        states, weights, server, rule=server.aggregator, reference=reference, seed=seed
    )


class ModelPredictor(Predictor):
    """A single model as a predictor (logits)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def public_fl_hparams(name: str, config: Any) -> dict[str, Any]:
    """The FL scheme a server announces (part of an Observation's hparams)."""
    return {"scheme": name, **(asdict(config) if is_dataclass(config) else {})}


def probe_batch(run: RunContext, n: int = 8) -> torch.Tensor:
    """``n`` seeded random images through the run's evaluation transform: what
    the server feeds a member to see whether its outputs are finite (it holds
    no data of its own)."""
    gen = torch.Generator().manual_seed(derive_seed(run.seed, "probe-batch"))
    images = torch.randint(0, 256, (n, *run.image_shape), generator=gen, dtype=torch.uint8)
    return run.eval_transform(images) if run.eval_transform is not None else images.float() / 255


def update_norm_problem(
    state: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor], bound: float | None
) -> str | None:
    """Why a client's weights are too far from ``base`` (the broadcast): the
    L2 norm of the update over the float tensors both hold exceeds ``bound``
    (``server.max_update_norm``; ``None``: no bound). The classic defence
    against a boosted update (Sun et al., "Can You Really Backdoor Federated
    Learning?", 2019: norm bounding)."""
    if bound is None:
        return None
    sq = sum(
        float((v.double() - base[k].double()).pow(2).sum())
        for k, v in state.items()
        if v.is_floating_point() and k in base
    )
    if not math.isfinite(sq) or math.sqrt(sq) > bound:
        return f"update norm {math.sqrt(sq):.4g} exceeds server.max_update_norm {bound}"
    return None


def member_problem(
    run: RunContext,
    state: Mapping[str, torch.Tensor],
    init: Mapping[str, torch.Tensor],
    build: Callable[[Mapping[str, torch.Tensor]], nn.Module] | None = None,
) -> str | None:
    """Why ``state`` (a client's model) must not join the members, under the
    run's ``server.member_filter`` (``None``: keep it). ``build``: the module
    ``state`` loads into (default: the run's model); its outputs on the
    probe batch must be finite."""
    rule = run.server.member_filter
    if rule == "none":
        return None
    if rule == "finite_norm":
        why = update_norm_problem(state, init, run.server.max_update_norm)
        if why is not None:
            return why
    model = (build(state) if build is not None else model_from_state(run, state)).eval()
    with torch.no_grad():
        out = model(probe_batch(run))
    if not bool(torch.isfinite(out).all()):
        return "member outputs are not finite on the server's probe batch"
    return None


class ClientModelsMethod(Method, Screening, SharedTrainingStep):
    """One-shot: broadcast the common initial weights, each client uploads its
    locally trained model (via the shared cache), the server keeps them all.

    Server state: ``{"init": state dict, "clients": {id: state dict},
    "num_samples": {id: n}}``. Subclasses only choose the predictor.
    """

    card: ClassVar[MethodCard] = MethodCard()

    def init_state(self) -> dict[str, Any]:
        return {"init": initial_state(self.run), "clients": {}, "num_samples": {}}

    def broadcast(self, state: dict[str, Any], round: int) -> Broadcast:
        return state_broadcast(state["init"])

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        return model_upload(trained_client(ctx, data, broadcast.tensors), len(data))

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining:
        return SharedTraining(model_from_state(self.run, broadcast.tensors), self.run.train)

    def upload_spec(self, state: dict[str, Any], round: int, client: int) -> UploadSpec:
        return model_upload_spec(state["init"])

    def screen(self, state: dict[str, Any], round: int, client: int, upload: Upload) -> str | None:
        """``server.member_filter``: a member whose outputs on a probe batch are
        not finite (a valid-looking poison that would turn the ensemble's mean
        into NaN) or whose update is too large is refused."""
        return member_problem(self.run, upload.tensors, state["init"])

    def aggregate(
        self, state: dict[str, Any], uploads: Mapping[int, Upload], round: int
    ) -> dict[str, Any]:
        counts = sample_counts(uploads)
        return {
            "init": state["init"],
            "clients": {
                **state["clients"],
                **{c: dict(uploads[c].tensors) for c in sorted(counts)},
            },
            "num_samples": {**state["num_samples"], **counts},
        }

    def client_models(self, state: dict[str, Any]) -> tuple[list[int], list[nn.Module]]:
        """The received client models, in client order."""
        ids = sorted(state["clients"])
        return ids, [model_from_state(self.run, state["clients"][c]) for c in ids]
