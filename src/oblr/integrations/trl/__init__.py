"""OBLR-PO inside TRL: ``OBLRGRPOConfig`` and ``OBLRGRPOTrainer``, drop-in for ``GRPOConfig``/``GRPOTrainer``.

Whose code: oblr's -- the import guard and the two exported classes; TRL's -- everything they inherit
(generation, rewards, logging, checkpointing, accelerate/DeepSpeed). No private TRL name is touched here
(docs/integrations_private_api.md lists those of the trainer).

::

    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    args = OBLRGRPOConfig(output_dir="out", per_device_train_batch_size=16, num_generations=8, learning_rate=1e-4)
    OBLRGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds).train()

- :mod:`.config` -- the config, its added fields and the refused settings (``RULES``);
- :mod:`.trainer` -- the trainer: each generation batch goes through oblr's update core
  (:func:`oblr.update.accumulate_policy_gradient`, as in ``oblr train``); folded backward without DeepSpeed,
  TRL's backward with it;
- :mod:`.lr` -- the trainer's learning-rate half: oblr's schedule as its ``lr_scheduler`` (``snr``,
  ``snr_adam``, ``auto``, ``kl``), set before each optimizer step; the ``kl`` schedule's step KL after it.

Needs ``pip install "trl>=1.16,<1.17" accelerate`` (a pinned TRL); see docs/trl.md.
"""

try:
    import trl  # noqa: F401
except ModuleNotFoundError as e:  # pragma: no cover - depends on the environment
    if e.name != "trl":
        raise
    raise ModuleNotFoundError('oblr.integrations.trl needs TRL: pip install "trl>=1.16,<1.17" accelerate', name="trl") from None

from .config import RULES, OBLRGRPOConfig, refusal
from .trainer import OBLRGRPOTrainer

__all__ = ["RULES", "OBLRGRPOConfig", "OBLRGRPOTrainer", "refusal"]
