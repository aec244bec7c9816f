"""The Method contract (docs/design.md §2): a small core every method
implements, named optional capabilities a method opts into, and the registry.

A method is a small class driven by the round loop
(:class:`~osfl.fl.runtime.rounds.RoundLoop`, Flower's strategy template); it
never touches the runtime itself::

    method.check()                                           # refuse a bad run now
    state = method.init_state()
    for r in range(rounds_of(method)):                        # MultiRound, else 1
        clients = sample_clients(method, r, num_clients, rng) # MultiRound, else all
        b = method.broadcast(state, r)                        # -> Broadcast
        uploads = {c: method.client_update(ctx_c, b, data_c)} # -> Upload each
        # each upload validated against method.upload_spec(state, r, c)
        state = method.aggregate(state, uploads, r)           # valid uploads only
    predictor = method.predictor(state)                       # -> Predictor

**The core** (:class:`Method`): ``name``, ``Config`` (a frozen dataclass of
options), ``card`` (what the method is: :class:`MethodCard`), the six
abstract protocol steps above, ``check`` and ``public_hparams``.

**Capabilities** (:class:`Capability` subclasses) are the optional parts. A
method opts into one by inheriting it, so that what a method can do is
visible in its class line and ``issubclass`` answers it; no runtime looks for
an undeclared hook. :func:`capability` finds the object that implements a
capability, through any wrappers. :data:`CAPABILITIES` names them all (the
registry-wide contract test checks each declared one).

Cross-cutting concerns wrap a method (:class:`MethodWrapper`), as Flower's DP
and SecAgg wrappers wrap a strategy: the wrapper forwards the core (a test
proves it forwards all of it) and capabilities are found on the wrapped method.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import nn

from osfl.errors import ConfigError
from osfl.fl.context import ClientContext, ClientState, RunContext, SharedTraining
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


@dataclass(frozen=True)
class MethodCard:
    """What a method is, as users, tables and tests see it (no behaviour).

    ``regime`` / ``uploads``: the method's regime as its paper runs it and
    what its clients send (keys of :data:`osfl.fl.regimes.REGIMES` and
    ``UPLOAD_KINDS``). ``one_shot``: one upload per client as the paper runs
    it. ``default_run``: joins the embedded default ``osfl run`` table, ordered
    by ``default_order``. ``smoke``: dotted experiment overrides that run the
    method in seconds on the tiny digits task (fewer server epochs, a ViT where
    it needs one); the registry-wide contract test runs every method with them,
    so a new method is tested without writing a test. ``server_rule``: its
    ``aggregate`` combines the clients' weights with ``server.aggregator``
    (the mean or a Byzantine-robust rule); a robust rule is refused for a
    method that does not, rather than named in its record and ignored.
    ``train_defaults``: the method's own local-training defaults over the run's
    ``train`` (e.g. ``fafi_code``'s gradient clipping); ``method_train.<name>``
    overrides them. The assembly resolves the recipe once (``train_recipe``);
    a method reads ``self.run.train``. ``summary``: one line for users (``osfl
    list``: what the method does, in their words, not its implementation);
    ``paper``: the work it follows (authors, venue, year), or ``""`` for an
    osfl baseline. Every registered method states its own (tested)."""

    summary: str = ""
    paper: str = ""
    regime: str = "scratch"
    uploads: str = "weights"
    one_shot: bool = True
    default_run: bool = False
    default_order: int = 100
    smoke: tuple[str, ...] = ()
    server_rule: bool = False
    train_defaults: Mapping[str, Any] = field(default_factory=dict)


class Method(ABC):
    """The core every FL method implements. Subclasses set ``Config`` (and
    ``card``); :func:`register_method` sets ``name``."""

    name: ClassVar[str]
    Config: ClassVar[type]
    card: ClassVar[MethodCard] = MethodCard()
    #: Whether the method's clients train through the shared recipe
    #: (``run.train``, ``method_train.<name>``). False for a method with its own
    #: training knobs (FALCON's ``generator_fit``): ``method_train.<name>`` is
    #: then refused rather than recorded and ignored (tests/fl/test_trains_with_recipe.py).
    trains_with_recipe: ClassVar[bool] = True

    def __init__(self, config: Any, run: RunContext):
        self.config = config
        self.run = run

    def check(self) -> None:
        """Refuse a run this method cannot do (model, data, options) with a
        :class:`~osfl.errors.ConfigError`, before any client trains."""
        return None

    @abstractmethod
    def init_state(self) -> Any:
        """The server's state before round 0."""

    @abstractmethod
    def broadcast(self, state: Any, round: int) -> Broadcast:
        """What the server sends to the clients of ``round``."""

    @abstractmethod
    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        """Local work on one client's data; returns its upload. A method that
        keeps something between rounds in ``ctx.state`` declares
        :class:`KeepsClientState`."""

    @abstractmethod
    def upload_spec(self, state: Any, round: int, client: int) -> UploadSpec:
        """What client ``client``'s upload of ``round`` must look like (checked
        before ``aggregate``; a refused upload never reaches it)."""

    @abstractmethod
    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        """The server's new state from the valid uploads of ``round``."""

    @abstractmethod
    def predictor(self, state: Any) -> Predictor:
        """The final classifier."""

    def public_hparams(self) -> dict[str, Any]:
        """Training hyper-parameters the server knows (for Observations)."""
        return {"method": self.name, "train": asdict(self.run.train)}


# --------------------------------------------------------------------------- capabilities
class Capability(ABC):  # noqa: B024 - a marker base: KeepsClientState has no members
    """A named optional part of the Method contract, opted into by inheriting it.

    It earns its place by serving two registered methods or more; one serving
    a single method names it in ``single_user`` (tested), is a generic runtime
    hook, leaves the rest to the method's own code, and says why in its docstring."""

    single_user: ClassVar[str | None] = None  # its one user, where only one uses it


class MultiRound(Capability):
    """More than one round, or a sampled subset of the clients per round
    (without it: one round, every client)."""

    @property
    @abstractmethod
    def rounds(self) -> int:
        """Communication rounds."""

    def sample_clients(self, round: int, num_clients: int, rng: np.random.Generator) -> list[int]:
        """Clients taking part in ``round`` (``rng``: the run's seeded sampler); all here."""
        return list(range(num_clients))


class KeepsClientState(Capability):
    """Each client keeps tensors between rounds in ``ctx.state`` (SCAFFOLD's
    ``c_i``, EFTViT's private local module); the runtime persists them (a dict
    of bytes in the simulation, the SuperNode's ``Context.state`` under
    Flower). Without it a client's state must stay empty."""


class Screening(Capability):
    """A judgement on a spec-valid upload as a whole, which a spec cannot
    express (a statistic that is not a scatter, a member model whose outputs
    overflow, an update beyond ``server.max_update_norm``)."""

    @abstractmethod
    def screen(self, state: Any, round: int, client: int, upload: Upload) -> str | None:
        """Why ``upload`` must be refused, or ``None`` to keep it; a refusal is
        recorded like any other."""


class SecureAggregation(Capability):
    """The server needs only the clients' weighted mean, so the round may run
    under Flower's SecAgg+ (docs/secure-aggregation.md), where the server
    learns that mean and never an upload."""

    @property
    @abstractmethod
    def secure_weighting(self) -> str | None:
        """A name in ``osfl.fl.secagg_config.SECURE_WEIGHTINGS`` (``data_size``,
        ``uniform``), or ``None`` when this configuration needs every upload."""

    @abstractmethod
    def aggregate_mean(self, state: Any, mean: Upload, round: int) -> Any:
        """The new state from the round's weighted mean (``mean.meta
        ["num_samples"]``: the total weight); equal to ``aggregate`` of the
        uploads behind it, up to SecAgg+'s quantisation."""


class SharedTrainingStep(Capability):
    """Every client of a round may run the plain cached training step, so the
    simulation (``batch_clients``) may train them as one batched step."""

    @abstractmethod
    def shared_training(self, broadcast: Broadcast, round: int) -> SharedTraining | None:
        """What every client of ``round`` trains from ``broadcast`` (same
        weights, the run's augmentation, cross-entropy, no terms), or ``None``
        when this round's clients train one by one."""


class SiteEvaluation(Capability):
    """The final state can go to the sites, which score it on their own test
    data when the server holds no test set."""

    @abstractmethod
    def release(self, state: Any) -> Any:
        """The part of the final ``state`` that ``predictor`` needs and that
        every site may see. It must not carry what the server learnt about
        individual clients beyond the predictor itself (SCAFFOLD's per-client
        control variates, EFTViT's per-client histograms)."""


class OwnModels(Capability):
    """Each client ends with a model of its own, built from what the server
    broadcasts and what the client keeps in its state, and that model, not
    ``predictor``, is the one the method's paper evaluates.

    One user, EFTViT: what the model is (its private local module under the
    broadcast global module) is its own code. The runtime keeps one generic
    hook, as the method cannot reach a client's state under Flower (it never
    leaves the node): wherever the server's predictor is scored, every client
    scores whatever predictor the method builds from the next broadcast and
    its state (empty: never sampled), in one place (:mod:`osfl.fl.own_models`)
    that the transports only carry. The clients' numbers are
    ``mean_client_accuracy`` and ``client_accuracies``, beside the server
    predictor's ``global_test_accuracy`` (docs/run-directory.md)."""

    single_user: ClassVar[str | None] = "eftvit"

    @abstractmethod
    def client_predictor(self, broadcast: Broadcast, client_state: ClientState) -> Predictor:
        """The model of the client whose state is ``client_state`` (empty: a
        client never sampled) under ``broadcast``, for whole test images."""


class AuditHistory(Capability):
    """Scheme state the server knows of a client (RLU's ``h`` term)."""

    @abstractmethod
    def audit_history(
        self, state: Any, client: int, upload_meta: Mapping[str, Any] | None = None
    ) -> dict[str, torch.Tensor]:
        """``history.*`` tensors: what the server knows of ``client`` at the
        start of the round after ``state``."""


class Reporting(Capability):
    """JSON-able extras for the run's record (server phase times, FLOPs)."""

    @abstractmethod
    def report(self, state: Any) -> dict[str, Any]:
        """The extras of the final ``state``."""


class Artifacts(Capability):
    """Tensors of a finished run worth keeping (e.g. a synthetic pool)."""

    @abstractmethod
    def artifacts(self, state: Any) -> dict[str, torch.Tensor]:
        """The tensors of the final ``state``."""


class ImprovesOn(Capability):
    """The method starts from another registered method's result and should
    improve on it; the contract test holds it to that."""

    @abstractmethod
    def starts_from(self) -> str | None:
        """That method's name (e.g. ``"fedavg"`` for a server that fine-tunes
        the clients' average), or ``None`` in this configuration."""


class ServerValidation(Capability):
    """The server receives the run's validation set (``data.validation_fraction``),
    carved from the train set before partitioning, so no client holds it.

    One user, FALCON, whose own code picks its student's epoch by it
    (``student_selection=validation``); the generic hook, handing the set over
    (:func:`give_validation`), stays: only the run's assembly holds the splits."""

    single_user: ClassVar[str | None] = "falcon"

    @abstractmethod
    def use_validation(self, data: ImageSet | None) -> None:
        """Keep ``data`` for the server's choices (``None``: the run has no
        validation set; a configuration that needs one refuses here)."""


#: Every capability, by the name ``osfl list`` and the docs use.
CAPABILITIES: dict[str, type[Capability]] = {
    "multi_round": MultiRound,
    "client_state": KeepsClientState,
    "screening": Screening,
    "secure_aggregation": SecureAggregation,
    "shared_training": SharedTrainingStep,
    "site_evaluation": SiteEvaluation,
    "own_models": OwnModels,
    "audit_history": AuditHistory,
    "report": Reporting,
    "artifacts": Artifacts,
    "improves_on": ImprovesOn,
    "server_validation": ServerValidation,
}

C = TypeVar("C", bound=Capability)


def capability(method: Method, cap: type[C]) -> C | None:
    """The object implementing ``cap`` for ``method``: the method itself, or
    for a wrapper the outermost wrapped layer that declares it; ``None`` when
    no layer does."""
    layer: Method | None = method
    while layer is not None:
        if isinstance(layer, cap):
            return layer
        layer = layer.inner if isinstance(layer, MethodWrapper) else None
    return None


def capabilities_of(cls: type) -> list[str]:
    """The names of the capabilities a method class declares."""
    return [name for name, cap in CAPABILITIES.items() if issubclass(cls, cap)]


def rounds_of(method: Method) -> int:
    """The method's communication rounds (1 without :class:`MultiRound`)."""
    multi = capability(method, MultiRound)
    return 1 if multi is None else multi.rounds


def default_rounds(cls: type[Method]) -> int:
    """The rounds a method class runs with its default options (``osfl list``):
    its :class:`MultiRound` ``rounds`` read on a stand-in that holds only the
    default ``Config`` (``rounds`` reads nothing else)."""
    if not issubclass(cls, MultiRound):
        return 1
    stand_in = object.__new__(cls)
    stand_in.config = cls.Config()
    return int(stand_in.rounds)


def sample_clients(
    method: Method, round: int, num_clients: int, rng: np.random.Generator
) -> list[int]:
    """The clients of ``round`` (every client without :class:`MultiRound`)."""
    multi = capability(method, MultiRound)
    if multi is None:
        return list(range(num_clients))
    return multi.sample_clients(round, num_clients, rng)


def keeps_client_state(method: Method) -> bool:
    return capability(method, KeepsClientState) is not None


def secure_weighting_of(method: Method) -> str | None:
    """How ``method`` weights its clients under SecAgg+ (``None``: it needs
    their individual uploads, so it refuses secure aggregation)."""
    secure = capability(method, SecureAggregation)
    return None if secure is None else secure.secure_weighting


def give_validation(method: Method, data: ImageSet | None) -> None:
    """Hand the server's validation set to a :class:`ServerValidation` method."""
    chooser = capability(method, ServerValidation)
    if chooser is not None:
        chooser.use_validation(data)


def release_for_sites(method: Method, state: Any) -> Any:
    """What the server sends the sites to evaluate (:class:`SiteEvaluation`),
    or a ConfigError saying what to do instead."""
    site = capability(method, SiteEvaluation)
    if site is None:
        raise ConfigError(
            f"{method.name} cannot send its final model to the sites for evaluation; "
            "give the server a test set (run config 'server-test')"
        )
    return site.release(state)


# --------------------------------------------------------------------------- wrappers
class MethodWrapper(Method):
    """A method around ``inner`` that forwards the core of the contract.

    Subclasses override only what they change (a client-side defence replaces
    ``client_update``), the way Flower's DP and SecAgg wrappers wrap a
    strategy. ``name``, ``Config``, ``card``, ``config`` and ``run`` are the
    inner method's; capabilities are found on the inner method by
    :func:`capability` (a wrapper that changes one inherits it and implements it).
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
    def card(self) -> MethodCard:  # type: ignore[override]
        return self.inner.card

    @property  # type: ignore[override]
    def trains_with_recipe(self) -> bool:  # type: ignore[override]
        return self.inner.trains_with_recipe

    def check(self) -> None:
        self.inner.check()

    def init_state(self) -> Any:
        return self.inner.init_state()

    def broadcast(self, state: Any, round: int) -> Broadcast:
        return self.inner.broadcast(state, round)

    def client_update(self, ctx: ClientContext, broadcast: Broadcast, data: ImageSet) -> Upload:
        return self.inner.client_update(ctx, broadcast, data)

    def upload_spec(self, state: Any, round: int, client: int) -> UploadSpec:
        return self.inner.upload_spec(state, round, client)

    def aggregate(self, state: Any, uploads: Mapping[int, Upload], round: int) -> Any:
        return self.inner.aggregate(state, uploads, round)

    def predictor(self, state: Any) -> Predictor:
        return self.inner.predictor(state)

    def public_hparams(self) -> dict[str, Any]:
        return self.inner.public_hparams()


# --------------------------------------------------------------------------- helpers
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
