"""Small matplotlib helpers shared by :mod:`oblr.experiments.report` and :mod:`oblr.experiments.compare`.

Figures are built with ``matplotlib.figure.Figure`` and rendered by the Agg canvas directly, never through
``pyplot``: no global backend switch, no display needed, no figure left open in a user's session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["PALETTE", "Panel", "log_scale_ok", "new_figure", "prepare_log", "save_png"]

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22"]


@dataclass(frozen=True)
class Panel:
    """One axes: the metric keys drawn on it, the y label, log scale (used when the data span a decade
    or more, see :func:`log_scale_ok`), markers for sparse series."""

    keys: tuple[str, ...]
    ylabel: str
    log: bool = False
    markers: bool = False


def new_figure(n_panels: int, title: str, *, width: float = 8.0, panel_height: float = 2.6):
    """A Figure with ``n_panels`` stacked axes sharing the step axis; returns ``(fig, [axes])``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, 0.7 + panel_height * n_panels), dpi=100, layout="constrained")
    axes = fig.subplots(n_panels, 1, sharex=True, squeeze=False)[:, 0].tolist()
    fig.suptitle(title)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    return fig, axes


def save_png(fig, path: Path) -> Path:
    """Render with Agg and write ``path`` (parents created)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
    return path


def prepare_log(values: np.ndarray) -> np.ndarray:
    """For a log axis: non-positive values become NaN (drawn as gaps)."""
    return np.where(values > 0, values, np.nan)


def log_scale_ok(arrays: list[np.ndarray], min_ratio: float = 10.0) -> bool:
    """Whether a log axis helps: every array has a positive finite value and together the positive values
    span at least ``min_ratio`` (a decade). Narrower ranges read better on a linear axis."""
    pos = []
    for a in arrays:
        p = a[np.isfinite(a) & (a > 0)]
        if p.size == 0:
            return False
        pos.append(p)
    allpos = np.concatenate(pos)
    return bool(allpos.max() >= min_ratio * allpos.min())
