"""The Method contract (docs/design.md §2) and its registry.

A method is a small class with a template-method round loop driven by a
runtime (simulation or Flower); it never touches the runtime itself::

    method.check()                                           # refuse a bad run now
    state = method.init_state()
    for r in range(method.rounds):
        clients = method.sample_clients(r, num_clients, rng)
        b = method.broadcast(state, r)                       # -> Broadcast
        uploads = {c: method.client_update(ctx_c, b, data_c)} # -> Upload each
        # each upload validated against method.upload_spec(state, r, c)
        state = method.aggregate(state, uploads, r)          # valid uploads only
    predictor = method.predictor(state)                      # -> Predictor

``ctx_c.state`` is client ``c``'s own :class:`~osfl.fl.context.ClientState`
from earlier rounds; the runtime keeps what ``client_update`` leaves there.
One-shot methods have ``rounds == 1``. A method's defaults are a frozen
dataclass (``Config``) registered with it under a lowercase paper name.

Optional, declared hooks (no-ops here; no runtime looks for undeclared ones):
:meth:`Method.audit_history` (scheme state the server knows of a client, for
privacy audits), :meth:`Method.report` (JSON-able extras for the run's record,
e.g. server phase times) and :meth:`Method.artifacts` (tensors worth keeping,
e.g. a synthetic pool for figures) and :meth:`Method.shared_training` (the
round's clients all run the plain cached training step, so the simulation may
train them together). Cross-cutting concerns wrap a method
(:class:`MethodWrapper`), as Flower's DP and SecAgg wrappers wrap a strategy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.client_training import SharedTraining
from osfl.fl.context import ClientContext, RunContext
from osfl.fl.upload import Broadcast, Upload, UploadSpec
from osfl.registry import Registry

if TYPE_CHECKING:
    from osfl.data.imageset import ImageSet


class Predictor(nn.Module):
    """Maps a batch of *transformed* images (float, B×C×H×W) to class scores (B×K).

    Scores may be logits or probabilities: evaluation only takes the argmax.
    """


class PerClientPredictor(Predictor):
    """One model per client (the ``local`` floor): evaluation reports the mean
    of the clients' accuracies; ``forward`` is undefined on purpose."""

    def __init__(self, models: Sequence[nn.Module]):
        super().__init__()
        self.models = nn.ModuleList(models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - guard
        raise TypeError("PerClientPredictor has one model per client; evaluate each")


class Method(ABC):
    """Base class of every FL method. Subclasses set ``name`` and ``Config``.

    ``smoke``: dotted experiment overrides that make the method run in seconds
    on the tiny digits task (fewer server epochs, a ViT where it needs one); the
    registry-wide contract tests run every method with them, so a new method is
    tested without writing a test.
    """

    name: ClassVar[str]
    Config: ClassVar[type]
    one_shot: ClassVar[bool] = True
    #: Joins the embedded default ``osfl run`` table (ordered by ``default_order``).
    default_run: ClassVar[bool] = False
    default_order: ClassVar[int] = 100
    smoke: ClassVar[tuple[str, ...]] = ()
    #: Whether :meth:`release` gives a final state the sites may evaluate
    #: (real sites without a server test set evaluate the predictor locally).
    site_evaluation: ClassVar[bool] = False
    #: The method's regime as its paper runs it (a key of :data:`REGIMES`).
    regime: ClassVar[str] = "scratch"
    #: What its clients send (a key of :data:`UPLOAD_KINDS`).
    uploads: ClassVar[str] = "weights"
    #: The method's own local-training defaults over the run's ``train`` (e.g.
    #: ``fafi_code``'s gradient clipping); ``method_train.<name>`` overrides them.
    #: The assembly resolves the recipe once; a method reads ``self.run.train``.
    train_defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, config: Any, run: RunContext):
        self.config = config
        self.run = run

    # --- round structure -------------------------------------------------
    @property
    def rounds(self) -> int:
        """Communication rounds (one-shot methods: 1)."""
        return 1

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        """Clients taking part in ``round``; default all of them."""
        return list(range(num_clients))

    def check(self) -> None:
        """Refuse a run this method cannot do (model, data, options) with a
        :class:`~osfl.errors.ConfigError`, before any client trains."""
        return None

    def starts_from(self) -> str | None:
        """The registered method whose result this one starts from and should
        improve on (e.g. ``"fedavg"`` for a server that fine-tunes the clients'
        average), or ``None``; the contract tests hold it to that."""
        return None

    # --- the protocol ----------------------------------------------------
    @abstractmethod
    def init_state(self) -> Any:
        """The server's state before round 0."""

    @abstractmethod
    def broadcast(self, state: Any, round: int) -> Broadcast:
        """What the server sends to the clients of ``round``."""

    @abstractmethod
    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        """Local work on one client's data; returns its upload. ``ctx.state``
        holds what this client kept from earlier rounds (and keeps what is left)."""

    @abstractmethod
    def upload_spec(self, state: Any, round: int, client: int) -> UploadSpec:
        """What client ``client``'s upload of ``round`` must look like (checked
        before ``aggregate``; a refused upload never reaches it)."""

    def screen(self, state: Any, round: int, client: int, upload: Upload) -> str | None:
        """Why a valid upload must still be refused (``None``: accept it): a check
        its spec cannot express, e.g. a member model whose outputs are not finite
        (``server.member_filter``). A refusal here is recorded like any other."""
        return None

    @abstractmethod
    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        """The server's new state from the valid uploads of ``round``."""

    @abstractmethod
    def predictor(self, state: Any) -> Predictor:
        """The final classifier."""

    # --- what an honest-but-curious server knows --------------------------
    def public_hparams(self) -> dict[str, Any]:
        """Training hyper-parameters the server knows (for Observations)."""
        return {"method": self.name, "train": asdict(self.run.train)}

    # --- optional hooks ----------------------------------------------------
    def audit_history(
        self, state: Any, client: int, upload_meta: Mapping[str, Any] | None = None
    ) -> dict[str, torch.Tensor]:
        """``history.*`` tensors: scheme state the server knows of ``client`` at
        the start of the round after ``state`` (RLU's ``h`` term); none here."""
        return {}

    def report(self, state: Any) -> dict[str, Any]:
        """JSON-able extras for the run's record (e.g. server phase times)."""
        return {}

    def artifacts(self, state: Any) -> dict[str, torch.Tensor]:
        """Tensors of a finished run worth keeping (e.g. a synthetic pool)."""
        return {}

    @property
    def secure_weighting(self) -> str | None:
        """How the server weights the clients when it may only see their sum
        (Flower's SecAgg+, docs/secure-aggregation.md): a name in
        ``SECURE_WEIGHTINGS`` (``data_size``, ``uniform``), or ``None`` when
        the method needs every client's upload (ensembles, distillation,
        per-client server state), so it refuses secure aggregation."""
        return None

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        """What every client of ``round`` trains when ``client_update`` is the
        plain :func:`~osfl.fl.client_training.train_client` step from
        ``broadcast`` (same weights, the run's augmentation, cross-entropy, no
        terms), so the simulation may train them as one batched step
        (``batch_clients``) and hand each its result through the client cache.
        ``None`` (here): clients train one by one."""
        return None

    def release(self, state: Any) -> Any:
        """The part of the final ``state`` that ``predictor`` needs and that
        every site may see: what the server sends the sites to evaluate when
        it holds no test set of its own. It must not carry what the server
        learnt about individual clients beyond the predictor itself (SCAFFOLD's
        per-client control variates, EFTViT's per-client histograms). Methods
        that implement it set ``site_evaluation``."""
        raise ConfigError(
            f"{self.name} cannot send its final model to the sites for evaluation; "
            "give the server a test set (run config 'server-test')"
        )


