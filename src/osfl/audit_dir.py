"""``osfl audit RUN_DIR``: score privacy attacks again on the Observations a
finished run recorded (docs/privacy.md, "Auditing a run").

It rebuilds the run's test split and evaluation transform from the run's
``config.yaml`` through :mod:`osfl.assembly` — the very functions the run
used — and merges the scores into the run's ``metrics.json``, ``audit.json``
and ``summary.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl import assembly
from osfl.errors import ConfigError, DataError
from osfl.fl.observation import load_observations
from osfl.privacy.audit import (
    AUDIT_HEADING,
    OBSERVATIONS_DIR,
    RECORDING,
    AttackSpec,
    audit_markdown,
    aux_set,
    score_observations,
)


def recordings(run_dir: str | Path) -> list[Path]:
    """The recording directories of a run directory; a clear error if it is none."""
    root = Path(run_dir)
    if not root.is_dir():
        raise DataError(f"{root} is not a directory")
    if not (root / "config.yaml").is_file():
        raise DataError(
            f"{root} is not an osfl run directory (no config.yaml); pass the directory "
            "`osfl run` printed"
        )
    found = sorted(p.parent for p in (root / OBSERVATIONS_DIR).glob(f"*/{RECORDING}"))
    if not found:
        raise DataError(
            f"{root} holds no recorded observations; re-run with audit=[record] "
            "(or audit=[rlu, ...]) to record what the server saw"
        )
    return found


def audit_run_dir(
    run_dir: str | Path,
    attacks: Sequence[AttackSpec],
    *,
    aux_per_class: int = 100,
    aux_seed: int = 0,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """Score ``attacks`` on every recording of ``run_dir``; returns one row per
    (recording, attack), and writes the results into the run's ``metrics.json``
    (each record's ``audit``), ``audit.json`` and ``summary.md``."""
    from osfl.config import load_config

    root = Path(run_dir)
    found = recordings(root)
    if not attacks:
        raise ConfigError("name at least one attack, e.g. --attack rlu")
    cfg = load_config(root / "config.yaml")
    splits = assembly.load_splits(cfg)
    _, transform = assembly.build_transforms(cfg, splits.train)
    aux = aux_set(splits.test, aux_per_class, aux_seed)
    results: list[dict[str, Any]] = []
    for rec_dir in found:
        ctx = json.loads((rec_dir / RECORDING).read_text())
        obs = load_observations(rec_dir)
        scored = score_observations(obs, attacks, aux, transform=transform, device=device)
        results.append({**ctx, "audit": scored})
    (root / "audit.json").write_text(json.dumps(results, indent=2, allow_nan=False))
    _merge_into_metrics(root, results)
    return results


def _merge_into_metrics(root: Path, results: Sequence[Mapping[str, Any]]) -> None:
    """Add ``results`` to the matching records of ``metrics.json`` (same method,
    seed and grid point) and rewrite the audit section of ``summary.md`` from
    the merged records (attacks scored earlier stay in the table)."""
    path = root / "metrics.json"
    records: Sequence[Mapping[str, Any]] = results
    if path.is_file():
        doc = json.loads(path.read_text())
        for rec in doc.get("records", []):
            for res in results:
                if all(rec.get(k) == res.get(k) for k in ("method", "seed", "point")):
                    rec.setdefault("audit", {}).update(res["audit"])
        path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        records = [r for r in doc.get("records", []) if "audit" in r] or results
    summary = root / "summary.md"
    if summary.is_file():
        text = summary.read_text()
        cut = text.find(AUDIT_HEADING)
        text = text[:cut].rstrip() + "\n\n" if cut >= 0 else text.rstrip() + "\n\n"
        summary.write_text(text + audit_markdown(records))


