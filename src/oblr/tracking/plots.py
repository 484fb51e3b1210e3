"""Small matplotlib helpers shared by :mod:`oblr.experiments.report` and :mod:`oblr.experiments.compare`, and
the figures of one run (:func:`plot_run`, which the trainer calls at the end of a run).

Figures are built with ``matplotlib.figure.Figure`` and rendered by the Agg canvas directly, never through
``pyplot``: no global backend switch, no display needed, no figure left open in a user's session.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oblr.tracking.runs import load_run, run_label, series

__all__ = ["PALETTE", "RUN_PLOTS", "Panel", "log_scale_ok", "new_figure", "plot_run", "prepare_log", "save_png"]

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


# name -> (title, panels). Keys follow docs/architecture.md.
RUN_PLOTS: dict[str, tuple[str, tuple[Panel, ...]]] = {
    "reward": ("Training reward", (
        Panel(("train/reward_mean", "train/pass_rate", "train/pass_at_g"), "reward / share"),
        Panel(("train/all_equal_share",), "groups with equal rewards"),
    )),
    "eval_accuracy": ("Held-out accuracy", (
        Panel(("eval/accuracy_sampled", "eval/accuracy_greedy"), "accuracy", markers=True),
    )),
    "lr_snr": ("Learning rate and gradient signal-to-noise", (
        Panel(("optim/lr", "snr/lr"), "learning rate"),
        Panel(("snr/snr", "snr/n_snr"), "SNR", log=True),
        Panel(("snr/S", "snr/V"), "S, V", log=True),
        Panel(("snr/factor",), "S / (S + V/N)", log=True),
    )),
    "grad_norm": ("Gradient norms and sequence weights", (
        Panel(("optim/grad_norm",), "grad norm (before clip)", log=True),
        Panel(("weights/mean", "weights/std"), "w_i = ||s_i||^2", log=True),
        Panel(("weights/cv_within_group", "weights/max_over_mean"), "spread of w"),
    )),
    "advantages": ("Baselines and advantages", (
        Panel(("adv/var_across_prompts",), "advantage variance across prompts"),
        Panel(("adv/mean", "adv/std"), "advantage"),
        Panel(("baseline/fallback_count",), "baseline fallbacks"),
    )),
    "response": ("Responses", (
        Panel(("train/response_length_mean", "train/response_length_max", "eval/response_length_mean"),
              "tokens"),
        Panel(("train/entropy",), "entropy (nats/token)"),
        Panel(("train/truncated_share",), "truncated share"),
    )),
    "time": ("Time per phase", (
        Panel(("time/generate", "time/score", "time/norms", "time/update", "time/eval", "time/step"),
              "seconds"),
    )),
}


def _draw_panel(ax, rows: list[dict], panel: Panel) -> bool:
    """Draw every present key of ``panel``; False when none had a finite value."""
    drawn = []
    for i, key in enumerate(panel.keys):
        steps, vals = series(rows, key)
        if not np.isfinite(vals).any():
            continue
        drawn.append((key, steps, vals, PALETTE[i % len(PALETTE)]))
    if not drawn:
        return False
    use_log = panel.log and log_scale_ok([v for _, _, v, _ in drawn])
    for key, steps, vals, color in drawn:
        if use_log:
            vals = prepare_log(vals)
        sparse = panel.markers or np.isfinite(vals).sum() <= 30
        ax.plot(steps, vals, color=color, label=key, lw=1.4, marker="o" if sparse else None, ms=3.5)
    if use_log:
        ax.set_yscale("log")
    ax.set_ylabel(panel.ylabel)
    ax.legend(loc="best", fontsize=8, frameon=False)
    return True


def _mark_skipped(ax, rows: list[dict]) -> None:
    steps, vals = series(rows, "optim/skipped")
    for s in steps[np.nan_to_num(vals) > 0]:
        ax.axvline(s, color="#d62728", alpha=0.25, lw=1)


def plot_run(run_dir: str | os.PathLike, *, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write one PNG per entry of :data:`RUN_PLOTS` whose keys the run logged; returns the paths.

    Output: ``run_dir/plots/<name>.png`` (or ``out_dir``). Panels without data are left out; a figure with
    no panel left is not written. Skipped optimizer steps (``optim/skipped``) are shaded red on the
    gradient-norm figure. Log-scale panels (used when the data span a decade) show non-positive values as gaps.
    """
    run_dir = Path(run_dir)
    rows = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    label = run_label(run_dir)
    written: list[Path] = []
    for name, (title, panels) in RUN_PLOTS.items():
        present = [p for p in panels if any(np.isfinite(series(rows, k)[1]).any() for k in p.keys)]
        if not present:
            continue
        fig, axes = new_figure(len(present), f"{title} -- {label}")
        for ax, panel in zip(axes, present):
            _draw_panel(ax, rows, panel)
            if name == "grad_norm":
                _mark_skipped(ax, rows)
        written.append(save_png(fig, out / f"{name}.png"))
    return written
