"""Multi-round FL schemes with client and server state: the shared machinery of
SCAFFOLD (:mod:`osfl.methods.scaffold`), FedDyn (:mod:`osfl.methods.feddyn`)
and FedDC (:mod:`osfl.methods.feddc`).

Each is FedAvg [McMahan et al., AISTATS 2017] with a different local
objective and server update; the local objectives are objective terms of the
training engine (:mod:`osfl.fl.objectives`), so SGD, SGD+momentum and Nesterov
(the engine's optimizers) all work. Notation: ``x``/``w``/``theta`` the global
weights of the round, ``K`` the local steps, ``eta`` the local lr, ``N`` the
number of clients, ``S`` the clients of the round.

- **SCAFFOLD** [Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging
  for Federated Learning", ICML 2020, Alg. 1]. Client ``i`` keeps a control
  variate ``c_i``; the server broadcasts ``x`` and ``c``. Local steps
  ``y <- y - eta (g_i(y) - c_i + c)``; then ``c_i+ = g_i(x)`` (option I) or
  ``c_i+ = c_i - c + (x - y)/(K eta)`` (option II); the client uploads ``y``
  and ``Delta c_i = c_i+ - c_i``. Server: ``x <- x + eta_g (avg(y) - x)``,
  ``c <- c + (1/N) sum_S Delta c_i``.
- **FedDyn** [Acar et al., "Federated Learning Based on Dynamic
  Regularization", ICLR 2021, Alg. 1]. Client ``k`` keeps ``g_k = grad
  L_k(theta_k^{t-1})``; local objective ``L_k(theta) - <g_k, theta> +
  alpha/2 ||theta - theta^{t-1}||²``; then ``g_k <- g_k - alpha (theta_k^t -
  theta^{t-1})``; uploads ``theta_k^t``. Server: ``h <- h - (alpha/N) sum_S
  (theta_k^t - theta^{t-1})``, ``theta^t = avg(theta_k^t) - h/alpha``.
- **FedDC** [Gao et al., "FedDC: Federated Learning with Non-IID Data via
  Local Drift Decoupling and Correction", CVPR 2022; equations as in Chen &
  Vikalo, ICML 2024, Eq. 81-82]. Client ``k`` keeps its drift ``d_k`` and its
  last local update; local objective ``L_k(theta) + alpha/2 ||theta + d_k -
  w||² + <theta, (Delta theta_k^{t-1} - Delta Theta^{t-1})/(eta K)>``; then
  ``d_k <- d_k + (theta_k - w)``; uploads ``theta_k``. Server: ``w <- avg(theta_k
  + d_k)``, ``Delta Theta <- avg(theta_k - w)`` (broadcast next round).

Client state lives on the client: ``ctx.state`` (:class:`~osfl.fl.context.
ClientState`), which the runtime keeps between rounds — in the simulation and
in a Flower SuperNode's ``Context.state`` alike; the server keeps its own state plus what it
can compute per client from the uploads it received (``SchemeState.clients``:
SCAFFOLD's ``c_i``, FedDyn's ``g_k``, FedDC's ``d_k``), which is exactly what
an honest-but-curious server knows for RLU's ``h`` term (Chen & Vikalo,
Table 1); :meth:`StatefulScheme.audit_history` names those tensors for the
privacy audits (``docs/privacy.md``, "What is recorded"). Parameters only
carry scheme state; buffers (BatchNorm statistics) are averaged as in FedAvg.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.data.loader import BatchIterator
from osfl.fl.context import ClientContext, ClientState
from osfl.fl.method import AuditHistory, KeepsClientState, MethodCard, Predictor
from osfl.fl.state_codec import state_type
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import train_local
from osfl.fl.upload import Broadcast, TensorSpec, Upload, UploadSpec
from osfl.methods.clients import (
    WEIGHTINGS,
    ModelPredictor,
    StateDict,
    initial_state,
    model_from_state,
    model_upload,
    model_upload_spec,
    sample_counts,
)
from osfl.methods.fedavg import FedAvg, FedAvgConfig

Named = dict[str, StateDict]  # scheme tensors by name, then parameter name


@state_type
@dataclass
class SchemeState:
    """Server state of a stateful scheme.

    ``model``: the global weights broadcast each round. ``server``: the
    scheme's tensors shared by all clients, by name (SCAFFOLD ``c``, FedDyn
    ``h``, FedDC ``global_update``). ``clients``: what the server knows per
    client from its uploads (``c_i``, ``grad``, ``drift``, ``update``).
    """

    model: StateDict
    server: Named = field(default_factory=dict)
    clients: dict[int, Named] = field(default_factory=dict)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat tensors (``model.*``, ``server.<name>.*``, ``clients.<id>.<name>.*``) for checkpoints."""
        out = {f"model.{k}": v for k, v in self.model.items()}
        for name, t in self.server.items():
            out.update({f"server.{name}.{k}": v for k, v in t.items()})
        for c, named in self.clients.items():
            for name, t in named.items():
                out.update({f"clients.{c}.{name}.{k}": v for k, v in t.items()})
        return out


