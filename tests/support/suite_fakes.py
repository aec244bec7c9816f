"""A stand-in for the suite's step command (``osfl suite mfu --out DIR``):
it writes the one file an MFU step leaves, in no time, so the suite's loop,
bundles and plans are tested without a GPU."""

from __future__ import annotations

import json
from pathlib import Path


def mfu_command(argv: list[str]) -> int:
    """Write ``mfu.json`` under the step's ``--out`` and succeed."""
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True)
    record = {"model": "m", "dtype": "bf16", "batch": 1, "mfu": 0.5, "achieved_tflops": 1.0}
    (out / "mfu.json").write_text(json.dumps({**record, "provenance": {}}))
    return 0
