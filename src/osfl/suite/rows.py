"""The rows of the GPU suite's finished steps (issues #32, #40):
:func:`step_rows` reads one per method and setting from a step's directory
(a run's ``metrics.json``, an encoder's card, ``mfu.json``, a benchmark
script's JSON), :func:`rows_markdown` writes ``reproduction_gpu.md``, the
rows by section and what did not run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from osfl.record import RunRecord, plain
from osfl.suite.bundle import read_json
from osfl.suite.plan import Planned
from osfl.suite.steps import ENCODER, Step, command_text


def step_rows(step: Step, out: Path, argv: Sequence[str], *, dry_run: bool) -> list[dict[str, Any]]:
    """The rows of a finished step: one per method and grid point (runs),
    one for an encoder or a benchmark."""
    common = {
        "section": step.section,
        "step": step.name,
        "row": step.headline,
        "scale": "dry-run" if dry_run else "gpu",
        "scale_note": step.scale_note,
        "paper_note": step.paper_note,
        "command": command_text(argv),
        "backbone": step.backbone,
    }
    if step.kind == "pretrain":
        card = read_json(out / ENCODER.replace(".safetensors", ".card.json"), dict)
        acc = card["results"]["held_out"].get("accuracy")
        ours = None if acc is None else 100 * acc
        env = card.get("training", {}).get("environment") or card.get("provenance", {})
        return [
            {
                **common,
                "method": "encoder (held-out accuracy)",
                "setting": "",
                "paper": None,
                "ours": ours,
                "per_seed": [ours],
                "provenance": env,
            }
        ]
    if step.kind == "mfu":
        return _mfu_rows(step, read_json(out / "mfu.json", dict), common)
    if step.kind == "script":
        return _script_rows(step, out, common)
    # heavy: torch (osfl.report), only once a step has finished
    from osfl.report import mean_std_text, read_metrics

    records = read_metrics(out / "metrics.json")["records"]
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for r in records:
        if r.ranked_accuracy is None:  # train_clients: clients cached, no accuracy
            continue
        groups.setdefault((r.method, r.point), []).append(r)
    rows = []
    for (method, point), recs in groups.items():
        recs.sort(key=lambda r: r.seed)
        accs = [100 * r.ranked_accuracy for r in recs]  # type: ignore[operator]
        # the server predictor's accuracy; a method without one: its clients' own models' mean
        label = method + (CLIENTS_MEAN_LABEL if recs[0].accuracy_is_clients_mean else "")
        rows.append(
            {
                **common,
                "method": label,
                "setting": point,
                "paper": step.paper.get(method),
                "ours": statistics.mean(accs),
                "ours_text": mean_std_text(accs),
                "seeds": [r.seed for r in recs],
                "per_seed": accs,
                "provenance": plain(recs[0].provenance or {}),
            }
        )
    return rows


def _mfu_rows(step: Step, m: dict[str, Any], common: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per timed variant of the MFU benchmark (one for a record
    without variants): MFU in %, with its TFLOP/s and images per second."""
    variants = m.get("variants") or [{**m, "variant": None}]
    rows = []
    for v in variants:
        ours = None if v.get("mfu") is None else 100 * v["mfu"]
        name = f"MFU {m['model']} {m['dtype']}" + (f" ({v['variant']})" if v.get("variant") else "")
        rows.append(
            {
                **common,
                "method": name,
                "setting": f"batch {v['batch']}",
                "paper": step.paper.get("mfu"),
                "ours": ours,
                "per_seed": [ours],
                "achieved_tflops": v["achieved_tflops"],
                "images_per_s": v.get("images_per_s"),
                "compile_s": v.get("compile_s"),
                "provenance": m["provenance"],
            }
        )
    return rows


#: What a row's method says when its accuracy is the clients' own models' mean
#: (no server predictor, e.g. ``local``), not a server predictor's.
CLIENTS_MEAN_LABEL = " (mean of the clients' own models)"


