"""Plots and summaries of run folders (``run_dir/metrics.jsonl``), and multi-seed comparisons.

- :func:`plot_run` -- PNG figures of one run into ``run_dir/plots/``;
- :func:`summarize_run` -- headline numbers of one run as a JSON-able dict;
- :func:`compare_runs`, :func:`run_label` -- tables and seed-band plots over many runs (:mod:`oblr.compare`).

Every figure and number is computed from the metric file; a key that a run did not log is skipped,
never an error. Statistic definitions are in :mod:`oblr.run_stats`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from oblr.plotting import PALETTE, Panel, log_scale_ok, new_figure, prepare_log, save_png
from oblr.run_stats import (
    auc_normalized,
    best,
    finite_series,
    last_finite,
    load_run,
    run_label,
    series,
    spike_count,
)

__all__ = ["RUN_PLOTS", "compare_runs", "plot_run", "run_label", "summarize_run"]

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


def _none_if_nan(v: float | None):
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else v


def summarize_run(run_dir: str | os.PathLike, *, spike_factor: float = 3.0, spike_window: int = 20) -> dict:
    """Headline numbers of one run (JSON-able; None where a metric was not logged).

    ``final_/best_/auc_accuracy_{sampled,greedy}`` (eval/accuracy_*; auc = time-averaged accuracy),
    ``best_step_*``; ``final_reward`` = mean ``train/reward_mean`` over the last 10% of its points;
    ``grad_norm_mean/max`` over finite values, ``grad_norm_spikes`` (see :func:`oblr.run_stats.spike_count`),
    ``nonfinite_grad_norms``, ``skipped_steps`` (sum of ``optim/skipped``), ``adv_var_mean``,
    ``weights_cv_mean``, ``snr_mean``, ``final_lr``, ``time_per_step_mean``, ``wall_time`` (seconds between
    the first and last line).
    """
    run_dir = Path(run_dir)
    rows = load_run(run_dir)
    out: dict = {"run_dir": str(run_dir), "label": run_label(run_dir), "steps": len(rows),
                 "first_step": rows[0]["step"] if rows else None, "last_step": rows[-1]["step"] if rows else None}
    for kind in ("sampled", "greedy"):
        s, v = series(rows, f"eval/accuracy_{kind}")
        b, b_step = best(s, v)
        out[f"final_accuracy_{kind}"] = _none_if_nan(last_finite(v))
        out[f"best_accuracy_{kind}"] = _none_if_nan(b)
        out[f"best_step_{kind}"] = b_step
        out[f"auc_accuracy_{kind}"] = _none_if_nan(auc_normalized(s, v))
    _, reward = finite_series(rows, "train/reward_mean")
    tail = reward[-max(1, math.ceil(0.1 * reward.size)):] if reward.size else reward
    out["final_reward"] = _none_if_nan(float(tail.mean())) if tail.size else None
    _, g_all = series(rows, "optim/grad_norm")
    g = g_all[np.isfinite(g_all)]
    out["grad_norm_mean"] = float(g.mean()) if g.size else None
    out["grad_norm_max"] = float(g.max()) if g.size else None
    out["grad_norm_spikes"] = spike_count(g, spike_factor, spike_window) if g.size else None
    out["nonfinite_grad_norms"] = int((~np.isfinite(g_all)).sum()) if g_all.size else None
    _, skipped = finite_series(rows, "optim/skipped")
    out["skipped_steps"] = int(skipped.sum()) if skipped.size else None
    for name, key in (("adv_var_mean", "adv/var_across_prompts"), ("weights_cv_mean", "weights/cv_within_group"),
                      ("snr_mean", "snr/snr"), ("time_per_step_mean", "time/step")):
        _, v = finite_series(rows, key)
        out[name] = float(v.mean()) if v.size else None
    _, lr = finite_series(rows, "optim/lr")
    out["final_lr"] = float(lr[-1]) if lr.size else None
    times = [r["time"] for r in rows if isinstance(r.get("time"), (int, float))]
    out["wall_time"] = float(max(times) - min(times)) if times else None
    return out


from oblr.compare import compare_runs
