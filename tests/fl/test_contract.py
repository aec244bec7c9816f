"""The Method contract, for every registered method (timm-style: one test
parametrised over the registry, so a new method is tested without writing a
test). Each method runs on a tiny digits task with its own ``smoke``
overrides (fewer server epochs, a ViT where it needs one) and must:

- send uploads that pass its own ``upload_spec`` (the runtime validates every
  upload: no refusals);
- give the identical final state for the same seed, and the same state
  after saving and reading it back (what resuming a run does);
- give the simulation's numbers on the loopback Flower runtime (Flower's
  message encoding, client state in the nodes' ``Context.state``);
- beat the method it starts from (``ImprovesOn.starts_from``, e.g. FedAvg
  for a server that distils into the clients' average), or chance by a margin;
- honour every capability it declares (``osfl.fl.method.CAPABILITIES``): as
  many round records as its rounds, state kept by clients only when it declares
  it, a released state that predicts as the full one, every client's own
  model scored beside the server's predictor, a secure mean that
  aggregates as the uploads behind it, history and report a runtime can
  record, a batched step for the round's shared training, no need of a
  validation set unless configured to choose by one.

The Method contract itself: the wrapper forwards every member of the core,
and capabilities are found through any wrapper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly, jsonio
from osfl.config import ExperimentConfig
from osfl.fl.context import ClientState, SharedTraining
from osfl.fl.method import (
    CAPABILITIES,
    METHODS,
    Artifacts,
    AuditHistory,
    ImprovesOn,
    KeepsClientState,
    Method,
    MethodWrapper,
    OwnModels,
    PerClientPredictor,
    Reporting,
    SecureAggregation,
    ServerValidation,
    SharedTrainingStep,
    SiteEvaluation,
    capability,
    rounds_of,
    secure_weighting_of,
)
from osfl.fl.regimes import REGIMES, UPLOAD_KINDS
from osfl.fl.runtime.base import RunResult
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.secagg_config import SECURE_WEIGHTINGS
from osfl.fl.state_codec import state_from_bytes, state_to_bytes
from osfl.fl.upload import Upload
from osfl.flower.loopback import FlowerLoopbackRuntime
from support.smoke import first_aggregation, one_torch_thread, smoke_config, smoke_context  # noqa: F401  (an autouse fixture)

CHANCE_MARGIN = 0.1  # above 1/K


def _run(cfg: ExperimentConfig, name: str, runtime: Any = None) -> RunResult:
    ctx = smoke_context(cfg)
    return (runtime or SimulationRuntime()).execute(assembly.build_job(cfg, name, ctx))


def flat(state: Any, prefix: str = "") -> dict[str, Any]:
    """Every tensor and number of a (nested) server state, by path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        state = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    if isinstance(state, Mapping):
        out: dict[str, Any] = {}
        for k, v in state.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(state, list | tuple):
        out = {}
        for i, v in enumerate(state):
            out.update(flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: state}


def same_state(a: Any, b: Any) -> bool:
    fa, fb = flat(a), flat(b)
    if fa.keys() != fb.keys():
        return False
    for k, va in fa.items():
        vb = fb[k]
        if isinstance(va, torch.Tensor):
            if not (isinstance(vb, torch.Tensor) and torch.equal(va, vb)):
                return False
        elif k.endswith("seconds") or ".seconds." in k:
            continue  # wall-clock phase times differ from run to run
        elif va != vb:
            return False
    return True


@pytest.mark.parametrize("name", METHODS.names())
def test_method_contract(name: str) -> None:
    cfg = smoke_config(name)
    first = _run(cfg, name)
    assert first.refused == [], f"{name}: its own uploads were refused: {first.refused}"
    again = _run(cfg, name)
    assert same_state(first.state, again.state), f"{name}: same seed, different final state"
    saved = state_from_bytes(state_to_bytes(first.state))  # what resuming a run reads back
    assert same_state(saved, first.state), f"{name}: its state does not survive saving"
    assert first.metrics == again.metrics, f"method {name!r}: the same seed gave other metrics"
    over_flower = _run(cfg, name, FlowerLoopbackRuntime())
    assert over_flower.metrics == first.metrics, f"{name}: Flower differs from the simulation"
    assert (over_flower.bytes_up, over_flower.bytes_down) == (first.bytes_up, first.bytes_down), (
        f"method {name!r}: Flower counts other bytes than the simulation"
    )
    assert over_flower.refused == [], (
        f"method {name!r}: Flower refused its own uploads: {over_flower.refused}"
    )

    acc = first.metrics["global_test_accuracy"]
    if "mean_client_accuracy" in first.metrics:
        acc = first.metrics["mean_client_accuracy"]
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    check_capabilities(job.method, first)
    improves = capability(job.method, ImprovesOn)
    baseline = improves.starts_from() if improves is not None else None
    if baseline is not None:
        base = _run(smoke_config(name, run_as=baseline), baseline)
        assert acc > base.metrics["global_test_accuracy"], (
            f"{name} ({acc:.3f}) does not beat {baseline} "
            f"({base.metrics['global_test_accuracy']:.3f}) it starts from"
        )
    else:
        chance = 1.0 / job.run.num_classes
        assert acc > chance + CHANCE_MARGIN, f"{name}: accuracy {acc:.3f} is near chance"


