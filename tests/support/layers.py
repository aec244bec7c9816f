"""The layer order of ``src/osfl``: the one statement of it, which
``tests/docs/test_imports.py`` checks the imports against and
``tests/docs/test_architecture_doc.py`` checks the docs against."""

from __future__ import annotations

#: layer of a module = the first matching prefix's rank (most specific first)
LAYERS: list[tuple[str, int]] = [
    ("osfl.cli", 10),
    ("osfl.commands", 10),
    ("osfl.flower_app", 10),
    ("osfl.runner", 9),
    ("osfl.suite", 9),
    ("osfl.experiment", 8),
    ("osfl.run_record", 8),
    ("osfl.audit_dir", 8),
    ("osfl.kept_model", 8),
    ("osfl.kept_files", 8),
    ("osfl.trackers", 5),
    ("osfl.assembly", 7),
    ("osfl.site_assembly", 7),
    ("osfl.methods", 6),
    ("osfl.privacy", 6),
    ("osfl.pretrain", 6),
    ("osfl.robustness", 6),
    ("osfl.parts", 6),
    ("osfl.config", 5),
    ("osfl.report", 5),
    ("osfl.scoreboard", 5),
    ("osfl.convergence", 0),
    ("osfl.record", 0),
    ("osfl.code_version", 0),
    ("osfl.rundir", 5),
    ("osfl.flower", 4),
    ("osfl.fl", 3),
    ("osfl.models", 2),
    ("osfl.data", 1),
    ("osfl.errors", 0),
    ("osfl.jsonio", 0),
    ("osfl.safe_read", 0),
    ("osfl.registry", 0),
    ("osfl.interrupts", 0),
]


def layer(module: str) -> int:
    if module == "osfl":  # the package's __init__: only the version string
        return 0
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return rank
    raise AssertionError(f"module {module} is in no layer: add it to LAYERS")
