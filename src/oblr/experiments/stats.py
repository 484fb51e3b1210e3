"""Numbers from run folders: merged per-step records, metric series, and the statistics that reports use.

Pure numpy, no plotting; :mod:`oblr.experiments.report` and :mod:`oblr.experiments.compare` build on it.

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
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from oblr.tracking import read_metrics

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


def merge_by_step(records: Iterable[dict]) -> list[dict]:
    """One dict per step, ascending; lines sharing a step are merged (a later line's value wins)."""
    merged: dict[int, dict] = {}
    for rec in records:
        merged.setdefault(int(rec["step"]), {}).update(rec)
    return [merged[s] for s in sorted(merged)]


def _as_float(v: Any) -> float | None:
    if v is None:
        return math.nan
    if isinstance(v, (int, float)):  # bool included: 0/1 flags plot fine
        return float(v)
    return None  # strings and other non-numbers are not a series value


def series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(steps [n] int64, values [n] float64)`` over the rows that contain ``key``; null -> NaN."""
    steps, vals = [], []
    for row in rows:
        if key in row:
            v = _as_float(row[key])
            if v is not None:
                steps.append(int(row["step"]))
                vals.append(v)
    return np.asarray(steps, dtype=np.int64), np.asarray(vals, dtype=np.float64)


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


# -------------------------------------------------------------------------------------- run folders
def load_run(run_dir: str | os.PathLike) -> list[dict]:
    """Merged per-step rows of ``run_dir/metrics.jsonl`` (non-finite values restored as floats)."""
    return merge_by_step(read_metrics(run_dir))


def run_config(run_dir: str | os.PathLike) -> dict:
    """``run_dir/config.yaml`` as a dict ({} when absent)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return {}
    from oblr.safe_load import load_yaml_file

    cfg = load_yaml_file(path, what="run config")  # an InputError (a ValueError) names the file and line
    if cfg is None:
        return {}
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(cfg).__name__}")
    return cfg


_MISSING = object()


def config_value(cfg: dict, dotted: str, default: Any = None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``; a flat ``cfg["a.b"]`` key is accepted too."""
    if dotted in cfg:
        return cfg[dotted]
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


_SEED_SUFFIX = re.compile(r"[-_.]?seed[-_=]?\d+$", re.IGNORECASE)


def run_label(run_dir: str | os.PathLike, *, with_seed: bool = True) -> str:
    """A readable name for a run, used to group seeds in comparisons.

    First found wins: ``label`` in config.yaml, ``label`` in summary.json, then
    ``"<algorithm.baseline>+<algorithm.lr_schedule>"`` (either part alone if only one is set), else the
    folder name. ``with_seed`` appends ``" seed=<seed>"`` from config.yaml; without it a folder-name label
    loses a trailing ``-seed3`` / ``_seed_3`` suffix so seeds of one setting share a label.
    """
    run_dir = Path(run_dir)
    cfg = run_config(run_dir)
    seed = config_value(cfg, "train.seed", config_value(cfg, "seed"))
    label = cfg.get("label")
    if label is None and (run_dir / "summary.json").is_file():
        try:
            label = json.loads((run_dir / "summary.json").read_text(encoding="utf-8")).get("label")
        except (json.JSONDecodeError, AttributeError):
            label = None
    if label is None:
        parts = [config_value(cfg, k) for k in ("algorithm.baseline", "algorithm.lr_schedule")]
        parts = [str(p) for p in parts if p is not None]
        label = "+".join(parts) if parts else None
    if label is None:
        name = run_dir.resolve().name
        return name if with_seed else (_SEED_SUFFIX.sub("", name) or name)
    label = str(label)
    return f"{label} seed={seed}" if with_seed and seed is not None else label


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
