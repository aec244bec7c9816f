"""FedPFT's tiny task (a one-block ViT on 16-px digits, three clients), and the
family's one-block ViT task for the mechanism test that draws from a mixture."""

from __future__ import annotations

from typing import Any

import pytest

from support.tiny import TINY_FEDPFT, TINY_VIT, load_tiny


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return load_tiny(TINY_FEDPFT)


@pytest.fixture(scope="module")
def vit_task() -> tuple[Any, Any]:
    """``tests/methods/conftest.py``'s ``tiny``, which this folder's ``tiny`` shadows."""
    return load_tiny(TINY_VIT)
