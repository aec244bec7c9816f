"""How much the CPU's kernel path moves a number (issue "The README's two
commands pass on any clean machine").

One machine reaches several of the kernel paths other machines take by
capping the libraries before torch loads: ``ONEDNN_MAX_CPU_ISA`` (oneDNN's
convolutions), ``ATEN_CPU_CAPABILITY`` (ATen's vectorised kernels),
``MKL_CBWR`` (MKL's GEMM branch). :data:`LEVELS` names the ones this script
runs; each gives another CPU fingerprint (``osfl.fl.fingerprint``).

Two modes::

    # an osfl command ({out} is a fresh directory per level): every record's
    # accuracy per level and each method's spread (max - min) over the levels
    python benchmarks/kernel_spread.py run --levels native,avx2,sse41 -- \\
        osfl run --no-progress --out {out} cache_dir=null

    # the documented blocks: each block's command under each level, every
    # documented decimal's value there, merged into FILE under this machine's
    # fingerprint (the docs' tolerances come from these: benchmarks/doc_tolerances.py)
    python benchmarks/kernel_spread.py docs --levels native,avx2,sse41 \\
        --json reproduction/kernel_spread_docs.json README.md docs/methods/kd.md

``--json FILE`` keeps the per-level values (``reproduction/kernel_spread_*.json``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from osfl.report import read_metrics

ROOT = Path(__file__).resolve().parents[1]

#: Kernel paths one x86-64 machine with AVX-512 can reach, by the variables
#: that cap them (each is read before torch's first op).
LEVELS: dict[str, dict[str, str]] = {
    "native": {},
    "onednn-avx512_core": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    "sse41": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    # OSFL_CPU_KERNELS=portable (convolutions off oneDNN, ATen at AVX2) under
    # each MKL branch that matters for it: COMPATIBLE (portable's own since
    # issue 55), AVX2 (portable's before it: Intel-only, so AMD ran AUTO) and AUTO
    "portable": {"OSFL_CPU_KERNELS": "portable", "MKL_CBWR": "COMPATIBLE"},
    "portable-avx2": {"OSFL_CPU_KERNELS": "portable", "MKL_CBWR": "AVX2"},
    "portable-auto": {"OSFL_CPU_KERNELS": "portable", "MKL_CBWR": "AUTO"},
}


def _env(level: str) -> dict[str, str]:
    if level not in LEVELS:
        raise SystemExit(f"unknown level {level!r}; known: {', '.join(LEVELS)}")
    env = {k: v for k, v in os.environ.items() if k not in {k for e in LEVELS.values() for k in e}}
    return {**env, **LEVELS[level], "COLUMNS": "160"}


def accuracies(metrics: Path) -> dict[str, list[float]]:
    """``point/method`` → the records' accuracies (%) in seed order."""
    out: dict[str, list[float]] = {}
    for r in sorted(read_metrics(metrics)["records"], key=lambda r: r.seed):
        if r.ranked_accuracy is None:
            continue
        key = f"{r.point}/{r.method}".lstrip("/")
        out.setdefault(key, []).append(round(100 * r.ranked_accuracy, 2))
    return out


def run_mode(levels: list[str], command: list[str]) -> dict[str, dict[str, list[float]]]:
    """Each level's accuracies for ``command`` (``{out}`` replaced)."""
    found = {}
    for level in levels:
        with tempfile.TemporaryDirectory(prefix="spread-") as tmp:
            argv = [a.replace("{out}", f"{tmp}/run") for a in command]
            proc = subprocess.run(argv, env=_env(level), cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{level}: {' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
            found[level] = accuracies(Path(tmp) / "run" / "metrics.json")
        print(level, json.dumps(found[level]), flush=True)
    return found


def spread_table(found: dict[str, dict[str, list[float]]]) -> str:
    """Markdown: per row, the mean over seeds at each level and max - min."""
    levels = list(found)
    rows = sorted({k for v in found.values() for k in v})
    lines = [
        "| row | " + " | ".join(levels) + " | spread |",
        "|---|" + "---:|" * (len(levels) + 1),
    ]
    for row in rows:
        means = [statistics.mean(found[lv][row]) for lv in levels if row in found[lv]]
        cells = [
            f"{statistics.mean(found[lv][row]):.2f}" if row in found[lv] else "" for lv in levels
        ]
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {max(means) - min(means):.2f} |")
    return "\n".join(lines)


def _check_docs():
    """scripts/check_docs.py as a module (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts" / "check_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_docs"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_FINGERPRINT = (
    "from osfl.fl.fingerprint import cpu_fingerprint, fingerprint_id; "
    "print(fingerprint_id(cpu_fingerprint()))"
)


def docs_mode(
    levels: list[str], files: list[str], keyword: str | None
) -> dict[str, dict[str, dict[str, list[str]]]]:
    """``block → "MACHINE level" → row → decimals``: each marked block's
    command run under each level (its environment is the commands'), every
    documented row's decimals as it printed them (``check_docs.row_values``),
    keyed by the machine (its fingerprint on the native path) and the level."""
    check = _check_docs()
    found: dict[str, dict[str, dict[str, list[str]]]] = {}
    saved = dict(os.environ)
    fp = subprocess.run([sys.executable, "-c", _FINGERPRINT], env=_env("native"),
                        capture_output=True, text=True, check=True).stdout.split()[-1]  # fmt: skip
    for level in levels:
        env = _env(level)
        os.environ.clear()
        os.environ.update(env)
        try:
            for name in files:
                path = (ROOT / name).resolve()
                lines = path.read_text().splitlines()
                for block in check.blocks(path):
                    if keyword and keyword not in block.command:
                        continue
                    documented = "\n".join(lines[block.start : block.end])
                    values = check.row_values(documented, check.run(block))
                    found.setdefault(f"{name}: {block.command}", {})[f"{fp} {level}"] = values
                    print(f"{fp} {level} {name}: {block.command[:50]}: {values}", flush=True)
        finally:
            os.environ.clear()
            os.environ.update(saved)
    return found


def merge_docs(path: Path, found: dict[str, dict[str, dict[str, list[str]]]]) -> dict:
    """``found`` merged into the JSON at ``path`` (its ``blocks.*.values``;
    a path measured again replaces the earlier values)."""
    doc = json.loads(path.read_text()) if path.exists() else {"blocks": {}}
    for block, paths in found.items():
        doc["blocks"].setdefault(block, {}).setdefault("values", {}).update(paths)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["run", "docs"])
    p.add_argument("--levels", default=",".join(LEVELS), help="comma-separated, from LEVELS")
    p.add_argument("--json", help="write the per-level values here")
    p.add_argument("-k", dest="keyword", help="docs mode: only blocks whose command has this")
    p.add_argument("rest", nargs="*", help="run: -- COMMAND; docs: FILES")
    args = p.parse_intermixed_args(argv)
    levels = [lv for lv in args.levels.split(",") if lv]
    rest = args.rest
    if args.mode == "run":
        if not rest:
            raise SystemExit("run mode needs -- COMMAND (with {out})")
        found = run_mode(levels, rest)
        print(spread_table(found))
        result = {"command": " ".join(rest), "levels": LEVELS, "accuracy": found}
    else:
        found = docs_mode(levels, rest, args.keyword)
        result = merge_docs(Path(args.json), found) if args.json else found
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
