"""Reading a run folder: the per-step rows of its ``metrics.jsonl`` merged by step, one key's series, its
``config.yaml`` and a readable label. The trainer's end-of-run figures (:func:`oblr.tracking.plots.plot_run`)
and the reports over many runs (:mod:`oblr.experiments`) read runs through these.
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

from oblr.tracking.metrics import read_metrics

__all__ = ["config_value", "load_run", "merge_by_step", "run_config", "run_label", "series"]


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
