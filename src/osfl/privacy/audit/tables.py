"""The audit table: one row per (setting, method, attack), observations pooled
over seeds, for ``summary.md`` and the terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from osfl.privacy.audit.scoring import stats
from osfl.record import RunRecord, typed

AUDIT_HEADING = "## Privacy audit"


#: One row of the table: (setting, method, attack, global model).
_Key = tuple[str, str, str, str]


@dataclass
class _Pool:
    """Observations grouped by row, pooled over seeds, with each row's threat
    model and its count of failed observations."""

    observations: dict[_Key, list[Mapping[str, Any]]] = field(default_factory=dict)
    failed: dict[_Key, int] = field(default_factory=dict)
    threat: dict[_Key, str] = field(default_factory=dict)

    def add(self, record: RunRecord) -> None:
        """Every scored attack of one run record (unscored entries are skipped)."""
        for key, res in (record.audit or {}).items():
            if not isinstance(res, Mapping) or "per_observation" not in res:
                continue
            self.add_result((record.point, record.method, key), res)

    def add_result(self, base: tuple[str, str, str], res: Mapping[str, Any]) -> None:
        """One attack's result, split by the global model its observations saw;
        its failures count once, on the row of the first global model."""
        states = sorted({str(o.get("global_model", "—")) for o in res["per_observation"]})
        for state in states or ["—"]:
            g = (*base, state)
            rows = [o for o in res["per_observation"] if o.get("global_model", "—") == state]
            self.observations.setdefault(g, []).extend(rows)
            self.threat[g] = str(res.get("threat_model", "—"))
        g = (*base, states[0] if states else "—")
        self.failed[g] = self.failed.get(g, 0) + len(res.get("failed", []))


def audit_rows(
    records: Sequence[RunRecord | Mapping[str, Any]],
) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one row per (setting, method, attack), observations
    pooled over seeds (records read as :class:`~osfl.record.RunRecord`)."""
    pool = _Pool()
    for r in typed(records):
        pool.add(r)
    with_point = any(g[0] for g in pool.observations)
    header = [*(["setting"] if with_point else []), "method", "attack", "threat model"]
    header += ["global model", "local steps", "obs.", "cAcc (%)", "iAcc (%)", "failed"]
    cells = [_row_cells(g, rows, pool, with_point) for g, rows in pool.observations.items()]
    return header, cells


def _row_cells(g: _Key, rows: list[Mapping[str, Any]], pool: _Pool, with_point: bool) -> list[str]:
    """One row's cells: its names, the span of local steps its observations
    took, their count, cAcc and iAcc as mean ± std in percent, and failures."""
    point, method, attack, state = g
    steps = sorted({int(o["local_steps"]) for o in rows if "local_steps" in o})
    span = f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "—")
    line = [*([point] if with_point else []), method, attack, pool.threat[g], state, span]
    line.append(str(len(rows)))
    for metric in ("cAcc", "iAcc"):
        if rows:
            m, s = stats([x[metric] for x in rows])
            line.append(f"{100 * m:.1f} ± {100 * s:.1f}")
        else:
            line.append("—")
    line.append(str(pool.failed.get(g, 0)))
    return line


def _numeric(header: str) -> bool:
    return header.endswith(")") or header in ("obs.", "failed", "local steps")


def audit_markdown(records: Sequence[RunRecord | Mapping[str, Any]]) -> str:
    """The audit table as Markdown (a ``## Privacy audit`` section of summary.md)."""
    header, cells = audit_rows(records)
    if not cells:
        return ""
    lines = [AUDIT_HEADING, ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---:" if _numeric(h) else "---" for h in header) + "|")
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    lines += [
        "",
        "Label recovery (Chen & Vikalo, ICML 2024, Appendix B.4): cAcc and iAcc, mean ± "
        "sample std over the observed clients and rounds (pooled over seeds).",
        "",
    ]
    return "\n".join(lines)


def audit_rich_table(
    records: Sequence[RunRecord | Mapping[str, Any]], title: str = "privacy audit"
) -> Any:
    """The audit table for the terminal (``None`` when nothing was scored)."""
    header, cells = audit_rows(records)
    if not cells:
        return None
    table = Table(title=title)
    for h in header:
        label = h in ("setting", "method", "attack")  # names never wrap; numbers may
        table.add_column(h, justify="right" if _numeric(h) else "left", no_wrap=label)
    for c in cells:
        table.add_row(*c)
    return table
