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
- beat the method it starts from (``starts_from``, e.g. FedAvg for a server
  that distils into the clients' average), or chance by a margin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest
import torch

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import ExperimentConfig
from osfl.fl.method import METHODS
from osfl.fl.regimes import REGIMES, UPLOAD_KINDS
from osfl.fl.runtime.base import RunResult
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.fl.state_codec import state_from_bytes, state_to_bytes
from osfl.flower.loopback import FlowerLoopbackRuntime
from smoke import smoke_config, smoke_context

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


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", METHODS.names())
def test_method_contract(name: str) -> None:
    cfg = smoke_config(name)
    first = _run(cfg, name)
    assert first.refused == [], f"{name}: its own uploads were refused: {first.refused}"
    again = _run(cfg, name)
    assert same_state(first.state, again.state), f"{name}: same seed, different final state"
    saved = state_from_bytes(state_to_bytes(first.state))  # what resuming a run reads back
    assert same_state(saved, first.state), f"{name}: its state does not survive saving"
    assert first.metrics == again.metrics
    over_flower = _run(cfg, name, FlowerLoopbackRuntime())
    assert over_flower.metrics == first.metrics, f"{name}: Flower differs from the simulation"
    assert (over_flower.bytes_up, over_flower.bytes_down) == (first.bytes_up, first.bytes_down)
    assert over_flower.refused == []

    acc = first.metrics["global_test_accuracy"]
    if "mean_client_accuracy" in first.metrics:
        acc = first.metrics["mean_client_accuracy"]
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    baseline = job.method.starts_from()
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
    assert all("=" in o for o in cls.smoke), cls.smoke
    cfg = smoke_config(name)
    job = assembly.build_job(cfg, name, smoke_context(cfg))
    job.method.check()
    assert job.method.name == name
    assert cls.regime in REGIMES, f"{name}: regime {cls.regime!r} is not one of {list(REGIMES)}"
    assert cls.uploads in UPLOAD_KINDS, f"{name}: uploads {cls.uploads!r} is not a known kind"