@pytest.mark.parametrize("name", METHODS.names())
def test_method_declares_a_runnable_smoke_config(name: str) -> None:
    """Every override in ``smoke`` is a valid dotted key of the experiment config,
    and the method's ``check`` accepts its smoke run."""
    cls = METHODS.get(name)
    card = cls.card
    bad = [o for o in card.smoke if "=" not in o]
    assert not bad, f"method {name!r}: card.smoke entries {bad} are not key=value overrides"
    cfg = smoke_config(name)
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    job.method.check()
    assert job.method.name == name, (
        f"method {name!r}: its built method is named {job.method.name!r}, not its registered name"
    )
    assert card.regime in REGIMES, f"{name}: regime {card.regime!r} is not one of {list(REGIMES)}"
    assert card.uploads in UPLOAD_KINDS, f"{name}: uploads {card.uploads!r} is not a known kind"


# --------------------------------------------------------------------------- capabilities
def _outputs(predictor: Any, run: Any) -> torch.Tensor:
    x = torch.randn(4, *run.image_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return predictor.eval()(x)


def check_capabilities(method: Method, result: RunResult) -> None:
    """What each capability ``method`` declares promises, on its smoke run."""
    name, state = method.name, result.state
    assert len(result.rounds) == rounds_of(method), (
        f"method {name!r} ran {len(result.rounds)} rounds, not the {rounds_of(method)} it declares"
    )
    kept = [s for s in result.client_states.values() if s.tensors or s.meta]
    if capability(method, KeepsClientState) is not None:
        assert kept, f"{name} declares client state but no client kept any"
    else:  # run_client refuses undeclared state; nothing may reach the runtime
        assert not kept, f"{name} kept client state without declaring it"
    site = capability(method, SiteEvaluation)
    if site is not None and not isinstance(method.predictor(state), PerClientPredictor):
        released = state_from_bytes(state_to_bytes(site.release(state)))
        full = _outputs(method.predictor(state), method.run)
        assert torch.allclose(_outputs(method.predictor(released), method.run), full), (
            f"{name}: the released state predicts differently from the full one"
        )
    own = capability(method, OwnModels)
    if own is not None:  # every client scored its own model, the server's predictor beside
        assert len(result.metrics["client_accuracies"]) == method.run.num_clients, (
            f"method {name!r} declares OwnModels but not every client scored its own model"
        )
        assert None not in result.metrics["client_accuracies"], f"{name}: a client did not score"
        accs = result.metrics["client_accuracies"]
        assert result.metrics["mean_client_accuracy"] == pytest.approx(sum(accs) / len(accs)), (
            f"method {name!r} declares OwnModels but mean_client_accuracy is not the clients' mean"
        )
        assert result.metrics["global_test_accuracy"] is not None, (
            f"method {name!r} declares OwnModels but has no server predictor's accuracy"
        )
        assert "server_accuracy" not in result.metrics, f"{name}: one name per number"
        fresh = own.client_predictor(method.broadcast(state, len(result.rounds)), ClientState())
        assert _outputs(fresh, method.run).shape == (4, method.run.num_classes), (
            f"method {name!r}: client_predictor's scores are not batch x classes"
        )
    audited = capability(method, AuditHistory)
    if audited is not None:
        history = audited.audit_history(state, 0)
        bad = [k for k, v in history.items() if not k.startswith("history.")]
        bad += [k for k, v in history.items() if not isinstance(v, torch.Tensor)]
        assert not bad, f"method {name!r}: audit_history keys {bad} are not 'history.*' tensors"
    reporting = capability(method, Reporting)
    if reporting is not None:
        jsonio.dumps(reporting.report(state))  # what the record stores
    artifacts = capability(method, Artifacts)
    if artifacts is not None:
        bad = [k for k, v in artifacts.artifacts(state).items() if not isinstance(v, torch.Tensor)]
        assert not bad, f"method {name!r}: artifacts {bad} are not tensors"
    shared = capability(method, SharedTrainingStep)
    if shared is not None:
        plan = shared.shared_training(method.broadcast(method.init_state(), 0), 0)
        assert plan is None or isinstance(plan, SharedTraining), (
            f"method {name!r}: shared_training returned {type(plan).__name__}, not SharedTraining"
        )
    chooser = capability(method, ServerValidation)
    if chooser is not None:  # a smoke run has no validation set and must not need one
        chooser.use_validation(None)


SECURE = [n for n in METHODS.names() if issubclass(METHODS.get(n), SecureAggregation)]


@pytest.mark.parametrize("name", SECURE)
def test_a_secure_mean_aggregates_as_the_uploads_behind_it(name: str) -> None:
    """``aggregate_mean`` of the uploads' weighted mean (what SecAgg+ gives the
    server, before its quantisation) is ``aggregate`` of the uploads."""
    cfg = smoke_config(name)
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    weighting = secure_weighting_of(job.method)
    if weighting is None:
        pytest.skip(f"{name} needs individual uploads in this configuration")
    state, uploads = first_aggregation(job)
    rule = SECURE_WEIGHTINGS.get(weighting)
    w = {c: float(rule.weight(u)) for c, u in uploads.items()}
    total = sum(w.values())
    mean = Upload(
        tensors={
            k: (sum(w[c] * u.tensors[k].double() for c, u in uploads.items()) / total).to(t.dtype)
            if t.is_floating_point()
            else (sum(w[c] * u.tensors[k].double() for c, u in uploads.items()) / total)
            .round()
            .to(t.dtype)
            for k, t in next(iter(uploads.values())).tensors.items()
        },
        meta={"num_samples": int(total)},
    )
    secure = capability(job.method, SecureAggregation)
    assert secure is not None
    via_mean = flat(secure.aggregate_mean(state, mean, 0))
    via_uploads = flat(job.method.aggregate(state, uploads, 0))
    assert via_mean.keys() == via_uploads.keys()
    for k, v in via_uploads.items():
        if isinstance(v, torch.Tensor):
            assert torch.allclose(via_mean[k].double(), v.double(), atol=1e-6), (name, k)


def test_the_wrapper_forwards_every_member_of_the_core() -> None:
    """Every public member of :class:`Method` is overridden by
    :class:`MethodWrapper` (so a wrapped method is the method), and nothing a
    capability adds sits on the core."""
    core = {
        n
        for klass in Method.__mro__
        if klass.__module__ == Method.__module__
        for n in vars(klass)
        if not n.startswith("_")
    }
    assert core <= set(vars(MethodWrapper)), sorted(core - set(vars(MethodWrapper)))
    for cap in CAPABILITIES.values():
        members = {n for n in vars(cap) if not n.startswith("_")}
        assert not members & core, (cap.__name__, members & core)


@pytest.mark.parametrize("key", sorted(CAPABILITIES))
def test_a_capability_serves_two_methods_or_names_its_one(key: str) -> None:
    """A capability earns its place with two registered methods or more; one
    that serves a single method names it in ``single_user`` (its runtime part
    is a generic hook, the rest is that method's own code), so that a
    capability made for one method is a visible choice, not an accident."""
    cap = CAPABILITIES[key]
    users = [n for n in METHODS.names() if issubclass(METHODS.get(n), cap)]
    assert users, f"{key}: no registered method declares it"
    if len(users) == 1:
        assert cap.single_user == users[0], (
            f"{key} serves {users[0]} alone: make it that method's own business, or set "
            f"{cap.__name__}.single_user = {users[0]!r} and say why in its docstring"
        )
    else:
        assert cap.single_user is None, f"{key} serves {users}, not {cap.single_user} alone"


@pytest.mark.parametrize("name", METHODS.names())
def test_capabilities_are_found_through_a_wrapper(name: str) -> None:
    cfg = smoke_config(name)
    method = assembly.build_job(cfg, name, smoke_context(cfg)).method
    while isinstance(method, MethodWrapper):
        method = method.inner
    wrapped = MethodWrapper(MethodWrapper(method))
    for cap in CAPABILITIES.values():
        found = capability(wrapped, cap)
        assert (found is method) == isinstance(method, cap), (
            f"method {name!r}: capability {cap.__name__} is not found through a wrapper as declared"
        )
        assert found is None or found is method, (
            f"method {name!r}: capability {cap.__name__} found on another object than the method"
        )
    assert wrapped.card is type(method).card and wrapped.name == name, (
        f"method {name!r}: a wrapper does not forward its card and name"
    )
