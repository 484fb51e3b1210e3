"""Numbers from run folders: the statistics of a metric series that reports use.

Pure numpy, no plotting; :mod:`oblr.experiments.report` and :mod:`oblr.experiments.compare` build on it.
Reading a run folder (merged per-step records, a key's series, config.yaml, the run's label) is
:mod:`oblr.tracking.runs`; its names are exported here too.

Definitions (all over the *finite* values of a series, ordered by step):
- final: the last value;  best: the maximum and the first step reaching it;
- normalised AUC: ``trapz(values, steps) / (steps[-1] - steps[0])``, i.e. the time-average of the
  curve over the logged range (the single value when only one point exists);
- steps to target: the first step whose value is ``>= target`` (None when never reached);
- spikes: values ``v_t > factor * median(v_{t-window} .. v_{t-1})`` once at least ``min_history``
  earlier values exist (the running median of the *previous* values, so a spike does not hide itself).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from oblr.tracking.runs import config_value, load_run, merge_by_step, run_config, run_label, series

__all__ = [
    "auc_normalized",
    "best",
    "config_value",
    "finite_series",
    "last_finite",
    "load_run",
    "merge_by_step",
    "run_config",
    "run_label",
    "series",
    "spike_count",
    "split_by_settings",
    "steps_to_target",
]


def finite_series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`series` without NaN/Inf entries."""
    s, v = series(rows, key)
    ok = np.isfinite(v)
    return s[ok], v[ok]


def last_finite(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return float(v[-1]) if v.size else math.nan


def best(steps: np.ndarray, values: np.ndarray) -> tuple[float, int | None]:
    """(max finite value, first step reaching it); (nan, None) when there is none."""
    ok = np.isfinite(values)
    if not ok.any():
        return math.nan, None
    v, s = values[ok], steps[ok]
    i = int(np.argmax(v))
    return float(v[i]), int(s[i])


def auc_normalized(steps: np.ndarray, values: np.ndarray) -> float:
    """Time-averaged value ``trapz(values, steps) / (steps[-1] - steps[0])`` over finite points."""
    ok = np.isfinite(values)
    s, v = steps[ok].astype(np.float64), values[ok]
    if v.size == 0:
        return math.nan
    if v.size == 1 or s[-1] == s[0]:
        return float(v.mean())
    area = float(np.sum((v[1:] + v[:-1]) * np.diff(s)) / 2.0)
    return area / float(s[-1] - s[0])


def steps_to_target(steps: np.ndarray, values: np.ndarray, target: float) -> int | None:
    """First step with ``value >= target``; None when never reached (or target is NaN)."""
    if target is None or not math.isfinite(target):
        return None
    hit = np.nonzero(np.isfinite(values) & (values >= target))[0]
    return int(steps[hit[0]]) if hit.size else None


def spike_count(values: np.ndarray, factor: float = 3.0, window: int = 20, min_history: int = 5) -> int:
    """Number of finite values above ``factor`` x the median of up to ``window`` previous finite values."""
    if window < 1 or min_history < 1:
        raise ValueError(f"window and min_history must be >= 1, got {window}, {min_history}")
    v = values[np.isfinite(values)]
    count = 0
    for t in range(min_history, v.size):
        if v[t] > factor * float(np.median(v[max(0, t - window):t])):
            count += 1
    return count


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def split_by_settings(labels: dict, settings: dict) -> tuple[dict, dict[str, list[str]]]:
    """Keep runs that share a row label but differ in settings in separate rows.

    ``labels``: run -> row label; ``settings``: run -> flat ``{dotted key: value}`` of what the run was asked to
    do (the seed and output paths left out), or None when unknown (no config.yaml). Returns ``(rows, differ)``:
    ``rows`` maps each run to its row label -- the label itself where all runs of the label share their
    settings, else ``"<label> [k=v, ...]"`` over the keys that differ (a key a run lacks counts as a value of
    its own; ``[no config.yaml]`` for runs of unknown settings) -- and ``differ`` maps each label whose runs
    differ to those keys, sorted (``"config.yaml"`` among them when only some runs have one).
    """
    missing = "<unset>"
    by_label: dict[str, list] = {}
    for run, label in labels.items():
        by_label.setdefault(label, []).append(run)
    rows, differ = {}, {}
    for label, runs in by_label.items():
        known = [r for r in runs if settings.get(r) is not None]
        keys = sorted({k for r in known for k in settings[r]})
        keys = [k for k in keys if len({_canon(settings[r].get(k, missing)) for r in known}) > 1]
        unknown = len(known) < len(runs)
        if not keys and not (unknown and known):
            rows.update((r, label) for r in runs)
            continue
        differ[label] = sorted([*keys, *(["config.yaml"] if unknown and known else [])])
        used: dict[str, str] = {}  # row label -> the settings it stands for (two settings never share a label)
        for r in runs:
            if settings.get(r) is None:
                fingerprint, name = "", f"{label} [no config.yaml]"
            else:
                values = [(k, settings[r].get(k, missing)) for k in keys]
                fingerprint = _canon(values)
                name = f"{label} [" + ", ".join(f"{k}={_short_value(v)}" for k, v in values) + "]" if keys else label
            base, i = name, 2
            while used.setdefault(name, fingerprint) != fingerprint:
                name, i = f"{base} #{i}", i + 1
            rows[r] = name
    return rows, differ


def _short_value(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else _canon(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
