"""Metric sinks of a run: ``metrics.jsonl`` always, TensorBoard and Weights & Biases when asked.

File format (``run_dir/metrics.jsonl``): one strict-JSON object per line,
``{"step": int, "time": unix_seconds, "<namespace>/<key>": value, ...}`` (keys in docs/architecture.md).
Several lines may share a step (e.g. train metrics, then eval metrics of the same step); readers merge
them (:func:`oblr.tracking.runs.merge_by_step`). Steps never decrease within a file.

Non-finite floats. JSON has no NaN/Infinity, so a non-finite value is written as ``null`` and its
kind is recorded in a ``"_nonfinite": {"<key>": "nan" | "inf" | "-inf"}`` entry on the same line (present
only on lines that need it). Generic tools (jq, pandas) see a missing value; :func:`read_metrics`
restores the exact float (``nan``/``inf``/``-inf``) unless ``raw=True``.

Crash safety: every :meth:`MetricsLogger.log` writes its whole line with one ``write`` and flushes, so a
crash loses at most the line being written; :func:`read_metrics` drops such a truncated last line, and a
resumed run first moves it to ``metrics.jsonl.damaged`` (:func:`set_aside_damaged_tail`, said in a warning)
and re-runs its step.
Resuming (``resume=k``, or ``resume=True, resume_step=k``) rewrites the file atomically (temp file + rename) without the
lines of steps ``> k`` and without a truncated tail, so a resumed run never has duplicate steps.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

METRICS_FILE = "metrics.jsonl"
NONFINITE_KEY = "_nonfinite"
_RESERVED = ("step", "time", NONFINITE_KEY)
_WANDB_MODES = ("offline", "online", "disabled")

__all__ = ["METRICS_FILE", "MetricsLogger", "metrics_path", "read_metrics", "to_json_record"]


def metrics_path(path_or_run_dir: str | os.PathLike) -> Path:
    """``run_dir/metrics.jsonl`` for a folder, the path itself for a file."""
    p = Path(path_or_run_dir)
    return p / METRICS_FILE if p.is_dir() else p


# ----------------------------------------------------------------------------------------- conversion
def _tensor_values(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """Python scalars for tensor-valued metrics, with one device->host copy per device (not one per key)."""
    import torch

    by_device: dict[Any, list[tuple[str, Any]]] = {}
    for key, t in items:
        if t.numel() != 1:
            raise ValueError(f"metric {key!r}: tensor of shape {tuple(t.shape)}; log a scalar (0-d tensor)")
        by_device.setdefault(t.device, []).append((key, t))
    out: dict[str, Any] = {}
    for group in by_device.values():
        stacked = torch.stack([t.detach().reshape(()).to(torch.float64) for _, t in group]).cpu().tolist()
        for (key, t), v in zip(group, stacked):
            exact_int = not (t.is_floating_point() or t.is_complex()) and t.dtype != torch.bool
            out[key] = bool(v) if t.dtype == torch.bool else (int(v) if exact_int else v)
    return out


def _plain_value(key: str, v: Any) -> Any:
    """A JSON-able python value for one non-tensor metric (floats may still be non-finite)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, np.generic):  # numpy scalars, np.bool_ included
        return _plain_value(key, v.item())
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    if isinstance(v, np.ndarray):
        if v.size != 1:
            raise ValueError(f"metric {key!r}: array of shape {v.shape}; log a scalar")
        return _plain_value(key, v.reshape(()).item())
    raise TypeError(f"metric {key!r}: unsupported value type {type(v).__name__}; use a number, str, "
                    "bool, None or a 0-d tensor")


