"""``osfl suite import BUNDLE``: a job's rows into the repository (issue #40).

A bundle's ``rows.json`` (:mod:`osfl.suite.bundle`) goes into

- ``reproduction/gpu_suite_<section>.json``: one entry per headline row,
  method and setting, with every seed's value (``accuracy``: seed -> value,
  merged with the seeds imported before), mean and sample std, the steps
  that made it, the machine and each seed's exact command; the file
  :func:`osfl.suite.execute.rows_in_repo` reads, so the next job skips those
  steps;
- REPRODUCTION.md: a generated block per section, between
  ``<!-- osfl suite import: SECTION -->`` and ``<!-- end osfl suite import:
  SECTION -->`` at the end of that section's ``##`` chapter (the ``gpu``
  table: never next to the cpu rows), re-made from the JSON file on every
  import, with the machine named.

Besides the rows (issue #50):

- the bundle's job (every finished or killed step's seconds against its
  estimate, the preflight's and the rates' seconds, the rates and the MFU
  variants) goes into ``reproduction/gpu_suite/state.json``
  (:mod:`osfl.suite.learn`): the next plan prices those steps, and their
  kinds of work, from it;
- the encoder a bundle returns (weights and card, checked) goes into
  ``reproduction/gpu_suite/`` (:mod:`osfl.suite.encoder`), which later
  leases carry;
- BENCHMARKS.md's GPU section gets a generated table of every imported
  job's measured ResNet-18, ViT-S/16 and ViT-Ti/16 training rates and MFU
  variants, with the machine (between ``<!-- osfl suite import: gpu -->``
  and its end marker).

A dry run's rows (scale ``dry-run``) and a dry run's plan are refused unless
asked for. Everything is checked before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osfl.errors import DataError
from osfl.suite.bundle import read_bundle, read_json
from osfl.suite.encoder import card_name, import_encoder, read_encoder_card
from osfl.suite.learn import STATE, add_job, job_record, read_state
from osfl.suite.rows import backbone_label
from osfl.suite.steps import ENCODER

#: REPRODUCTION.md's chapter (the start of its ``## `` heading) per suite section.
CHAPTERS = {
    "fafi": "## FAFI",
    "rlu": "## RLU",
    "fedmitr": "## FedMITR",
    "pretrain": "## FALCON",
    "frozen": "## FALCON",
    "mfu": "## FALCON",
    "eftvit": "## EFTViT",
}


def machine_of(rows: Sequence[dict[str, Any]], plan: dict[str, Any]) -> str:
    """The GPU, driver, CUDA, torch and dtype from the rows' provenance (else
    the plan's measured machine)."""
    for r in rows:
        p = r.get("provenance") or {}
        if p.get("gpu"):
            return (
                f"{p['gpu']}, driver {p.get('cuda_driver')}, CUDA {p.get('cuda')}, "
                f"torch {p.get('torch')}, dtype {p.get('dtype', 'see record')}"
            )
    return str(plan.get("machine") or "unknown machine")


def _key(e: dict[str, Any]) -> tuple[str, str, str]:
    return (e["row"], e["method"], e["point"])


def merge_rows(
    entries: list[dict[str, Any]], rows: Sequence[dict[str, Any]], machine: str
) -> list[dict[str, Any]]:
    """``entries`` (a per-seed file's) with ``rows`` merged in: a row's seeds
    join its headline row's entry (the same seed again replaces the value)."""
    by = {_key(e): e for e in entries}
    for r in rows:
        if r.get("ours") is None:
            continue
        key = (r.get("row") or r["step"], r["method"], r["setting"])
        e = by.setdefault(
            key,
            {
                "row": key[0],
                "method": key[1],
                "point": key[2],
                "accuracy": {},
                "steps": [],
                "commands": {},
            },
        )
        for seed, v in zip(r.get("seeds", [0] * len(r["per_seed"])), r["per_seed"], strict=True):
            if v is not None:
                e["accuracy"][str(seed)] = round(float(v), 4)
                e["commands"][str(seed)] = r["command"]
        if r["step"] not in e["steps"]:
            e["steps"].append(r["step"])
        e.update(
            section=r["section"],
            paper=r.get("paper"),
            unit=r.get("unit", "percent"),
            paper_note=r.get("paper_note", ""),
            scale_note=r.get("scale_note", ""),
            scale=r["scale"],
            machine=machine,
            backbone=r.get("backbone", ""),
        )
    for e in by.values():
        values = list(e["accuracy"].values())
        e["mean"] = round(statistics.mean(values), 4)
        e["std"] = round(statistics.stdev(values), 4) if len(values) > 1 else 0.0
    return list(by.values())


