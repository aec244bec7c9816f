"""What the image loop's GPU-only choices compute, checked without a GPU
(mutants of ``osfl.fl.training`` that no CPU test reached: TESTING.md)."""

from __future__ import annotations

import pytest
import torch

from osfl.fl.training import _autocast_dtype


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