def to_json_record(step: int, metrics: dict, now: float | None = None) -> dict:
    """The dict written for one :meth:`MetricsLogger.log` call (see the module doc for non-finite values)."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if not isinstance(metrics, dict):
        raise TypeError(f"metrics must be a dict, got {type(metrics).__name__}")
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    tensors, values = [], {}
    for key, v in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"metric keys must be str, got {key!r}")
        if key in _RESERVED:
            raise ValueError(f"metric key {key!r} is reserved by the metrics.jsonl format")
        if torch is not None and isinstance(v, torch.Tensor):
            tensors.append((key, v))
        else:
            values[key] = _plain_value(key, v)
    if tensors:
        values.update(_tensor_values(tensors))
    record: dict[str, Any] = {"step": int(step), "time": time.time() if now is None else now}
    nonfinite: dict[str, str] = {}
    for key in metrics:  # keep the caller's key order
        v = values[key]
        if isinstance(v, float) and not math.isfinite(v):
            nonfinite[key] = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            v = None
        record[key] = v
    if nonfinite:
        record[NONFINITE_KEY] = nonfinite
    return record


# ------------------------------------------------------------------------------------------- reading
def _parse_lines(text: str, path: Path) -> list[dict]:
    """Parsed records of a metrics file; a bad *last* non-blank line (crash mid-write) is dropped."""
    lines = text.split("\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records: list[dict] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            if i == last:
                break  # truncated last line
            raise ValueError(f"{path}:{i + 1}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise ValueError(f"{path}:{i + 1}: expected a JSON object with an integer 'step'")
        records.append(rec)
    return records


def set_aside_damaged_tail(path: Path) -> tuple[int | None, str] | None:
    """If the last non-blank line of the metrics file ``path`` is not a record (a crash or a full disk
    mid-write), append it to ``<path>.damaged``, remove it from ``path`` (atomically) and return ``(its step
    if readable, its text)``; else None."""
    path = Path(path)
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    idx = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    if idx < 0:
        return None
    try:
        rec = json.loads(lines[idx])
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            return None
    except json.JSONDecodeError:
        pass
    bad = lines[idx]
    m = re.match(r'\s*\{\s*"step"\s*:\s*(\d+)', bad)
    with open(path.with_name(path.name + ".damaged"), "a", encoding="utf-8") as f:
        f.write(bad + "\n")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines[:idx]) + ("\n" if idx else ""))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return (int(m.group(1)) if m else None), bad


def _restore_nonfinite(rec: dict) -> dict:
    marks = rec.pop(NONFINITE_KEY, None)
    if marks:
        for key, kind in marks.items():
            rec[key] = float(kind)
    return rec


def read_metrics(path_or_run_dir: str | os.PathLike, *, raw: bool = False) -> list[dict]:
    """All records of a ``metrics.jsonl`` (file or run folder), in file order.

    A truncated last line (crash mid-write) is dropped; a bad line elsewhere raises ``ValueError`` with
    file and line number. Unless ``raw``, values written as ``null`` + ``_nonfinite`` become the original
    ``float('nan')``/``inf``.
    """
    path = metrics_path(path_or_run_dir)
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}")
    records = _parse_lines(path.read_text(encoding="utf-8"), path)
    return records if raw else [_restore_nonfinite(r) for r in records]


# ------------------------------------------------------------------------------------------- logging
class NullLogger:
    """What ranks other than 0 log to: nothing."""

    def log(self, step, metrics) -> None:
        pass

    def close(self) -> None:
        pass


class MetricsLogger:
    """Append-only metric sink for one run folder.

    >>> with MetricsLogger("runs/x") as log:
    ...     log.log(1, {"train/reward_mean": torch.tensor(0.5), "optim/lr": 1e-3})

    Resuming: ``resume=k`` (an int, the step of the checkpoint being resumed) or equivalently
    ``resume=True, resume_step=k``; lines with a step ``> k`` are removed first. Without ``resume`` an existing non-empty ``metrics.jsonl`` is an error
    (two runs would be mixed in one file). ``config`` is passed to W&B and written to TensorBoard as text.
    W&B cannot rewind a run: after a resume it ignores re-logged steps it has already seen.
    """

    def __init__(self, run_dir: str | os.PathLike, *, tensorboard: bool = False, wandb: bool = False,
                 wandb_project: str = "oblr", wandb_mode: str = "offline", config: dict | None = None,
                 resume: bool | int = False, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        if wandb and wandb_mode not in _WANDB_MODES:
            raise ValueError(f"wandb_mode must be one of {_WANDB_MODES}, got {wandb_mode!r}")
        if not isinstance(resume, bool):  # resume=<step>
            if resume_step is not None and resume_step != resume:
                raise ValueError(f"resume={resume!r} and resume_step={resume_step!r} disagree; pass one of them")
            resume, resume_step = True, resume
        if resume and (not isinstance(resume_step, int) or isinstance(resume_step, bool) or resume_step < 0):
            raise ValueError("MetricsLogger(resume=True) needs resume_step=<step of the checkpoint> (an int >= 0), "
                             f"got {resume_step!r}")
        if not resume and resume_step is not None:
            raise ValueError("resume_step is only meaningful with resume=True")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._last_step = -1
        if resume:
            self._last_step = self._truncate_after(resume_step)
        elif self.path.exists() and self.path.stat().st_size > 0:
            raise FileExistsError(f"{self.path} already holds metrics; pass resume=<checkpoint step> "
                                  "to continue that run, or use a new run folder")
        self._tb = self._open_tensorboard(config, resume_step) if tensorboard else None
        self._wandb_run = self._open_wandb(wandb_project, wandb_mode, config, resume) if wandb else None
        self._file = open(self.path, "a", encoding="utf-8")

    # -- resume
    def _truncate_after(self, step: int) -> int:
        """Atomically drop records with ``step > step`` and any truncated tail; return the last kept step."""
        if not self.path.exists():
            return -1
        records = _parse_lines(self.path.read_text(encoding="utf-8"), self.path)
        kept = [r for r in records if r["step"] <= step]
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return max((r["step"] for r in kept), default=-1)

    # -- optional sinks
    def _open_tensorboard(self, config: dict | None, resume_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("MetricsLogger(tensorboard=True) needs the tensorboard package: "
                              "pip install oblr[tensorboard]") from e
        # purge_step drops events logged after the checkpoint, the TensorBoard analogue of truncation
        purge = None if resume_step is None else resume_step + 1
        writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge)
        if config is not None and resume_step is None:
            writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
        return writer

    def _open_wandb(self, project: str, mode: str, config: dict | None, resume: bool):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("MetricsLogger(wandb=True) needs the wandb package: pip install oblr[wandb]") from e
        id_file = self.run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if resume and id_file.exists() else None
        run = wandb.init(project=project, dir=str(self.run_dir), mode=mode, config=config,
                         id=run_id, resume="allow" if run_id else None)
        if getattr(run, "id", None):
            id_file.write_text(str(run.id))
        return run

    # -- API
    def log(self, step: int, metrics: dict) -> dict:
        """Append one line ``{"step", "time", **metrics}``, flush it, and forward to the optional sinks.

        Values: python numbers, bool, str, None, numpy scalars or 1-element tensors (copied to the host
        with one transfer per device). Returns the record as written.
        """
        if self._file is None:
            raise RuntimeError(f"MetricsLogger for {self.run_dir} is closed")
        record = to_json_record(step, metrics)
        if record["step"] < self._last_step:
            raise ValueError(f"step {record['step']} is before the last logged step {self._last_step}; "
                             "steps in metrics.jsonl must not decrease")
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self._last_step = record["step"]
        if self._tb is not None or self._wandb_run is not None:
            numeric = {k: float(v) for k, v in _restore_nonfinite(dict(record)).items()
                       if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)}
            if self._tb is not None:
                for k, v in numeric.items():
                    self._tb.add_scalar(k, v, record["step"])
                self._tb.flush()
            if self._wandb_run is not None:
                self._wandb_run.log(numeric, step=record["step"])
        return record

    @property
    def last_step(self) -> int:
        """The largest step logged (or kept on resume); -1 when none."""
        return self._last_step

    def close(self) -> None:
        """Close every sink; safe to call twice."""
        if self._file is not None:
            f, self._file = self._file, None
            f.close()  # may raise (a full disk refuses the last buffered bytes); the logger is closed anyway
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
