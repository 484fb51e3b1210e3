"""The reductions a data-parallel step needs; each is the identity in a single process.

- :func:`all_reduce_sum`, :func:`all_gather_cat`, :func:`broadcast_`, :func:`all_gather_objects` -- thin,
  group-aware wrappers that do nothing without an initialised process group;
- :func:`global_totals` -- the global batch's :class:`~oblr.losses.BatchTotals` (sequences, response
  tokens, width) from one all-gather of three numbers;
- :func:`reduce_metrics` -- a step's metrics over ranks in one all-reduce: sums stay sums, per-prompt
  means become means over all prompts, per-token means become means over all tokens;
- :func:`all_reduce_grads` -- ``.grad`` of replicated parameters summed over ranks, in flat buckets of
  about ``bucket_mb`` MiB (one collective per bucket plus one for the gradient flags, all launched before
  the first wait);
- :func:`grad_sq_norm` -- ``||grad||^2`` of the whole model whether its ``.grad`` are plain tensors
  (replicated) or sharded DTensors (FSDP2).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from oblr.losses import BatchTotals
from oblr.params import sq_norm_sum

from .defaults import DEFAULT_BUCKET_MB
from .env import is_distributed

#: metrics that are sums over the batch (summed over ranks); keys ending in "count" are sums too
SUM_METRICS = frozenset({"optim/loss"})
#: metrics that are means over response tokens (weighted by each rank's tokens)
TOKEN_MEAN_METRICS = frozenset({"train/entropy", "actor/kl"})


def all_reduce_sum(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``tensor`` over all ranks (in place under torch.distributed) and return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_gather_cat(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """``cat([tensor of rank 0, tensor of rank 1, ...])`` along dim 0 (every rank's tensor has one shape)."""
    if not is_distributed():
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def broadcast_(tensor: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
    """Overwrite ``tensor`` with rank ``src``'s values (in place) and return it."""
    if is_distributed():
        dist.broadcast(tensor, src=src, group=group)
    return tensor


def all_gather_objects(items: list, group=None) -> list:
    """Concatenate every rank's list of picklable objects in rank order (e.g. evaluation results)."""
    if not is_distributed():
        return list(items)
    out: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, list(items), group=group)
    return [x for part in out for x in part]


def broadcast_object(obj, src: int = 0, group=None):
    """Rank ``src``'s picklable ``obj`` on every rank (e.g. a run folder name chosen on rank 0)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def global_totals(response_mask: torch.Tensor, group=None) -> BatchTotals:
    """The :class:`BatchTotals` of the batch made of every rank's rows: summed sequences and tokens, the
    largest width (equal to one process's width when the ranks hold column-aligned slices of one padded
    batch; pass ``max_len`` to ``seq_sum_const`` to make the width irrelevant). One all-gather, one sync."""
    local = torch.tensor([response_mask.shape[0], float(response_mask.sum()), response_mask.shape[-1]],
                         dtype=torch.float64, device=response_mask.device)
    every = all_gather_cat(local[None], group)  # [W, 3]
    return BatchTotals(int(every[:, 0].sum()), float(every[:, 1].sum()), int(every[:, 2].max()))


def reduce_metrics(metrics: dict, *, n_prompts: int, n_prompts_total: int, tokens: float, tokens_total: float,
                   group=None) -> dict:
    """The step's metrics over all ranks, from each rank's metrics over its own rows (one all-reduce).

    Sums (``SUM_METRICS``, keys ending in ``count``) are summed; per-token means (``TOKEN_MEAN_METRICS``)
    are weighted by each rank's response tokens; everything else is a mean over the rank's prompts and is
    weighted by ``n_prompts / n_prompts_total`` -- the way :mod:`oblr.update` merges micro-batches, so a
    rank counts as one micro-batch (a statistic that is not a mean, like a std, is the mean of the ranks'
    values). Every rank must hold the same keys. Values become 0-d float64 tensors.
    """
    if not metrics:
        return {}
    keys = sorted(metrics)
    device = next((v.device for v in metrics.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    vals = torch.stack([torch.as_tensor(metrics[k], dtype=torch.float64, device=device).reshape(()) for k in keys])

    def weight(k: str) -> float:
        if k in SUM_METRICS or k.endswith("count"):
            return 1.0
        if k in TOKEN_MEAN_METRICS:
            return tokens / max(tokens_total, 1.0)
        return n_prompts / n_prompts_total

    vals = all_reduce_sum(vals * torch.tensor([weight(k) for k in keys], dtype=torch.float64, device=device),
                          group)
    return dict(zip(keys, vals.unbind()))


def _buckets(tensors: list[torch.Tensor], bucket_bytes: int):
    bucket, size = [], 0
    for t in tensors:
        if bucket and (size + t.numel() * t.element_size() > bucket_bytes or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


def all_reduce_grads(params, *, bucket_mb: float = DEFAULT_BUCKET_MB, group=None) -> None:
    """``p.grad = sum over ranks of p.grad`` for replicated (plain-tensor) parameters, in flat buckets.

    Every trainable parameter has a slot in the buckets (zeros where this rank has no gradient), so all
    ranks reduce the same layout without agreeing on it first; a flag per parameter, all-reduced with the
    buckets, says which parameters have a gradient on some rank -- the others keep ``None``, as in one
    process. All collectives are launched asynchronously before the first wait; each bucket is flattened
    into one buffer and copied back.
    """
    params = [p for p in params if p.requires_grad]
    if not is_distributed() or not params:
        return
    flags = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
    flag_work = dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=group, async_op=True)
    pending = []
    for bucket in _buckets(params, int(bucket_mb * 2**20)):
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in bucket])
        pending.append((dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group, async_op=True), flat, bucket))
    flag_work.wait()
    present = iter(flags.tolist())
    for work, flat, bucket in pending:
        work.wait()
        offset = 0
        for p in bucket:
            g = flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()
            if not next(present):
                continue
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)


def _is_sharded(t: torch.Tensor) -> bool:
    return isinstance(t, DTensor) and any(pl.is_shard() for pl in t.placements)


def grad_sq_norm(params) -> torch.Tensor:
    """``sum_p ||p.grad||^2`` over the whole model: a float64 0-d tensor, the same on every rank.

    Sums of squares are taken in float64 (in chunks of ``2**22`` elements, so no float64 copy of a whole
    gradient is made): the summation order over parameters and shards then does not show at the
    precision S needs (S is a difference of nearly equal numbers when the noise dominates). Plain
    gradients (replicated, already reduced) count once; sharded DTensor gradients (FSDP2) contribute
    their local shards, summed over the shards' process group (one all-reduce).
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    dev = (grads[0].to_local() if isinstance(grads[0], DTensor) else grads[0]).device
    shards = [g for g in grads if _is_sharded(g)]
    plain = sq_norm_sum([g.to_local() if isinstance(g, DTensor) else g for g in grads if not _is_sharded(g)],
                        dtype=torch.float64, device=dev)
    sharded = sq_norm_sum([g.to_local() for g in shards], dtype=torch.float64, device=dev)
    if shards:
        dist.all_reduce(sharded, op=dist.ReduceOp.SUM, group=shards[-1].device_mesh.get_group())
    return plain + sharded
