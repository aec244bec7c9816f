"""REPRODUCTION's Byzantine tables from the run directories of a robustness sweep.

Groups the records of an honest run directory and an attacked one (the
commands are in REPRODUCTION.md, "Byzantine robustness") by who defends
(``server.aggregator``, or the method and its member defence) and by the
attack (``byzantine.kind`` × ``pick`` × ``count``), prints the markdown tables
(mean ± sample std over seeds) and writes every per-seed accuracy to a JSON
file (the repository keeps them under ``reproduction/``).

    python benchmarks/byzantine_tables.py HONEST_DIR ATTACKED_DIR --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from osfl.record import RunRecord
from osfl.report import read_metrics

KINDS = ("sign_flip", "scale", "max", "random")
SETTINGS = (("smallest", 1), ("largest", 1), ("smallest", 2), ("largest", 2))
Attack = tuple[str, str, int] | None


def defender(record: RunRecord) -> str:
    """Who defends: the server's rule for the weight-averaging methods, else
    the method (with FAFI's fusion)."""
    if record.method == "fedavg":
        return str((record.server_rules or {})["aggregator"])
    if record.method in ("fafi", "fafi_code"):
        return f"{record.method} ({(record.method_config or {})['fusion']})"
    return record.method


def attack(record: RunRecord) -> Attack:
    b = record.extra("byzantine")
    return None if not b else (str(b["kind"]), str(b["pick"]), int(b["count"]))


def collect(*run_dirs: str) -> dict[tuple[str, Attack], dict[int, float]]:
    """(defender, attack) -> seed -> accuracy (%)."""
    out: dict[tuple[str, Attack], dict[int, float]] = defaultdict(dict)
    for d in run_dirs:
        for r in read_metrics(Path(d) / "metrics.json")["records"]:
            out[(defender(r), attack(r))][r.seed] = 100 * float(r.ranked_accuracy or 0.0)
    return out


def cell(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} ± {sd:.1f}"


def _summary_lines(
    per: Mapping[tuple[str, Attack], dict[int, float]],
    defenders: list[str],
    seeds: list[int],
    baseline: str,
) -> list[str]:
    """Each defender's worst attack per setting, as the gap to the honest
    ``baseline`` seed by seed (``own``: to the defender's own honest run)."""

    def base(d: str) -> dict[int, float]:
        return per[(d if baseline == "own" else baseline, None)]

    against = "its own honest run" if baseline == "own" else f"that seed's honest `{baseline}`"
    lines = [
        f"Worst attack per setting, as the mean over seeds {seeds} of (accuracy − {against}), "
        "in points:",
        "",
        "| defence | no attacker | " + " | ".join(f"{c} {p}" for p, c in SETTINGS) + " |",
        "|---|" + "---:|" * (1 + len(SETTINGS)),
    ]
    for d in defenders:
        row = [cell([per[(d, None)][s] for s in seeds])]
        for p, c in SETTINGS:
            gaps = {
                k: statistics.mean(per[(d, (k, p, c))][s] - base(d)[s] for s in seeds)
                for k in KINDS
            }
            worst = min(gaps, key=gaps.__getitem__)
            row.append(f"{gaps[worst]:+.1f} (`{worst}`)")
        lines.append(f"| `{d}` | " + " | ".join(row) + " |")
    return lines


def tables(per: Mapping[tuple[str, Attack], dict[int, float]], baseline: str) -> str:
    """A summary (:func:`_summary_lines`) and one table per attacker setting."""
    seeds = sorted(per[next(d for d, a in per if a is None), None])
    # a defender run honest only (e.g. the baseline re-run beside a new rule) has no rows
    defenders = list(dict.fromkeys(d for d, a in per if a is not None))
    lines = _summary_lines(per, defenders, seeds, baseline)
    for p, c in SETTINGS:
        lines += [
            "",
            f"{c} attacker(s) of 5, the {p}: accuracy (%), mean ± std over seeds",
            "",
            "| defence | " + " | ".join(f"`{k}`" for k in KINDS) + " |",
            "|---|" + "---:|" * len(KINDS),
        ]
        for d in defenders:
            cells = [cell([per[(d, (k, p, c))][s] for s in seeds]) for k in KINDS]
            lines.append(f"| `{d}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("honest")
    p.add_argument("attacked")
    p.add_argument("--baseline", default="mean", help="the honest row gaps are measured from")
    p.add_argument("--out", help="write the per-seed accuracies here (JSON)")
    args = p.parse_args()
    per = collect(args.honest, args.attacked)
    print(tables(per, args.baseline))
    if args.out:
        data = {
            f"{d}|{'honest' if a is None else '/'.join(map(str, a))}": {
                str(s): round(v, 4) for s, v in sorted(vals.items())
            }
            for (d, a), vals in sorted(per.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
        }
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