def _cell(v: float | None, unit: str) -> str:
    return "—" if v is None else f"{v:.3f}" if unit == "fraction" else f"{v:.2f}"


def section_markdown(section: str, entries: Sequence[dict[str, Any]], file: str) -> str:
    """The generated block of ``section``: a table of every entry (ours as
    mean ± std over its seeds, each seed's value), the machines, the notes."""
    begin, end = (
        f"<!-- osfl suite import: {section} -->",
        f"<!-- end osfl suite import: {section} -->",
    )
    lines = [
        begin,
        "",
        f"#### Scale `gpu`: `osfl suite` rows, {section} (generated by "
        f"`osfl suite import`; per-seed values: `{file}`)",
        "",
        "| row | method | setting | paper | ours | per seed | ours on | machine |",
        "|---|---|---|---:|---:|---|---|---|",
    ]
    for e in entries:
        unit = e.get("unit", "percent")
        vals = list(e["accuracy"].values())
        ours = _cell(e["mean"], unit)
        if len(vals) > 1:
            ours += f" ± {e['std']:.3f}" if unit == "fraction" else f" ± {e['std']:.2f}"
        seeds = ", ".join(f"{s}: {_cell(v, unit)}" for s, v in e["accuracy"].items())
        lines.append(
            f"| {e['row']} | {e['method']} | {e['point']} | {_cell(e.get('paper'), unit)} "
            f"| {ours} | {seeds} | {backbone_label(e)} | {e['machine']} |"
        )
    notes = sorted({(e.get("paper_note", ""), e.get("scale_note", "")) for e in entries})
    lines += [""] + [f"- Paper: {p or '—'}. Ours: {s or '—'}." for p, s in notes if p or s]
    commands = {c for e in entries for c in e.get("commands", {}).values()}
    lines += [f"- `{c}`" for c in sorted(commands)]
    return "\n".join([*lines, "", end]) + "\n"


def put_block(page: str, section: str, block: str, heading: str | None = None) -> str:
    """``page`` with ``section``'s generated block replaced, or added at the
    end of its chapter (``heading``, by default :data:`CHAPTERS`'; of the
    page when the chapter is absent)."""
    pattern = re.compile(
        rf"<!-- osfl suite import: {re.escape(section)} -->.*?"
        rf"<!-- end osfl suite import: {re.escape(section)} -->\n?",
        flags=re.S,
    )
    if pattern.search(page):
        return pattern.sub(lambda _: block, page, count=1)
    heading = CHAPTERS.get(section, "") if heading is None else heading
    start = page.find("\n" + heading) if heading else -1
    if start < 0:
        return page.rstrip("\n") + "\n\n" + block
    nxt = page.find("\n## ", start + 1)
    at = len(page) if nxt < 0 else nxt + 1
    return page[:at].rstrip("\n") + "\n\n" + block + "\n" + page[at:]


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


#: BENCHMARKS.md's chapter the measured rates go to.
BENCHMARKS_CHAPTER = "## On a lent GPU"


def _rate(v: Any) -> str:
    return f"{v:,.0f}" if isinstance(v, int | float) else "—"


def benchmarks_block(jobs: Sequence[dict[str, Any]]) -> str:
    """BENCHMARKS.md's generated table: each imported job's measured
    training rates (the suite's own micro-benchmarks, :mod:`osfl.suite.rates`)
    and MFU variants, with its machine."""
    lines = [
        "<!-- osfl suite import: gpu -->",
        "",
        f"### Measured by `osfl suite` jobs (generated by `osfl suite import`; `{STATE}`)",
        "",
        "Images per second of one training step (forward, cross-entropy, backward, "
        "optimizer) on random data, bf16 autocast, as each job's rates measured them "
        "(`osfl.suite.rates`); MFU of ViT-B/16 per variant of `osfl suite mfu`. Targets "
        "(issue #50): ResNet-18 at 45,000 images/s or more, ViT-B/16 at 40 % MFU or more.",
        "",
        "| job started | machine | ResNet-18, CIFAR 32 px, batch 256 | ViT-S/16, 224 px, "
        "batch 128 | ViT-Ti/16, 224 px, batch 256 | MFU, ViT-B/16 bf16 |",
        "|---|---|---:|---:|---:|---|",
    ]
    for j in jobs:
        r = j.get("rates") or {}
        mfu = (
            "; ".join(
                f"{m['variant']}: {m['mfu']:.1f} % ({m['tflops']:.0f} TFLOP/s, batch {m['batch']})"
                if m.get("mfu") is not None
                else f"{m['variant']}: — ({m['tflops']:.1f} TFLOP/s)"
                for m in j.get("mfu", [])
            )
            or "—"
        )
        lines.append(
            f"| {j.get('started')} | {j.get('machine')} | {_rate(r.get('resnet18_32'))} "
            f"| {_rate(r.get('vits16_224'))} | {_rate(r.get('vitti16_224'))} | {mfu} |"
        )
    return "\n".join([*lines, "", "<!-- end osfl suite import: gpu -->"]) + "\n"


