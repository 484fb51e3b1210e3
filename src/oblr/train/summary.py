"""A run's ``summary.json``, built from what metrics.jsonl holds (the steps logged, the evaluations logged),
and the lines ``oblr train`` prints from it at the end."""

from __future__ import annotations

import json
from pathlib import Path

from oblr.provenance import code_identity
from oblr.train.checkpoint import write_text_atomic


def run_summary(run_dir, cfg, evals: list[dict], steps: int, wall: float, status: str = "completed") -> dict:
    """The summary of a run of ``cfg`` in ``run_dir``: ``steps`` logged, ``evals`` (the history's evaluations)."""
    s = {"run_dir": str(run_dir), "status": status, "baseline": cfg.algorithm.baseline,
         "lr_schedule": cfg.algorithm.lr_schedule, "seed": cfg.train.seed, "steps": steps,
         "wall_seconds": round(wall, 1), "eval_metric": "accuracy_sampled", "code": code_identity()}
    for kind in ("sampled", "greedy"):
        vals = [e[f"eval/accuracy_{kind}"] for e in evals if f"eval/accuracy_{kind}" in e]
        if vals:
            prefix = "eval_accuracy" if kind == "sampled" else "eval_accuracy_greedy"
            s[f"{prefix}_initial"], s[f"{prefix}_final"], s[f"{prefix}_best"] = vals[0], vals[-1], max(vals)
    return s


def write_summary(run_dir, summary: dict, *, best_effort: bool = False) -> None:
    """Write ``summary.json`` atomically; with ``best_effort`` a failing write (a full disk) is passed over."""
    try:
        write_text_atomic(Path(run_dir) / "summary.json", json.dumps(summary, indent=2) + "\n")
    except OSError:
        if not best_effort:
            raise


def summary_status(run_dir) -> str | None:
    """The ``status`` of a run folder's ``summary.json``: ``completed``, ``interrupted`` or ``failed`` as the trainer
    wrote it, ``unreadable`` for a file that does not parse, ``None`` without one (a summary from before the key
    existed counts as ``completed``). Only ``completed`` is a finished run: an interrupted or failed run writes a
    summary too, of the steps it did."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return None
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "unreadable"
    return str(s.get("status", "completed")) if isinstance(s, dict) else "unreadable"


def is_finished(run_dir) -> bool:
    """Whether the run in ``run_dir`` completed (:func:`summary_status` is ``completed``)."""
    return summary_status(run_dir) == "completed"


def summary_lines(s: dict) -> list[str]:
    """What the end of ``oblr train`` prints (each line after ``[oblr] ``)."""
    lines = [f"done: {s['steps']} steps in {s['wall_seconds']:.0f} s, run folder {s['run_dir']}"]
    for kind, prefix in (("sampled", "eval_accuracy"), ("greedy", "eval_accuracy_greedy")):
        if f"{prefix}_initial" in s:
            lines.append(f"held-out accuracy ({kind}): {100 * s[prefix + '_initial']:.1f}% -> "
                         f"{100 * s[prefix + '_final']:.1f}% (best {100 * s[prefix + '_best']:.1f}%)")
    if s.get("plots"):
        lines.append(f"plots: {Path(s['plots'][0]).parent}")
    return lines
