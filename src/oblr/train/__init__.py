"""Training: the RL loop and what it needs around it.

- :mod:`oblr.train.trainer` -- :class:`Trainer` and :func:`train`, the RL loop that wires rollouts,
  rewards, the update, the learning-rate schedule, checkpoints and metrics;
- :mod:`oblr.train.run_dir` -- create or resume a run folder; which config changes a resume accepts;
- :mod:`oblr.train.optimizers` -- the optimizers by name (``optim.optimizer``);
- :mod:`oblr.train.checkpoint` -- atomic checkpoints, RNG states, resume.
"""

from oblr.train.trainer import Trainer, TrainingError, train

__all__ = ["Trainer", "TrainingError", "train"]
