"""The one place where reductions across data-parallel ranks happen.

Every sum that a training step needs over the whole batch (rewards, norms, S and V) goes through
:func:`all_reduce_sum`. Without ``torch.distributed`` initialised it is the identity, so single-process
code and multi-rank code are the same code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all ranks (in place under torch.distributed) and return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
