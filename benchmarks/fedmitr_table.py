"""Collect reproduction runs into Markdown tables (REPRODUCTION.md: FedMITR, FAFI).

Reads the ``metrics.json`` of one or more run directories written by
``osfl run configs/fedmitr_*.yaml`` (or ``fafi_*``) and prints accuracy
(mean ± sample std over seeds) per (partition, method), with the server's
synthesis / distillation seconds and FLOPs (the ``server.phases`` that
data-free KD methods record). A method run under a swept method option (e.g.
``method.fedmitr={cls_filter: teacher}``) is its own column, labelled by the
options that differ from the method's defaults.

    python benchmarks/fedmitr_table.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from osfl.record import RunRecord
from osfl.report import read_metrics

ORDER = [
    "local",
    "fedavg",
    "fedftg",
    "dense",
    "coboosting",
    "adi",
    "deepinversion",
    "fedmitr",
    "fafi",
    "fafi_code",
    "ensemble",
]
#: options whose non-default value names a column (option -> default)
LABELLED = {
    "variant": "fedmitr",
    "cls_filter": "none",
    "mask_ratio": 0.3,
    "lambda1": 0.5,
    "kept_count": "remaining",
    "stopped_pixels": "frozen",
    "crop_scale": [0.2, 1.0],
    "proto_init_std": 1.0,
    "proto_update": "all",
}


def point_of(rec: RunRecord) -> str:
    p = rec.partition or {}
    params = p.get("params", {})
    if p.get("scheme") == "pathological":
        return f"#C={params.get('classes_per_client')}"
    return f"alpha={params.get('alpha')}"


def method_of(rec: RunRecord) -> str:
    name = rec.method
    cfg = rec.method_config or {}
    tags = [
        str(cfg[k]) if k == "variant" else f"{k}={cfg[k]}"
        for k, default in LABELLED.items()
        if k in cfg
        and cfg[k] != default
        and not (isinstance(cfg[k], tuple) and list(cfg[k]) == default)
    ]
    return f"{name}[{', '.join(tags)}]" if tags else name


def _rank(method: str) -> tuple[int, str]:
    base = method.split("[")[0]
    return (ORDER.index(base) if base in ORDER else len(ORDER), method)


def mean_std(values: list[float]) -> str:
    """``12.3`` for one seed, ``12.3 ± 1.2`` (sample std) for several."""
    if not values:
        return ""
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.1f}"
    std = (sum((x - mean) ** 2 for x in values) / (len(values) - 1)) ** 0.5
    return f"{mean:.1f} ± {std:.1f}"


def main(dirs: list[str]) -> None:
    acc: dict[tuple[str, str], list[float]] = defaultdict(list)
    phases: dict[str, dict] = {}
    for d in dirs:
        for rec in read_metrics(Path(d) / "metrics.json")["records"]:
            key = (point_of(rec), method_of(rec))
            acc[key].append(100 * float(rec.global_test_accuracy or 0.0))
            server = rec.extra("server", {}).get("phases", {})
            if server.get("flops"):
                phases[method_of(rec)] = server
    points = sorted({p for p, _ in acc})
    methods = sorted({m for _, m in acc}, key=_rank)
    print("| partition | " + " | ".join(methods) + " |")
    print("|---" * (len(methods) + 1) + "|")
    for p in points:
        cells = []
        for m in methods:
            v = acc.get((p, m))
            cells.append(mean_std(v))
        print(f"| {p} | " + " | ".join(cells) + " |")
    if phases:
        print(
            "\n| method | synthesis s | synthesis GFLOPs | distillation s | distillation GFLOPs |"
        )
        print("|---|---|---|---|---|")
        for m, ph in sorted(phases.items(), key=lambda kv: _rank(kv[0])):
            s, f = ph["seconds"], ph.get("flops", {})
            print(
                f"| {m} | {s.get('synthesis', 0):.1f} | {f.get('synthesis', 0) / 1e9:.1f} | "
                f"{s.get('distillation', 0):.1f} | {f.get('distillation', 0) / 1e9:.1f} |"
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or {"-h", "--help"} & set(args):
        print(__doc__)
        sys.exit(0 if args else 2)
    missing = [d for d in args if not (Path(d) / "metrics.json").is_file()]
    if missing:
        print(f"fedmitr_table.py: error: no metrics.json in {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)
    main(args)
