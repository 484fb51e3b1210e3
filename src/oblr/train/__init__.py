"""Training: the RL loop and what it needs around it.

- :mod:`oblr.train.trainer` -- :class:`Trainer` and :func:`train`, the RL loop that wires rollouts,
  rewards, the update, the learning-rate schedule, checkpoints and metrics;
- :mod:`oblr.train.setup` -- :class:`~oblr.train.setup.RunSetup`, the trainer's base class: a run's setup
  before the loop (task, memory plan, model, optimizer, schedule, resume, engine, sinks);
- :mod:`oblr.train.run_dir` -- create or resume a run folder; which config changes a resume accepts;
- :mod:`oblr.train.optimizers` -- the optimizers by name (``optim.optimizer``);
- :mod:`oblr.train.checkpoint` -- atomic checkpoints, RNG states, resume.

``Trainer``, ``TrainingError`` and ``train`` are imported from :mod:`oblr.train.trainer` on first use
(:mod:`oblr._lazy`), so the config's choices (``oblr.train.optimizers``) load without torch.
"""

from typing import TYPE_CHECKING

from oblr._lazy import lazy_exports

if TYPE_CHECKING:
    from oblr.train.trainer import Trainer, TrainingError, train

__all__ = ["Trainer", "TrainingError", "train"]
__getattr__, __dir__ = lazy_exports(__name__, {".trainer": __all__})
