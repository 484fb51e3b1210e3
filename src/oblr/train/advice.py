"""Warnings about settings that run but are likely mistakes, printed before a run starts: more threads than
CPU cores, and the ``auto`` learning-rate schedule with plain SGD (measured to fail, docs/algorithm.md)."""

from __future__ import annotations

import os


def settings_warnings(cfg) -> list[str]:
    """One line per doubtful setting of ``cfg`` (a :class:`oblr.config.Config`), in a fixed order."""
    out = []
    cores = os.cpu_count() or 1
    if cfg.train.threads > cores:
        out.append(f"train.threads={cfg.train.threads} exceeds this machine's {cores} CPU cores; threads "
                   f"will compete for them")
    if cfg.algorithm.lr_schedule == "auto" and cfg.optim.optimizer == "sgd":
        out.append("algorithm.lr_schedule=auto with optim.optimizer=sgd: measured to fail there (held-out accuracy "
                   "far below a tuned fixed rate, docs/algorithm.md); it is meant for AdamW")
    return out
