"""Results of a run: ``metrics.json``, the mean ± std table (terminal and
``summary.md``) and the plots.

One *record* per (grid point, method, seed): :class:`osfl.record.RunRecord`,
its schema in ``docs/run-directory.md``. Split by job:

- :mod:`osfl.report.metrics`: ``metrics.json`` written and read back as typed,
  validated records;
- :mod:`osfl.report.tables`: the table of mean ± sample std over seeds, grouped
  by grid point and method, and the cost-to-accuracy table;
- :mod:`osfl.report.plots`: accuracy per round and the bytes–accuracy frontier.

The names below are the ones callers import from ``osfl.report``.
"""

from __future__ import annotations

from osfl.fl.upload import human_bytes  # the tables' and plots' byte format, as before
from osfl.record import RECORD_FIELDS, REQUIRED_FIELDS, RunRecord, record_problem
from osfl.report.metrics import SCHEMA_VERSION, machine_info, read_metrics, write_metrics
from osfl.report.plots import (
    LOG_AXIS_SPAN,
    NO_FEDERATION,
    curves_figure,
    frontier_figure,
    plot_curves,
    plot_frontier,
)
from osfl.report.tables import (
    CLIENTS_MEAN_MARK,
    Row,
    Stat,
    by_regime,
    clients_mean_note,
    convergence_markdown,
    group_warnings,
    mean_std_text,
    per_seed,
    regime_heading,
    rich_table,
    summarize,
    summary_markdown,
    table_rows,
    warning_lines,
)

__all__ = [
    "CLIENTS_MEAN_MARK",
    "LOG_AXIS_SPAN",
    "NO_FEDERATION",
    "RECORD_FIELDS",
    "REQUIRED_FIELDS",
    "SCHEMA_VERSION",
    "Row",
    "RunRecord",
    "Stat",
    "by_regime",
    "clients_mean_note",
    "convergence_markdown",
    "curves_figure",
    "frontier_figure",
    "group_warnings",
    "human_bytes",
    "machine_info",
    "mean_std_text",
    "per_seed",
    "plot_curves",
    "plot_frontier",
    "read_metrics",
    "record_problem",
    "regime_heading",
    "rich_table",
    "summarize",
    "summary_markdown",
    "table_rows",
    "warning_lines",
    "write_metrics",
]
