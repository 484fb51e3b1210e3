"""How a step's prompts are split over ranks: whole prompt groups, contiguous blocks, rank order = prompt order.

A step has N prompts with G samples each (rows prompt-major, row ``k*G + j``). Rank ``r`` of ``W`` gets the
contiguous block of prompts ``[r N/W, (r+1) N/W)`` and all ``G`` samples of each: the leave-one-out
baselines and the per-prompt norms ``||g_k||^2`` need a prompt's whole group in one backward pass.
Concatenating the ranks' blocks in rank order gives the one-process batch back, which is what makes an
all-gather of per-prompt quantities line up with the one-process step.

Refused with one line (:class:`~oblr.distributed.env.DistributedSetupError`): N not divisible by W (ranks
would hold unequal shares), a micro-batch that splits a group.
"""

from __future__ import annotations

import dataclasses

import torch

from .env import DistributedSetupError


def check_layout(n_prompts: int, group_size: int, world_size: int, *, micro_batch_groups: int = 0,
                 micro_batch_sequences: int | None = None) -> None:
    """Refuse a step layout that cannot give every rank an equal share of whole groups.

    ``micro_batch_groups``: groups per forward/backward micro-batch on a rank (0 = all of the rank's);
    ``micro_batch_sequences``: the same in sequences, for callers that count sequences (frameworks whose
    micro-batch is a number of rows): it must be a multiple of ``group_size``.
    """
    if world_size < 1:
        raise DistributedSetupError(f"world size must be >= 1, got {world_size}")
    if n_prompts < 1 or group_size < 1:
        raise DistributedSetupError(f"need N >= 1 prompts and G >= 1 samples per prompt, got N={n_prompts}, "
                                    f"G={group_size}")
    if n_prompts % world_size:
        raise DistributedSetupError(f"N = {n_prompts} prompts per step do not split over {world_size} ranks; "
                                    f"choose N divisible by the world size (e.g. {_multiple(n_prompts, world_size)})")
    if micro_batch_groups < 0:
        raise DistributedSetupError(f"micro_batch_groups must be >= 0 (0 = all at once), got {micro_batch_groups}")
    if micro_batch_sequences is not None and (micro_batch_sequences < 1 or micro_batch_sequences % group_size):
        raise DistributedSetupError(f"a micro-batch of {micro_batch_sequences} sequences splits the groups of "
                                    f"G = {group_size} samples (a prompt's whole group must be in one backward "
                                    f"pass for its norm ||g_k||^2); use a multiple of {group_size}")


def _multiple(n: int, w: int) -> int:
    return ((n + w - 1) // w) * w


def prompt_slice(n_prompts: int, world_size: int, rank: int) -> slice:
    """This rank's prompts of the step: the contiguous block ``[rank N/W, (rank+1) N/W)``."""
    check_layout(n_prompts, 1, world_size)
    if not 0 <= rank < world_size:
        raise DistributedSetupError(f"rank {rank} is outside a world of {world_size}")
    n = n_prompts // world_size
    return slice(rank * n, (rank + 1) * n)


def row_slice(n_prompts: int, group_size: int, world_size: int, rank: int) -> slice:
    """This rank's rows of a prompt-major batch of ``n_prompts * group_size`` rows."""
    p = prompt_slice(n_prompts, world_size, rank)
    return slice(p.start * group_size, p.stop * group_size)


def shard_rows(batch, rows: slice):
    """A copy of a batch (dataclass or namespace) with every per-row field cut to ``rows``.

    Per-row fields are tensors whose first dim is B and lists of length B (e.g. ``responses``); the others
    (``prompt_length``) are kept. B is the length of ``input_ids``.
    """
    B = batch.input_ids.shape[0]
    fields = dataclasses.asdict(batch) if dataclasses.is_dataclass(batch) else dict(vars(batch))
    cut = {}
    for k, v in fields.items():
        per_row = (isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == B) or \
                  (isinstance(v, list) and len(v) == B)
        cut[k] = v[rows] if per_row else v
    return dataclasses.replace(batch, **cut) if dataclasses.is_dataclass(batch) else type(batch)(**cut)


def split_evenly(n_items: int, world_size: int, rank: int) -> slice:
    """A contiguous share of ``n_items`` (e.g. evaluation prompts) for ``rank``; shares differ by at most 1.

    Concatenating the shares in rank order gives ``range(n_items)`` back (see
    :func:`oblr.distributed.collectives.all_gather_objects`).
    """
    if not 0 <= rank < world_size:
        raise DistributedSetupError(f"rank {rank} is outside a world of {world_size}")
    base, extra = divmod(n_items, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))
