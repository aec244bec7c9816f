"""The audit table: one row per (setting, method, attack), observations pooled
over seeds, for ``summary.md`` and the terminal."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from osfl.privacy.audit.scoring import stats

AUDIT_HEADING = "## Privacy audit"


def audit_rows(records: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Header and cells: one row per (setting, method, attack), observations pooled over seeds."""
    Row = tuple[str, str, str, str]  # setting, method, attack, global model
    pooled: dict[Row, list[Mapping[str, Any]]] = {}
    failed: dict[Row, int] = {}
    threat: dict[Row, str] = {}
    for r in records:
        for key, res in (r.get("audit") or {}).items():
            if not isinstance(res, Mapping) or "per_observation" not in res:
                continue
            base = (str(r.get("point") or ""), str(r.get("method")), key)
            states = sorted({str(o.get("global_model", "—")) for o in res["per_observation"]})
            for state in states or ["—"]:
                g = (*base, state)
                rows = [o for o in res["per_observation"] if o.get("global_model", "—") == state]
                pooled.setdefault(g, []).extend(rows)
                threat[g] = str(res.get("threat_model", "—"))
            g = (*base, states[0] if states else "—")
            failed[g] = failed.get(g, 0) + len(res.get("failed", []))
    with_point = any(g[0] for g in pooled)
    header = [*(["setting"] if with_point else []), "method", "attack", "threat model"]
    header += ["global model", "local steps", "obs.", "cAcc (%)", "iAcc (%)", "failed"]
    cells = []
    for (point, method, attack, state), rows in pooled.items():
        steps = sorted({int(o["local_steps"]) for o in rows if "local_steps" in o})
        line = [
            *([point] if with_point else []),
            method,
            attack,
            threat[(point, method, attack, state)],
        ]
        span = f"{steps[0]}–{steps[-1]}" if len(steps) > 1 else (str(steps[0]) if steps else "—")
        line += [state, span]
        line.append(str(len(rows)))
        for metric in ("cAcc", "iAcc"):
            if rows:
                m, s = stats([x[metric] for x in rows])
                line.append(f"{100 * m:.1f} ± {100 * s:.1f}")
            else:
                line.append("—")
        line.append(str(failed.get((point, method, attack, state), 0)))
        cells.append(line)
    return header, cells


def _numeric(header: str) -> bool:
    return header.endswith(")") or header in ("obs.", "failed", "local steps")


def audit_markdown(records: Sequence[Mapping[str, Any]]) -> str:
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


def audit_rich_table(records: Sequence[Mapping[str, Any]], title: str = "privacy audit") -> Any:
    """The audit table for the terminal (``None`` when nothing was scored)."""
    from rich.table import Table

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
