"""Per-rank seeds: a run is reproducible for a given world size, and ranks never share a sampling stream.

Model initialisation and data order use the run's seed on every rank (every replica starts equal; the
step's N prompts depend only on (seed, step) and are then split by rank). What each rank samples
(rollouts) uses :func:`rank_seed`: the run's seed itself on rank 0 -- so a one-process run is unchanged --
and a well-mixed, distinct 63-bit seed on every other rank.
"""

from __future__ import annotations

import random

import torch

_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def rank_seed(seed: int, rank: int) -> int:
    """The sampling seed of ``rank`` in a run seeded with ``seed``: ``seed`` on rank 0, a mixed one elsewhere."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    if rank == 0:
        return int(seed)
    return _splitmix64((int(seed) & _MASK) ^ _splitmix64(rank)) >> 1


def seed_all(seed: int) -> None:
    """Seed torch (CPU and every CUDA device), Python's ``random`` and NumPy (if installed)."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (1 << 32))
    except ImportError:  # pragma: no cover
        pass


def seed_rank(seed: int, rank: int) -> int:
    """Seed every generator with :func:`rank_seed` (call after the model is built, before sampling)."""
    s = rank_seed(seed, rank)
    seed_all(s)
    return s
