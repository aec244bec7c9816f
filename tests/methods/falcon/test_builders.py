"""What every FALCON party builds the same way (the mutants of
``osfl.methods.falcon.base``; TESTING.md, "Mutation testing"): the views,
the classifier and generator drawn from the run's named streams, their
shapes for the upload spec, and the server's draws from an uploaded
generator (on the run's device; a generator that cannot draw is logged).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
import torch

from osfl.fl.seeds import derive_seed
from osfl.fl.upload import Upload
from osfl.methods.falcon import base as base_module
from osfl.methods.falcon.classifier import AttentionPoolClassifier
from osfl.methods.falcon.generator import LAYOUTS, SequenceGenerator
from osfl.methods.falcon.upload import GENERATOR, flatten_state
from support.simulated_device import simulated_device
from support.tiny import falcon, seed_ctx


def _with_run(ctx: Any, **changes: Any) -> Any:
    """``ctx`` with its run's ``changes`` (another seed, another device)."""
    return dataclasses.replace(ctx, run=dataclasses.replace(ctx.run, **changes))


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_region_views_are_cut_from_the_images_own_side_when_unset(tiny) -> None:
    m = falcon(seed_ctx(tiny), views={"window": 8, "stride": 8})
    _, regions = m.view_sets()
    assert regions.input_size == m.run.image_shape[1] == 16
    assert m.sequence_length() == 1 + 4  # the global view and 2 × 2 windows


def _untouched(seed: int) -> torch.Tensor:
    """What the global stream draws next after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return torch.rand(3)


@pytest.mark.parametrize("purpose", ["student-init", "classifier-init"])
def test_the_classifier_is_drawn_from_the_runs_named_stream(tiny, purpose: str) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx)
    torch.manual_seed(derive_seed(ctx.run.seed, "falcon", purpose))
    want = AttentionPoolClassifier(m.token_dim(), 10, m.config.classifier)
    torch.manual_seed(3)
    got = m.new_classifier(purpose)
    assert torch.equal(torch.rand(3), _untouched(3))  # the global stream is left alone
    assert _same(got, want)
    other = falcon(_with_run(ctx, seed=ctx.run.seed + 1))
    assert not _same(other.new_classifier(purpose), got)  # another run, other weights


@pytest.mark.parametrize("variant", sorted(LAYOUTS))
def test_the_generator_is_the_configured_variant_from_the_runs_stream(tiny, variant: str) -> None:
    ctx = seed_ctx(tiny)
    m = falcon(ctx, generator=variant)
    cfg = m.config
    torch.manual_seed(derive_seed(ctx.run.seed, "falcon", "generator-init"))
    want = SequenceGenerator(m.token_dim(), m.sequence_length(), 10, cfg.generator_model, variant)
    torch.manual_seed(3)
    got = m.new_generator()
    assert torch.equal(torch.rand(3), _untouched(3))
    assert got.variant == variant and _same(got, want)
    other = falcon(_with_run(ctx, seed=ctx.run.seed + 1))
    assert not _same(other.new_generator(), got)
    # the upload spec's generator length is this variant's
    assert m._templates()["generator_numel"] == flatten_state(got).numel()


def _generator_upload(m, scale: float) -> Upload:
    flat = flatten_state(m.new_generator()) * scale
    return Upload(tensors={GENERATOR: flat}, meta={"form": "generator"})


def test_draws_are_made_where_the_run_computes(tiny, monkeypatch) -> None:
    ctx = seed_ctx(tiny)
    where: list[set[torch.device]] = []

    def recording(gen, counts, sampler) -> dict[int, torch.Tensor]:
        where.append({p.device for p in gen.parameters()})
        return {}

    monkeypatch.setattr(base_module, "sequences_of", recording)
    with simulated_device() as dev:
        m = falcon(_with_run(ctx, device=dev))
        assert m._generate(0, _generator_upload(m, 1.0), torch.ones(10, dtype=torch.int64)) == {}
    assert where == [{dev}]


def test_a_generator_that_cannot_draw_is_logged_and_draws_nothing(tiny, caplog) -> None:
    m = falcon(seed_ctx(tiny))
    up = _generator_upload(m, float("nan"))  # NaN mixture weights: multinomial refuses
    with caplog.at_level(logging.WARNING, "osfl.methods.falcon.base"):
        assert m._generate(4, up, torch.ones(10, dtype=torch.int64)) is None
    [said] = [r.getMessage() for r in caplog.records if r.name == "osfl.methods.falcon.base"]
    with pytest.raises(RuntimeError) as refused:
        torch.multinomial(torch.tensor([[float("nan"), 1.0]]), 1)
    assert said == f"falcon: client 4's generator cannot draw ({refused.value})"