def _script_rows(step: Step, out: Path, common: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an RLU benchmark script: iAcc (a fraction) per attack and
    setting (Table 2: model, activation, batch, local steps; Fig. 1: round)."""
    rows = []
    for f in sorted(out.glob("*.json")):
        doc = read_json(f, dict)
        for r in doc.get("rows", []):
            if "round" in r:
                setting = f"round {r['round']} (train acc {r['train_acc']:.3f})"
                values = {a: v for a, v in r.items() if a not in ("round", "train_acc")}
            else:
                setting = f"{r['model']} {r['act']} B{r['batch_size']} m{r['steps']}"
                values = {a: v["iAcc"] for a, v in r.items() if isinstance(v, dict) and "iAcc" in v}
            for attack, v in values.items():
                rows.append(
                    {
                        **common,
                        "method": attack,
                        "setting": setting,
                        "unit": "fraction",
                        "paper": step.paper.get(f"{attack} {setting}"),
                        "ours": v,
                        "seeds": [0],
                        "per_seed": [v],
                        "provenance": {},
                    }
                )
    return rows


def backbone_label(row: dict[str, Any]) -> str:
    """What a row was computed on: a self-pretrained backbone, named as such,
    or the setting its scale note states."""
    return str(row.get("backbone") or "the setting in its notes")


def _machine(rows: Sequence[dict[str, Any]]) -> str:
    for r in rows:
        p = r.get("provenance") or {}
        if p.get("gpu"):
            return (
                f"{p['gpu']}, driver {p.get('cuda_driver')}, CUDA {p.get('cuda')}, "
                f"torch {p.get('torch')}, dtype {p.get('dtype', 'see record')}"
            )
    p = rows[0].get("provenance") or {} if rows else {}
    return f"no GPU (device {p.get('device', 'cpu')}, torch {p.get('torch')})"


def _decimals(row: Mapping[str, Any]) -> int:
    """Three decimals for a fraction (RLU's iAcc), two for a percentage."""
    return 3 if row.get("unit") == "fraction" else 2


def _row_line(r: Mapping[str, Any]) -> str:
    """One row of a section's table: paper, ours, each seed's value, where it ran."""
    d = _decimals(r)
    paper = "—" if r["paper"] is None else f"{r['paper']:.{d}f}"
    ours = r.get("ours_text") or ("—" if r["ours"] is None else f"{r['ours']:.{d}f}")
    seeds = ", ".join(
        f"{s}: {v:.{d}f}" if v is not None else f"{s}: —"
        for s, v in zip(r.get("seeds", [0] * len(r["per_seed"])), r["per_seed"], strict=True)
    )
    return (
        f"| {r['step']} | {r['method']} | {r['setting']} | {paper} | {ours} | "
        f"{seeds} | {r['scale']} | {backbone_label(r)} |"
    )


def _section_lines(section: str, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A section's table, the command of each of its steps and its notes."""
    ours = [r for r in rows if r["section"] == section]
    lines = ["", f"## {section}", ""]
    lines.append("| step | method | setting | paper | ours | seeds (per seed) | scale | ours on |")
    lines.append("|---|---|---|---:|---:|---|---|---|")
    lines += [_row_line(r) for r in ours]
    commands = {r["step"]: r["command"] for r in ours}
    lines.append("")
    lines += [f"- `{step}`: `{cmd}`" for step, cmd in commands.items()]
    notes = {(r["paper_note"], r["scale_note"]) for r in ours}
    lines += [f"\nPaper: {p}. Ours: {s}." for p, s in sorted(notes)]
    return lines


def rows_markdown(rows: Sequence[dict[str, Any]], planned: Sequence[Planned]) -> str:
    """``reproduction_gpu.md``: the rows by section, then what did not run."""
    lines = [
        "# osfl suite: rows for REPRODUCTION.md (scale gpu: keep them apart from cpu rows)",
        "",
    ]
    lines.append(f"Machine: {_machine(rows)}.")
    for section in dict.fromkeys(r["section"] for r in rows):
        lines += _section_lines(section, rows)
    lines += ["", "## Not run", ""]
    rest = [p for p in planned if p.status != "done"]
    lines += [f"- {p.step.name}: {p.status} ({p.reason})" for p in rest] or ["- nothing"]
    return "\n".join(lines) + "\n"
