"""FALCON's tiny task (a one-block ViT on 16-px digits, three clients)."""

from __future__ import annotations

from typing import Any

import pytest

from support.tiny import TINY_FALCON, load_tiny


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return load_tiny(TINY_FALCON)