def add_scaled(a: StateDict | None, b: StateDict, scale: float = 1.0) -> StateDict:
    """``a + scale * b`` per name (``a = None`` is zero)."""
    if a is None:
        return {k: scale * v for k, v in b.items()}
    return {k: a[k] + scale * v for k, v in b.items()}


def delta_of(
    new: Mapping[str, torch.Tensor], old: Mapping[str, torch.Tensor], names: list[str]
) -> StateDict:
    """``new - old`` for ``names``, float32 on CPU (a local update)."""
    return {k: new[k].detach().to("cpu", torch.float32) - old[k].to(torch.float32) for k in names}


def full_gradient(
    model: nn.Module,
    data: ImageSet,
    cfg: TrainConfig,
    *,
    transform: Any = None,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> StateDict:
    """Mean cross-entropy gradient over all of ``data`` at ``model``'s weights
    (SCAFFOLD option I: ``c_i+ = g_i(x)``), per trainable parameter, on CPU."""
    model = model.to(device).train()
    loader = BatchIterator(data.images, data.labels, cfg.batch_size, shuffle=False, device=device)
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    for xb, yb in loader:
        x = transform(xb, generator) if transform is not None else xb.float() / 255
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), yb, reduction="sum").backward()
        for n, p in params.items():
            if p.grad is not None:
                total[n] += p.grad
    return {n: (t / len(data)).to("cpu", torch.float32) for n, t in total.items()}


@dataclass(frozen=True)
class SchemeConfig(FedAvgConfig):
    """Multi-round by default; the papers average uniformly over the round's
    clients (SCAFFOLD Alg. 1, FedDyn Alg. 1, FedDC's code), so ``uniform``."""

    rounds: int = 10
    weighting: str = "uniform"