def _mfu_of(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The MFU rows' variants, as the BENCHMARKS table shows them."""
    out = []
    for r in rows:
        if r["section"] != "mfu" or r.get("achieved_tflops") is None:
            continue
        variant = r["method"].partition("(")[2].rstrip(")") or r["method"]
        batch = str(r.get("setting", "")).removeprefix("batch ")
        out.append(
            {
                "variant": variant,
                "batch": batch,
                "mfu": r.get("ours"),
                "tflops": float(r["achieved_tflops"]),
                "images_per_s": r.get("images_per_s"),
            }
        )
    return out


def _check(
    bundle: Path, repo: Path, plan: dict[str, Any], rows: list[dict[str, Any]], allow_dry_run: bool
) -> None:
    """Everything an import reads, checked before anything is written."""
    dry = [r["step"] for r in rows if r["scale"] != "gpu"]
    if (dry or plan.get("dry_run")) and not allow_dry_run:
        raise DataError(
            f"{bundle}: a dry run's rows and plan are not imported; only a GPU job's are"
        )
    if not (repo / "REPRODUCTION.md").is_file():
        raise DataError(f"{repo} holds no REPRODUCTION.md: give the repository's root")
    weights = bundle / Path(ENCODER).name
    if weights.exists():
        read_encoder_card(bundle / card_name(weights.name), weights)
    read_state(repo)


def _prepare(
    bundle: Path, repo: Path, plan: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[dict[Path, str], dict[str, int]]:
    """Every file an import writes (path -> text), made in memory first."""
    rates = read_json(bundle / "rates.json", dict) if (bundle / "rates.json").exists() else {}
    page = (repo / "REPRODUCTION.md").read_text()
    machine = machine_of(rows, plan)
    writes: dict[Path, str] = {}
    counts: dict[str, int] = {}
    for section in dict.fromkeys(str(r["section"]) for r in rows):
        mine = [r for r in rows if r["section"] == section]
        path = repo / "reproduction" / f"gpu_suite_{section}.json"
        old = read_json(path, list) if path.is_file() else []
        entries = merge_rows(old, mine, machine)
        writes[path] = json.dumps(entries, indent=1) + "\n"
        page = put_block(
            page, section, section_markdown(section, entries, f"reproduction/{path.name}")
        )
        counts[section] = len(mine)
    writes[repo / "REPRODUCTION.md"] = page
    job = {**job_record(plan, rates), "machine": machine, "mfu": _mfu_of(rows)}
    if not job["started"]:  # a bundle from before jobs were stamped: keyed by its plan
        digest = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
        job["started"] = f"unstamped {digest[:12]}"
    state = add_job(read_state(repo), job)
    writes[repo / STATE] = json.dumps(state, indent=1) + "\n"
    bench = repo / "BENCHMARKS.md"
    if bench.is_file():
        block = benchmarks_block(state["jobs"])
        writes[bench] = put_block(bench.read_text(), "gpu", block, BENCHMARKS_CHAPTER)
    return writes, counts


def import_bundle(bundle: Path, repo: Path, *, allow_dry_run: bool = False) -> dict[str, int]:
    """Put ``bundle``'s rows into ``repo``'s ``reproduction/`` and
    REPRODUCTION.md, its job into the suite's state, its encoder (if any)
    into ``reproduction/gpu_suite/``, its rates and MFU into BENCHMARKS.md;
    returns the number of rows per section. A bundle whose content is not
    what a job writes is one :class:`DataError` line, before anything is
    written."""
    plan, rows = read_bundle(bundle)
    _check(bundle, repo, plan, rows, allow_dry_run)
    try:
        writes, counts = _prepare(bundle, repo, plan, rows)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{bundle} is damaged ({type(e).__name__}: {e})") from None
    for path, text in writes.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path, text)
    if import_encoder(bundle, repo) is not None:
        counts["encoder"] = 1
    return counts
