"""``Method.trains_with_recipe`` against what each registered method does.

A method that declares it trains through the shared recipe (``run.train``,
``method_train.<name>``) must reach :func:`osfl.fl.training.train_local`, the
loop that follows it; one that declares it does not must run to the end
without ever calling it, and its ``method_train.<name>`` is refused naming its
own knobs (otherwise it would be recorded in ``train_sources`` and ignored).
Each method runs on the registry-wide smoke task (tests/support/smoke.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

import osfl.methods  # noqa: F401  (registers the methods)
from osfl import assembly
from osfl.config import load_config
from osfl.errors import ConfigError
from osfl.fl import training
from osfl.fl.method import METHODS
from osfl.fl.runtime.simulation import SimulationRuntime
from osfl.run_record import run_record
from support.smoke import one_torch_thread, smoke_config, smoke_context  # noqa: F401  (an autouse fixture)

RECIPE = sorted(n for n in METHODS.names() if METHODS.get(n).trains_with_recipe)
OWN = sorted(n for n in METHODS.names() if not METHODS.get(n).trains_with_recipe)


class _Trained(Exception):
    """Raised by the patched train_local: the method reached the recipe's loop."""


def _patch_train_local(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace ``train_local`` wherever a module of osfl bound it (``from
    osfl.fl.training import train_local`` copies the name)."""
    original = training.train_local

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise _Trained

    for mod in list(sys.modules.values()):
        # getattr: torch registers a privateuse1 backend (tests/support/simulated_device.py)
        # as an object without __name__ in sys.modules
        if (getattr(mod, "__name__", "").startswith("osfl")
                and getattr(mod, "train_local", None) is original):  # fmt: skip
            monkeypatch.setattr(mod, "train_local", refuse)


def _run(name: str) -> Callable[[], Any]:
    cfg = smoke_config(name)
    ctx = smoke_context(cfg)
    return lambda: SimulationRuntime().execute(assembly.build_job(cfg, name, ctx))


def test_the_frozen_encoder_methods_declare_their_own_training() -> None:
    assert {"falcon", "fedpft", "fedcgs", "ghofl"} <= set(OWN)
    assert {"fedavg", "ensemble", "fens", "intactofl", "fafi"} <= set(RECIPE)


@pytest.mark.parametrize("name", RECIPE)
def test_a_method_that_trains_with_the_recipe_reaches_train_local(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(name)
    _patch_train_local(monkeypatch)
    with pytest.raises(_Trained):
        run()


@pytest.mark.parametrize("name", OWN)
def test_a_method_with_its_own_training_never_calls_train_local(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(name)
    _patch_train_local(monkeypatch)
    run()  # _Trained would say the flag is wrong


@pytest.mark.parametrize("name", OWN)
def test_method_train_of_a_method_with_its_own_training_is_refused(name: str) -> None:
    cfg = load_config(None, [f"methods=[{name}]", f"method_train.{name}.lr=0.5"])
    with pytest.raises(ConfigError, match=rf"^method_train\.{name} does not apply") as e:
        assembly.check_names(cfg)
    assert "\n" not in str(e.value)


def test_falcon_s_refusal_names_its_own_knobs() -> None:
    cfg = load_config(None, ["methods=[falcon]", "method_train.falcon.lr=0.5"])
    with pytest.raises(ConfigError) as e:
        assembly.check_names(cfg)
    assert str(e.value) == (
        "method_train.falcon does not apply: falcon does not train with the shared recipe; "
        "its own training is set by method.falcon.generator_fit.* / "
        "method.falcon.classifier_fit.* / method.falcon.server_fit.*"
    )


def test_a_recipe_key_under_method_names_the_method_s_own_knobs_not_method_train() -> None:
    cfg = load_config(None, ["methods=[falcon]", "method.falcon.lr=0.5"])
    with pytest.raises(ConfigError, match=r"method\.falcon\.generator_fit\.lr") as e:
        assembly.check_names(cfg)
    assert "method_train" not in str(e.value)


@pytest.mark.parametrize("name", ["falcon", "fedavg"])
def test_only_a_method_that_trains_with_the_recipe_records_one(name: str) -> None:
    """A recipe the method never read is not in its record (the scoreboard
    would compare records on it); FALCON's own optimizer groups are in its
    ``method_config``."""
    cfg = smoke_config(name)
    ctx = smoke_context(cfg)
    job = assembly.build_job(cfg, name, ctx)
    record = run_record(
        cfg, job, SimulationRuntime().execute(job), ctx, {"method": name, "seed": 0}, None
    )
    assert ("train" in record) == ("train_sources" in record) == (name == "fedavg")
    if name == "falcon":
        assert "generator_fit" in record["method_config"]
