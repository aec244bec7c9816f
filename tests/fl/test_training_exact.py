"""What the image loop computes where its other tests do not look (mutants
of ``osfl.fl.training``: TESTING.md): its GPU-only choices, checked without a
GPU; what it hands to the parts a method plugs in (a custom loss gets the
step's own labels, an objective term the model being trained, and its
penalty moves the weights)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from osfl.data.imageset import ImageSet
from osfl.fl.objectives import ObjectiveTerm
from osfl.fl.train_config import TrainConfig
from osfl.fl.training import _autocast_dtype, record_step_labels, train_local


@pytest.mark.parametrize(("bf16", "want"), [(True, torch.bfloat16), (False, torch.float16)])
def test_autocast_on_a_gpu_is_bf16_where_it_is_supported_else_fp16(
    monkeypatch, bf16: bool, want: torch.dtype
) -> None:
    """``train.amp`` on CUDA autocasts to bfloat16 (no loss scaling needed),
    or to float16 on a GPU without bf16 (then through a GradScaler); the
    GPU's answer is faked, nothing runs on it."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert _autocast_dtype(torch.device("cuda")) is want
    assert _autocast_dtype(torch.device("cuda", 0)) is want


def test_the_cpu_never_autocasts() -> None:
    assert _autocast_dtype(torch.device("cpu")) is torch.float32


def _data() -> ImageSet:
    g = torch.Generator().manual_seed(0)
    return ImageSet(
        torch.randint(0, 256, (20, 3, 4, 4), dtype=torch.uint8, generator=g),
        torch.randint(0, 3, (20,), generator=g),
        classes=["a", "b", "c"],
    )


def _model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 3))


CFG = TrainConfig(optimizer="sgd", lr=0.1, epochs=2, batch_size=8)


def test_a_custom_loss_gets_each_steps_labels() -> None:
    seen: list[torch.Tensor] = []

    def loss_fn(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append(y.clone())
        return F.cross_entropy(model(x), y)

    with record_step_labels() as labels:
        train_local(_model(), _data(), CFG, loss_fn=loss_fn, generator=torch.Generator())
    assert len(seen) == len(labels) == 6  # 2 epochs of 8, 8, 4
    assert all(torch.equal(a, b) for a, b in zip(seen, labels, strict=True))


class _PullToZero(ObjectiveTerm):
    """A penalty on the trained model's weights that records what it was given."""

    def __init__(self) -> None:
        self.given: list[nn.Module] = []

    def extra_loss(self, model: nn.Module) -> torch.Tensor:
        self.given.append(model)
        return sum(p.pow(2).sum() for p in model.parameters())


def test_an_objective_term_gets_the_trained_model_and_moves_it() -> None:
    model, plain = _model(), _model()
    term = _PullToZero()
    train_local(model, _data(), CFG, terms=[term], generator=torch.Generator().manual_seed(2))
    train_local(plain, _data(), CFG, generator=torch.Generator().manual_seed(2))
    assert len(term.given) == 6 and all(m is model for m in term.given)
    weight = dict(model.named_parameters())["1.weight"]
    assert weight.norm() < 0.5 * dict(plain.named_parameters())["1.weight"].norm()
