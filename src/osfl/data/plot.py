"""Heat map of a federation's per-client class counts.

The plot of "Label Distribution per Client under Dirichlet Partition" (FedMITR,
Fig. 3; the same figure appears in DENSE and Co-Boosting): clients along x,
classes along y, each cell coloured and annotated with the client's number of
samples of that class, so the skew a scheme produced is visible at a glance.

Drawn on a private ``matplotlib.figure.Figure`` with the Agg canvas, never
``pyplot``: no global backend switch, no figure left open, safe in tests and
worker processes.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import PowerNorm
from matplotlib.figure import Figure

from osfl.data.federation import Federation
from osfl.errors import DataError
from osfl.interrupts import atomic_section

MAX_ANNOTATED_CELLS = 600  # beyond this the numbers are unreadable; colour alone remains
MAX_TICKS = 40


def _ticks(n: int) -> np.ndarray:
    """At most ``MAX_TICKS`` evenly spaced tick positions out of ``n``."""
    step = max(1, int(np.ceil(n / MAX_TICKS)))
    return np.arange(0, n, step)


def _annotate(ax: Axes, counts: np.ndarray, vmax: int) -> None:
    """Write each non-zero count in its cell, white on the darkest cells (the
    colour scale's square root above 0.55) so it stays readable."""
    n_clients, n_classes = counts.shape
    fontsize = 8 if max(n_clients, n_classes) <= 20 else 6
    for c in range(n_clients):
        for k in range(n_classes):
            v = int(counts[c, k])
            if v == 0:
                continue
            dark = (v / vmax) ** 0.5 > 0.55
            ax.text(
                c,
                k,
                str(v),
                ha="center",
                va="center",
                fontsize=fontsize,
                color="white" if dark else "black",
            )


def _label_axes(
    ax: Axes, sizes: np.ndarray, names: list[str] | None, n_clients: int, n_classes: int
) -> None:
    """Ticks (at most :data:`MAX_TICKS` a side; a client's size under its
    number while there are at most 20) and a light grid between cells."""
    xt = _ticks(n_clients)
    ax.set_xticks(xt)
    ax.set_xticklabels([f"{c}\n{sizes[c]}" if n_clients <= 20 else str(c) for c in xt], fontsize=8)
    yt = _ticks(n_classes)
    ax.set_yticks(yt)
    ax.set_yticklabels([names[k] if names else str(k) for k in yt], fontsize=8)
    ax.set_xlabel("client (and its number of samples)" if n_clients <= 20 else "client")
    ax.set_ylabel("class")
    ax.set_xticks(np.arange(n_clients + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n_classes + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="0.9", linewidth=0.5)
    ax.tick_params(which="minor", length=0)


def plot_class_counts(
    federation: Federation,
    path: str | os.PathLike[str],
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write a PNG heat map of ``federation.class_counts`` to ``path``; return the path.

    Zero cells stay white so that which classes a client lacks stands out (the
    point of a non-IID split); a square-root colour scale keeps small counts
    visible next to large ones.
    """
    counts = np.asarray(federation.class_counts)
    n_clients, n_classes = counts.shape
    if class_names is not None and len(class_names) != n_classes:
        raise DataError(
            f"{len(class_names)} class names for {n_classes} classes; pass one name per class"
        )
    names = [str(c)[:14] for c in class_names] if class_names is not None else None

    width = float(np.clip(1.6 + 0.55 * n_clients, 4.0, 18.0))
    height = float(np.clip(1.6 + 0.32 * n_classes, 3.0, 12.0))
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    data = np.ma.masked_equal(counts.T, 0)  # classes x clients
    vmax = max(int(counts.max()) if counts.size else 1, 1)
    cmap = "YlGnBu"
    im = ax.imshow(
        data, aspect="auto", cmap=cmap, norm=PowerNorm(0.5, vmin=0, vmax=vmax), origin="upper"
    )
    ax.set_facecolor("white")
    fig.colorbar(im, ax=ax, label="samples", fraction=0.05, pad=0.02)

    if counts.size <= MAX_ANNOTATED_CELLS:
        _annotate(ax, counts, vmax)
    _label_axes(ax, federation.sizes, names, n_clients, n_classes)
    if title is None:
        params = ", ".join(f"{k}={v}" for k, v in federation.params.items() if v is not None)
        title = f"{federation.scheme}({params}), seed {federation.seed}"
    # A figure-level title, wrapped to the figure's width, is never clipped by
    # constrained layout (an axes title wider than a narrow heat map is).
    chars = max(20, int(width * 72 / 10 * 1.6))
    fig.suptitle(textwrap.fill(title, chars), fontsize=10)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_section():  # Ctrl-C never leaves half a PNG
        fig.savefig(path, format="png")
    return path
