"""Stable seeds derived from printable parts.

Every random draw of a run (initial weights, client sampling, each client's
batch order and augmentations, noise) is seeded by a function of the run seed
and names, so a run is reproducible whatever the runtime, thread count or
``PYTHONHASHSEED``.
"""

from __future__ import annotations

import hashlib


def derive_seed(*parts: object) -> int:
    """Stable 63-bit seed from any printable parts (independent of PYTHONHASHSEED)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)
