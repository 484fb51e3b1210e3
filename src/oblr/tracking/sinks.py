"""What a training run writes its rows to, opened and closed together: ``metrics.jsonl`` (+ TensorBoard, W&B)
from rank 0 and nothing from the other ranks (:class:`~oblr.tracking.metrics.NullLogger`), and the progress
lines when the run is not quiet."""

from __future__ import annotations

from oblr.tracking.metrics import MetricsLogger, NullLogger
from oblr.tracking.progress import ProgressDisplay


def open_sinks(run_dir, cfg, *, main: bool, quiet: bool, resume_step: int | None):
    """``(logger, progress)`` of a run of ``cfg`` (a :class:`oblr.config.Config`); ``resume_step``: the step of
    the checkpoint it resumes from (later rows of metrics.jsonl are dropped), None for a new run."""
    logger = MetricsLogger(run_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb, config=cfg.to_dict(),
                           resume=False if resume_step is None else resume_step) if main else NullLogger()
    return logger, None if quiet else ProgressDisplay(cfg.train.steps)


def close_sinks(logger, progress) -> OSError | None:
    """Close both; the ``OSError`` of a last buffered write that was refused (a full disk), else None."""
    try:
        if progress:
            progress.close()
        logger.close()
    except OSError as e:
        return e
    return None