class MethodWrapper(Method):
    """A method around ``inner`` that forwards every part of the contract.

    Subclasses override only what they change (a client-side defence replaces
    ``client_update``, a robust server ``aggregate``), the way Flower's DP and
    SecAgg wrappers wrap a strategy. ``name``, ``Config``, ``config``, ``run``
    and the class flags are the inner method's.
    """

    def __init__(self, inner: Method):
        super().__init__(inner.config, inner.run)
        self.inner = inner

    @property  # type: ignore[override]
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property  # type: ignore[override]
    def Config(self) -> type:  # type: ignore[override]
        return self.inner.Config

    @property  # type: ignore[override]
    def one_shot(self) -> bool:  # type: ignore[override]
        return self.inner.one_shot

    @property  # type: ignore[override]
    def regime(self) -> str:  # type: ignore[override]
        return self.inner.regime

    @property  # type: ignore[override]
    def uploads(self) -> str:  # type: ignore[override]
        return self.inner.uploads

    @property
    def rounds(self) -> int:
        return self.inner.rounds

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        return self.inner.sample_clients(round, num_clients, rng)

    def check(self) -> None:
        self.inner.check()

    def starts_from(self) -> str | None:
        return self.inner.starts_from()

    def init_state(self) -> Any:
        return self.inner.init_state()

    def broadcast(self, state: Any, round: int) -> Broadcast:
        return self.inner.broadcast(state, round)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        return self.inner.client_update(ctx, broadcast, data)

    def upload_spec(self, state: Any, round: int, client: int) -> UploadSpec:
        return self.inner.upload_spec(state, round, client)

    def screen(self, state: Any, round: int, client: int, upload: Upload) -> str | None:
        return self.inner.screen(state, round, client, upload)

    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        return self.inner.aggregate(state, uploads, round)

    def predictor(self, state: Any) -> Predictor:
        return self.inner.predictor(state)

    def public_hparams(self) -> dict[str, Any]:
        return self.inner.public_hparams()

    def audit_history(
        self, state: Any, client: int, upload_meta: Mapping[str, Any] | None = None
    ) -> dict[str, torch.Tensor]:
        return self.inner.audit_history(state, client, upload_meta)

    def report(self, state: Any) -> dict[str, Any]:
        return self.inner.report(state)

    def artifacts(self, state: Any) -> dict[str, torch.Tensor]:
        return self.inner.artifacts(state)

    @property
    def site_evaluation(self) -> bool:  # type: ignore[override]
        return self.inner.site_evaluation

    @property
    def secure_weighting(self) -> str | None:
        return self.inner.secure_weighting

    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        return self.inner.shared_training(broadcast, round)

    def release(self, state: Any) -> Any:
        return self.inner.release(state)


def round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def sample_fraction(
    fraction: float, round: int, num_clients: int, rng: np.random.Generator
) -> list[int]:
    """``round(fraction * N)`` clients (at least one) drawn without replacement
    from the run's seeded sampler, sorted; everyone when ``fraction >= 1``."""
    if fraction >= 1.0:
        return list(range(num_clients))
    k = max(1, round_half_up(fraction * num_clients))
    return sorted(rng.choice(num_clients, size=k, replace=False).tolist())


METHODS: Registry[type[Method]] = Registry("method")


def register_method(name: str) -> Callable[[type[Method]], type[Method]]:
    """Class decorator: register a Method under its lowercase paper name."""

    def deco(cls: type[Method]) -> type[Method]:
        cls.name = name.lower()
        METHODS.add(name, cls)
        return cls

    return deco
