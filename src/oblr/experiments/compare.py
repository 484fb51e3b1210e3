"""Compare methods over seeds: a table (markdown + CSV) and seed-band plots from run folders.

Runs are grouped (by default by :func:`oblr.experiments.stats.run_label` without the seed, i.e. baseline +
lr schedule), per-run statistics are computed from ``metrics.jsonl`` and aggregated per group as
``mean ± std`` over seeds (sample std, ddof=1; shown as a single value when a group has one run). With a
``reference`` group, every other group's final accuracy is tested against it by Welch's t-test over seeds
(:func:`oblr.experiments.stats.welch`, two-sided 5 %): ``beats`` / ``behind`` / ``within noise``, with the
difference of means ± its standard error; a side with one run gets the difference and no verdict.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from oblr.experiments.stats import (
    auc_normalized,
    best,
    config_value,
    finite_series,
    last_finite,
    load_run,
    run_config,
    run_label,
    series,
    spike_count,
    steps_to_target,
    welch,
)
from oblr.tracking.plots import PALETTE, log_scale_ok, new_figure, save_png

__all__ = ["ACCURACY_KEYS", "METRICS", "aggregate", "check_accuracy_key", "compare_runs", "run_stats",
           "versus_reference"]

# the default accuracy, in order of preference: the sampled one first (what `oblr train` calls its primary metric)
ACCURACY_KEYS = ("eval/accuracy_sampled", "eval/accuracy_greedy")
# per-run statistic -> column title
METRICS = {
    "final_acc": "final acc",
    "best_acc": "best acc",
    "auc_acc": "acc AUC (time-avg)",
    "steps_to_target": "steps to target",
    "final_reward": "final reward",
    "grad_norm": "grad norm (run mean)",
    "grad_norm_spikes": "grad norm spikes",
    "adv_var": "adv variance (run mean)",
}
# seed-band figures: file name -> (title, candidate keys (first present in any run wins), log y)
BAND_PLOTS = {
    "eval_accuracy": ("Held-out accuracy", None, False),
    "reward": ("Training reward (train/reward_mean)", ("train/reward_mean",), False),
    "grad_norm": ("Gradient norm before clipping (optim/grad_norm)", ("optim/grad_norm",), True),
    "lr": ("Learning rate", ("optim/lr", "snr/lr"), True),
    "snr": ("Gradient SNR (snr/snr)", ("snr/snr",), True),
}


def run_stats(rows: list[dict], acc_key: str | None, target: float | None, *, spike_factor: float = 3.0,
              spike_window: int = 20) -> dict:
    """Per-run statistics of :data:`METRICS` (NaN where absent; ``steps_to_target`` NaN if never reached)."""
    nan = math.nan
    out = dict.fromkeys(METRICS, nan)
    if acc_key is not None:
        s, v = series(rows, acc_key)
        out["final_acc"] = last_finite(v)
        out["best_acc"] = best(s, v)[0]
        out["auc_acc"] = auc_normalized(s, v)
        hit = steps_to_target(s, v, target) if target is not None else None
        out["steps_to_target"] = float(hit) if hit is not None else nan
    _, reward = finite_series(rows, "train/reward_mean")
    if reward.size:
        out["final_reward"] = float(reward[-max(1, math.ceil(0.1 * reward.size)):].mean())
    _, g = finite_series(rows, "optim/grad_norm")
    if g.size:
        out["grad_norm"] = float(g.mean())
        out["grad_norm_spikes"] = float(spike_count(g, spike_factor, spike_window))
    _, a = finite_series(rows, "adv/var_across_prompts")
    if a.size:
        out["adv_var"] = float(a.mean())
    return out


def aggregate(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof=1 (NaN for one value), count) over the finite values."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan, 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else math.nan, int(v.size)


def _grouper(group_by: Callable | str | None) -> Callable[[Path], str]:
    if group_by is None:
        return lambda d: run_label(d, with_seed=False)
    if callable(group_by):
        return lambda d: str(group_by(d))
    if isinstance(group_by, str):
        def by_key(d: Path) -> str:
            v = config_value(run_config(d), group_by)
            return f"{group_by}={v}" if v is not None else f"{group_by}=<unset>"
        return by_key
    raise TypeError(f"group_by must be None, a callable(run_dir) -> label, or a config key; got {group_by!r}")


def _fmt(mean: float, std: float, digits: int = 3) -> str:
    if not math.isfinite(mean):
        return "–"
    if abs(mean) >= 1e4 or (0 < abs(mean) < 1e-3):
        m = f"{mean:.2e}"
        return m if not math.isfinite(std) else f"{m} ± {std:.1e}"
    m = f"{mean:.{digits}f}"
    return m if not math.isfinite(std) else f"{m} ± {std:.{digits}f}"


def _write_markdown(path: Path, groups: list[dict], acc_key: str | None, target: float | None,
                    reference: str | None = None) -> None:
    ref = (f" Last column: each row's final accuracy against `{reference}` by Welch's t-test over seeds "
           "(two-sided 5 %; `beats` / `behind` beyond seed noise, else `within noise`; the difference of "
           "means ± its standard error and its 95 % interval, the differences the seeds do not rule out; a row "
           "or reference of one run: the difference, no verdict)."
           ) if reference else ""
    lines = ["# Run comparison\n",
             (f"Accuracy metric: `{acc_key}`; target accuracy: {target if target is None else f'{target:.3f}'}. "
              "Cells are mean ± std over seeds (sample std); `steps to target` averages the runs that reached "
              "it (reached/total in brackets); spikes: grad norm > factor × running median of previous "
              f"steps.{ref}\n"),
             "| group | runs | " + " | ".join(METRICS.values())
             + (f" | final acc vs {reference}" if reference else "") + " |",
             "|---|---:|" + "---:|" * len(METRICS) + ("---|" if reference else "")]
    for g in groups:
        cells = []
        for m in METRICS:
            digits = {"steps_to_target": 0, "grad_norm_spikes": 1}.get(m, 3)
            cell = _fmt(g[f"{m}_mean"], g[f"{m}_std"], digits)
            if m == "steps_to_target":
                cell += f" ({g['steps_to_target_n']}/{g['runs']})"
            cells.append(cell)
        if reference:
            cells.append(g["vs_reference"])
        lines.append(f"| {g['group']} | {g['runs']} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def versus_reference(finals: list[float], reference: list[float], is_reference: bool = False) -> dict:
    """A group's final accuracies against the reference group's: ``vs_reference`` (the table's text) and
    ``vs_reference_{diff,se,df,low,high,verdict}`` (NaN / "" where there is no test; low / high: the difference's
    confidence interval at the test's level, what the seeds do not rule out). Non-finite values (a run that
    never evaluated) are left out."""
    a = [x for x in finals if math.isfinite(x)]
    b = [x for x in reference if math.isfinite(x)]
    row = {"vs_reference": "", "vs_reference_diff": math.nan, "vs_reference_se": math.nan,
           "vs_reference_df": math.nan, "vs_reference_low": math.nan, "vs_reference_high": math.nan,
           "vs_reference_verdict": ""}
    if is_reference:
        row.update(vs_reference="reference", vs_reference_verdict="reference")
    elif not a or not b:
        row.update(vs_reference="no final accuracy")
    elif len(a) < 2 or len(b) < 2:
        diff = sum(a) / len(a) - sum(b) / len(b)
        row.update(vs_reference=f"{diff:+.3f} (one run; no verdict)", vs_reference_diff=diff)
    else:
        w = welch(a, b)
        lo, hi = w.interval
        row.update(vs_reference=f"{w.word} ({w.diff:+.3f} ± {w.se:.3f}; 95 %: {lo:+.3f} to {hi:+.3f})",
                   vs_reference_diff=w.diff, vs_reference_se=w.se, vs_reference_df=w.df, vs_reference_low=lo,
                   vs_reference_high=hi, vs_reference_verdict=w.word)
    return row


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})


def _band(runs_rows: list[list[dict]], key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the union of steps: (steps, mean, std) of ``key`` across the runs that logged each step
    (sample std, ddof=1, as in the table; 0 where only one run has the step)."""
    per_run = [finite_series(rows, key) for rows in runs_rows]
    steps = np.unique(np.concatenate([s for s, _ in per_run])) if per_run else np.zeros(0, np.int64)
    mat = np.full((len(per_run), steps.size), np.nan)
    for i, (s, v) in enumerate(per_run):
        mat[i, np.searchsorted(steps, s)] = v
    count = np.isfinite(mat).sum(0)
    keep = count > 0
    mat, steps = mat[:, keep], steps[keep]
    count = count[keep]
    if not steps.size:
        return steps, np.zeros(0), np.zeros(0)
    mean = np.nanmean(mat, axis=0)
    sq = np.nansum((mat - mean) ** 2, axis=0)
    std = np.sqrt(np.where(count > 1, sq / np.maximum(count - 1, 1), 0.0))
    return steps, mean, std


def _band_plot(path: Path, title: str, key: str, groups: dict[str, list[list[dict]]], log: bool) -> Path | None:
    bands = {g: _band(rr, key) for g, rr in groups.items()}
    bands = {g: b for g, b in bands.items() if b[0].size}
    if not bands:
        return None
    fig, (ax,) = new_figure(1, title, width=8.0, panel_height=4.2)
    use_log = log and log_scale_ok([m for _, m, _ in bands.values()])
    for i, (g, (steps, mean, std)) in enumerate(bands.items()):
        color = PALETTE[i % len(PALETTE)]
        lo, hi = mean - std, mean + std
        if use_log:
            lo = np.where(lo > 0, lo, mean)  # keep the band drawable on a log axis
        n = len(groups[g])
        ax.plot(steps, mean, color=color, lw=1.6, label=f"{g} (n={n})", marker="o" if steps.size <= 30 else None,
                ms=3.5)
        ax.fill_between(steps, lo, hi, color=color, alpha=0.2, lw=0)
    if use_log:
        ax.set_yscale("log")
    ax.set_ylabel(key)
    ax.legend(loc="best", fontsize=8, frameon=False)
    return save_png(fig, path)


def logged_keys(runs_rows: list[list[dict]]) -> list[str]:
    """Every numeric metric key that at least one of the runs logged, sorted."""
    keys = {k for rows in runs_rows for r in rows for k, v in r.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
    return sorted(keys)


def check_accuracy_key(runs_rows: list[list[dict]], accuracy_key: str | None) -> None:
    """Refuse (``ValueError``, one line) an accuracy key that no run logged, listing the ``eval/`` keys they
    did log (any logged key is accepted); None (the default choice) always passes."""
    if accuracy_key is None:
        return
    keys = logged_keys(runs_rows)
    if accuracy_key not in keys:
        evals = [k for k in keys if k.startswith("eval/")]
        raise ValueError(f"accuracy key {accuracy_key!r}: no run logged it; eval keys the runs logged: "
                         f"{', '.join(evals) or 'none'} (any logged metric key is accepted)")


def compare_runs(run_dirs: list[str | os.PathLike], out_dir: str | os.PathLike, *,
                 group_by: Callable | str | None = None, accuracy_key: str | None = None,
                 target: float | None = None, spike_factor: float = 3.0, spike_window: int = 20,
                 plots: bool = True, reference: str | None = None) -> dict:
    """Group runs, tabulate per-group mean ± std over seeds, and draw seed-band plots.

    ``group_by``: None (label = baseline+lr_schedule, seed dropped; see :func:`run_label`), a callable
    ``f(run_dir: Path) -> label``, or a dotted config.yaml key (``"algorithm.baseline"``).
    ``accuracy_key``: default the first of ``eval/accuracy_sampled``, ``eval/accuracy_greedy`` that every
    run logged (else the first any run logged); a key no run logged is refused (:func:`check_accuracy_key`). ``target``: default 0.9 x the best accuracy any run reached.
    Writes ``comparison.md``, ``comparison.csv`` (one row per group), ``comparison_runs.csv`` (one row per
    run) and ``compare_<name>.png`` seed-band plots (mean ± std over the group's runs at each step) into
    ``out_dir`` (``plots=False``: tables only). ``reference``: a group label; every group's final accuracy is
    tested against that group's (:func:`versus_reference`; a label that is no group is refused, naming the
    groups, before anything is written). Returns ``{"accuracy_key", "target", "groups": [rows], "runs": [rows], "files": [paths]}``;
    group rows hold ``<stat>_mean``, ``<stat>_std`` for each stat of :data:`METRICS`, plus ``steps_to_target_n``.
    """
    if not run_dirs:
        raise ValueError("compare_runs needs at least one run folder")
    dirs = [Path(d) for d in run_dirs]
    for d in dirs:
        if not (d / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{d}: no metrics.jsonl (is this a run folder?)")
    label_of = _grouper(group_by)
    loaded = [(d, label_of(d), load_run(d)) for d in dirs]
    check_accuracy_key([rows for _, _, rows in loaded], accuracy_key)
    if accuracy_key is None:
        has = [{k for k in ACCURACY_KEYS if np.isfinite(series(rows, k)[1]).any()} for _, _, rows in loaded]
        accuracy_key = next((k for k in ACCURACY_KEYS if all(k in h for h in has)),
                            next((k for k in ACCURACY_KEYS if any(k in h for h in has)), None))
    if target is None and accuracy_key is not None:
        bests = [best(*series(rows, accuracy_key))[0] for _, _, rows in loaded]
        bests = [b for b in bests if math.isfinite(b)]
        target = 0.9 * max(bests) if bests else None

    runs = []
    for d, group, rows in loaded:
        stats = run_stats(rows, accuracy_key, target, spike_factor=spike_factor, spike_window=spike_window)
        runs.append({"run_dir": str(d), "group": group, "label": run_label(d), "steps": len(rows), **stats})
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(r["group"], []).append(r)
    if reference is not None and reference not in groups:
        raise ValueError(f"reference {reference!r} is not a row of these runs; the rows: "
                         f"{', '.join(sorted(groups))}")
    table = []
    for g in sorted(groups):
        row: dict = {"group": g, "runs": len(groups[g])}
        for m in METRICS:
            mean, std, n = aggregate([r[m] for r in groups[g]])
            row[f"{m}_mean"], row[f"{m}_std"] = mean, std
            if m == "steps_to_target":
                row["steps_to_target_n"] = n
        if reference is not None:
            row.update(versus_reference([r["final_acc"] for r in groups[g]],
                                        [r["final_acc"] for r in groups[reference]], g == reference))
        table.append(row)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "comparison.md", out / "comparison.csv", out / "comparison_runs.csv"]
    _write_markdown(files[0], table, accuracy_key, target, reference)
    _write_csv(files[1], table)
    _write_csv(files[2], runs)
    rows_by_group = {g: [rows for _, gg, rows in loaded if gg == g] for g in sorted(groups)}
    for name, (title, keys, log) in (BAND_PLOTS.items() if plots else ()):
        if keys is None:  # the accuracy figure
            keys, title = (accuracy_key,), f"{title} ({accuracy_key})"
        key = next((k for k in keys if k and any(series(rows, k)[0].size for _, _, rows in loaded)), None)
        if key is None:
            continue
        p = _band_plot(out / f"compare_{name}.png", title, key, rows_by_group, log)
        if p is not None:
            files.append(p)
    return {"accuracy_key": accuracy_key, "target": target, "groups": table, "runs": runs,
            "files": [str(f) for f in files]}
