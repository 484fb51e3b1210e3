"""Adapters that put OBLR-PO inside other RL frameworks.

- :mod:`oblr.integrations.trl` -- ``OBLRGRPOConfig`` / ``OBLRGRPOTrainer``, drop-in subclasses of TRL's
  ``GRPOConfig`` / ``GRPOTrainer`` (install with ``pip install "trl>=1.16,<1.17" accelerate``; see docs/trl.md).
- :mod:`oblr.integrations.verl` -- the ``oblr`` advantage estimator and policy loss, registered in verl's
  registries on import (install with ``pip install "oblr[verl]"``; see docs/verl.md).

Nothing is imported here, so ``import oblr.integrations`` never needs an optional framework.
"""
