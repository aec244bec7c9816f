"""``osfl audit RUN_DIR``: score privacy attacks again on the Observations a
finished run recorded (docs/privacy.md, "Auditing a run").

It rebuilds the run's test split and evaluation transform from the run's
``config.yaml`` through :mod:`osfl.assembly` — the very functions the run
used — and merges the scores into the run's ``metrics.json``, ``audit.json``
and ``summary.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl import assembly, jsonio, report
from osfl.config import load_config
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
from osfl.record import RunRecord, plain

log = logging.getLogger(__name__)


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
        ctx = _recording(rec_dir)
        obs = load_observations(rec_dir)
        expected = ctx.get("observations")
        if isinstance(expected, int) and len(obs) < expected:
            log.warning(
                "%s: %d of %d recorded observations are missing; scoring the %d left",
                rec_dir,
                expected - len(obs),
                expected,
                len(obs),
            )
            ctx["missing_observations"] = expected - len(obs)
        scored = score_observations(obs, attacks, aux, transform=transform, device=device)
        results.append({**ctx, "audit": scored})
    (root / "audit.json").write_text(jsonio.dumps(results, indent=2))
    _merge_into_metrics(root, results)
    return results


def _recording(rec_dir: Path) -> dict[str, Any]:
    """A recording's ``recording.json``; a damaged one is a DataError naming it."""
    path = rec_dir / RECORDING
    try:
        doc = jsonio.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: damaged ({e})") from e
    if not isinstance(doc, dict):
        raise DataError(f"{path}: not a JSON object")
    return doc


def _with_audit(rec: RunRecord, results: Sequence[Mapping[str, Any]]) -> RunRecord:
    """``rec`` with the ``audit`` of each matching result (method, seed, grid
    point) merged in; records read back are immutable, so a new one."""
    audit, matched = plain(rec.audit or {}), False
    which = (rec.method, rec.seed, rec.point)
    for res in results:
        if which == (res.get("method"), res.get("seed"), res.get("point")):
            audit.update(res["audit"])
            matched = True
    return rec.replace(audit=audit) if matched else rec


def _merge_into_metrics(root: Path, results: Sequence[Mapping[str, Any]]) -> None:
    """Add ``results`` to the matching records of ``metrics.json`` (same method,
    seed and grid point) and rewrite the audit section of ``summary.md`` from
    the merged records (attacks scored earlier stay in the table)."""
    path = root / "metrics.json"
    records: Sequence[Mapping[str, Any]] = results
    if path.is_file():
        try:
            doc = report.read_metrics(path)
        except DataError as e:
            raise DataError(f"{e}; the scores are in audit.json") from e
        stored = [_with_audit(rec, results) for rec in doc["records"]]
        info = {k: v for k, v in doc.items() if k != "records"}
        report.write_metrics(path, stored, info=info)
        records = [r for r in stored if "audit" in r] or results
    summary = root / "summary.md"
    if summary.is_file():
        try:
            text = summary.read_text()
        except (OSError, ValueError) as e:
            log.warning("%s is unreadable (%s); its audit section is not updated", summary, e)
            return
        cut = text.find(AUDIT_HEADING)
        text = text[:cut].rstrip() + "\n\n" if cut >= 0 else text.rstrip() + "\n\n"
        summary.write_text(text + audit_markdown(records))
