"""What the kept-model tests share (``tests/test_kept_model.py``, re-scoring;
``tests/test_kept_files.py``, the checks of every file): a run's records and
a kept model's card read back, and the forger's reseal."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from osfl.kept_model import CARD_FILE


def records(out: Path) -> list[dict]:
    return json.loads((out / "metrics.json").read_text())["records"]


def card(out: Path, slug: str) -> dict:
    return json.loads((out / "models" / slug / CARD_FILE).read_text())


def reseal(folder: Path, name: str, blob: bytes, **card_fields) -> None:
    """Write ``blob`` as ``name`` with a card that vouches for it (new digest
    and size): what a forger who edits the weights does."""
    (folder / name).write_bytes(blob)
    c = json.loads((folder / CARD_FILE).read_text())
    c["files"][name] = hashlib.sha256(blob).hexdigest()
    c["sizes"][name] = len(blob)
    c.update(card_fields)
    (folder / CARD_FILE).write_text(json.dumps(c))
