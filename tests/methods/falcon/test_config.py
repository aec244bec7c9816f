"""FALCON's options: the paper's recipes as defaults and the bounds each
option is checked against (the mutants of ``osfl.methods.falcon.config``;
TESTING.md, "Mutation testing")."""

from __future__ import annotations

from typing import Any

import pytest

from osfl.errors import ConfigError
from osfl.fl.tensor_fit import FitConfig
from osfl.methods.falcon.config import FALCONConfig


def test_the_default_recipes_are_the_papers() -> None:
    cfg = FALCONConfig()
    # §3.1 and the authors' s2_g.py: AdamW 1e-4, wd 1e-4, batch 256, 400 epochs,
    # clipping at 2.0, the epoch of lowest mean loss kept
    assert cfg.generator_fit == FitConfig(
        epochs=400,
        batch_size=256,
        optimizer="adamw",
        lr=1e-4,
        weight_decay=1e-4,
        grad_clip=2.0,
        keep="lowest_loss",
    )
    # §3.1: Adam 5e-4, batch 256, 60 epochs, for the local and the server classifier
    classifier = FitConfig(epochs=60, batch_size=256, optimizer="adam", lr=5e-4)
    assert cfg.classifier_fit == classifier and cfg.server_fit == classifier
    assert (cfg.alpha, cfg.temperature, cfg.synthetic_ratio) == (0.5, 4.0, 1.5)


@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_alpha_may_be_either_end_of_its_range(alpha: float) -> None:
    assert FALCONConfig(alpha=alpha).alpha == alpha


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"alpha": 1.5}, "alpha must lie in [0, 1], got 1.5"),
        ({"alpha": -0.1}, "alpha must lie in [0, 1], got -0.1"),
        ({"temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"synthetic_ratio": 0.0}, "synthetic_ratio must be > 0, got 0.0"),
        ({"upload": "both"}, "upload must be one of auto, sequences, generator; got 'both'"),
        (
            {"student_selection": "best"},
            "student_selection must be one of last, validation; got 'best'",
        ),
    ],
)
def test_an_option_out_of_bounds_is_refused_by_name(option: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        FALCONConfig(**option)
    assert str(refused.value) == message