class StatefulScheme(FedAvg, KeepsClientState, AuditHistory):
    """FedAvg with per-client and server state; subclasses set ``prefix``, the
    names they broadcast (``server_names``) and upload (:meth:`upload_names`),
    and implement :meth:`local_round` and :meth:`update_server`."""

    card: ClassVar[MethodCard] = dataclasses.replace(
        FedAvg.card,
        one_shot=False,
        default_run=False,
        default_order=20,
    )
    prefix: ClassVar[str] = "scheme"
    server_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any, run: Any):
        super().__init__(config, run)
        self._names: list[str] | None = None

    @property
    def one_shot_run(self) -> bool:  # stateful: never the shared one-shot clients
        return False

    def upload_names(self) -> tuple[str, ...]:
        return ()

    def param_names(self) -> list[str]:
        """Names of the trainable parameters (the tensors that carry scheme state)."""
        if self._names is None:
            model = self.run.model.build(self.run.num_classes)
            self._names = [n for n, p in model.named_parameters() if p.requires_grad]
        return self._names

    def zeros(self, model: Mapping[str, torch.Tensor]) -> StateDict:
        return {k: torch.zeros(model[k].shape, dtype=torch.float32) for k in self.param_names()}

    # --- wire format ------------------------------------------------------
    def pack(self, named: Named) -> dict[str, torch.Tensor]:
        return {f"{self.prefix}.{n}.{k}": v for n, t in named.items() for k, v in t.items()}

    @staticmethod
    def read_memory(state: ClientState) -> Named:
        """A client's own scheme tensors (``<name>.<param>`` in its state)."""
        named: Named = {}
        for key, v in state.tensors.items():
            name, _, param = key.partition(".")
            named.setdefault(name, {})[param] = v
        return named

    @staticmethod
    def write_memory(state: ClientState, named: Named) -> None:
        state.tensors = {f"{n}.{k}": v for n, t in named.items() for k, v in t.items()}

    def unpack(self, tensors: Mapping[str, torch.Tensor]) -> tuple[StateDict, Named]:
        """Split message tensors into the model state and the scheme's named tensors."""
        model: StateDict = {}
        named: Named = {}
        head = self.prefix + "."
        for key, v in tensors.items():
            if key.startswith(head):
                name, _, param = key[len(head) :].partition(".")
                named.setdefault(name, {})[param] = v
            else:
                model[key] = v
        return model, named

    # --- protocol ---------------------------------------------------------
    def init_state(self) -> SchemeState:
        model = initial_state(self.run)
        return SchemeState(model, {n: self.zeros(model) for n in self.server_names})

    def broadcast(self, state: SchemeState, round: int) -> Broadcast:
        shared = {n: state.server[n] for n in self.server_names}
        return Broadcast(tensors={**state.model, **self.pack(shared)})

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        global_state, shared = self.unpack(broadcast.tensors)
        model = model_from_state(self.run, global_state)
        memory = self.read_memory(ctx.state)
        extras = self.local_round(ctx, model, global_state, shared, memory, data)
        self.write_memory(ctx.state, memory)
        upload = model_upload(model, len(data))
        upload.tensors.update(self.pack(extras))
        return upload

    def train(
        self, ctx: ClientContext, model: nn.Module, data: ImageSet, terms: tuple
    ) -> TrainConfig:
        cfg = self.run.train
        train_local(
            model,
            data,
            cfg,
            transform=self.run.train_transform,
            device=self.run.device,
            generator=ctx.generator,
            terms=terms,
            progress=self.run.progress,
            description=f"client {ctx.client_id}: local training",
        )
        return cfg

    def global_weights(self, state: SchemeState) -> StateDict:  # type: ignore[override]
        return state.model

    @property
    def secure_weighting(self) -> str | None:
        """None: the server keeps per-client state from each upload."""
        return None

    def upload_spec(self, state: SchemeState, round: int, client: int) -> UploadSpec:
        base = model_upload_spec(state.model)
        extra = {
            f"{self.prefix}.{n}.{k}": TensorSpec(tuple(state.model[k].shape), torch.float32)
            for n in self.upload_names()
            for k in self.param_names()
        }
        return UploadSpec(tensors={**base.tensors, **extra}, meta=base.meta)

    def aggregate(
        self, state: SchemeState, uploads: Mapping[int, Upload], round: int
    ) -> SchemeState:
        counts = sample_counts(uploads)
        clients = sorted(counts)
        weights = WEIGHTINGS.get(self.config.weighting)([counts[c] for c in clients])
        parts = {c: self.unpack(uploads[c].tensors) for c in clients}
        new = SchemeState(
            model=dict(state.model),
            server={n: dict(t) for n, t in state.server.items()},
            clients={c: dict(named) for c, named in state.clients.items()},
        )
        self.update_server(state, new, parts, weights, counts, round)
        return new

    def predictor(self, state: SchemeState) -> Predictor:
        return ModelPredictor(model_from_state(self.run, state.model))

    def release(self, state: SchemeState) -> SchemeState:  # type: ignore[override]
        """The global model only: the server's per-client memory stays with it."""
        return SchemeState(state.model)

    # --- scheme specifics -------------------------------------------------
    def local_round(
        self,
        ctx: ClientContext,
        model: nn.Module,
        global_state: StateDict,
        shared: Named,
        memory: Named,
        data: ImageSet,
    ) -> Named:
        """Train ``model`` in place, update ``memory``; returns the named extras to upload."""
        raise NotImplementedError

    def update_server(
        self,
        old: SchemeState,
        new: SchemeState,
        parts: Mapping[int, tuple[StateDict, Named]],
        weights: np.ndarray,
        counts: Mapping[int, int],
        round: int,
    ) -> None:
        """Fill ``new`` (a copy of ``old``) from round ``round``'s uploads ``parts``
        (in client order; the round seeds the server rule's draws)."""
        raise NotImplementedError

    def audit_history(
        self, state: SchemeState, client: int, upload_meta: Mapping[str, Any] | None = None
    ) -> dict[str, torch.Tensor]:
        """``history.<scheme>.<name>.<param>``: the scheme state the server knows for
        ``client`` at the start of the round after ``state`` (zeros for a client it
        has not heard from), as RLU's ``h`` term needs it (docs/privacy.md)."""
        return {}

    def _history(self, named: Mapping[str, StateDict]) -> dict[str, torch.Tensor]:
        return {
            f"history.{self.name}.{n}.{k}": v.detach().to("cpu", torch.float32)
            for n, t in named.items()
            for k, v in t.items()
        }
