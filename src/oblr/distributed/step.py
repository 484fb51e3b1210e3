"""One data-parallel policy-gradient accumulation with the semantics of one process on the global batch.

Every rank holds its block of whole prompt groups (:mod:`oblr.distributed.layout`). Per step:

1. ``global_totals``: one all-gather of (sequences, response tokens, width) gives the global batch's
   :class:`~oblr.losses.BatchTotals`, so each rank's factors c_i are those of the global batch and the
   per-prompt estimates are scaled by the GLOBAL prompt count N;
2. :func:`oblr.update.accumulate_policy_gradient` on the rank's rows: w_i, advantages and leave-one-out
   baselines within each group (local), the rank's share ``sum_{i on rank} c_i A_i s_i`` of the gradient,
   and ``||g_k||^2`` of its own prompts;
3. ``parallel.reduce_grads``: ``.grad`` becomes the sum over ranks = the one-process gradient
   (ddp: bucketed all-reduce; fsdp: reduce-scatter into the shards);
4. ``||gbar||^2`` from the reduced gradient (:func:`~oblr.distributed.collectives.grad_sq_norm`), the N
   per-prompt norms by an all-gather in rank (= prompt) order, S, V, SNR by :func:`oblr.snr.signal_noise`,
   then broadcast from rank 0 so every rank sets bit-identical learning rates; metrics by one all-reduce.

In a single process every collective is the identity and this is :func:`accumulate_policy_gradient`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from oblr.losses import BatchTotals
from oblr.snr import signal_noise
from oblr.update import UpdateResult, UpdateSettings, accumulate_clipped_gradient, accumulate_policy_gradient

from .collectives import all_gather_cat, broadcast_, global_totals, grad_sq_norm, reduce_metrics


@dataclass
class DataParallelUpdate:
    """The step's global statistics (equal on every rank) and this rank's own per-row results.

    ``update``: :class:`UpdateResult` whose ``advantages`` [N/W, G] and ``old_logprobs`` are this rank's,
    ``per_prompt_sq_norms`` the global [N] (prompt order) and ``metrics`` reduced over ranks.
    ``grad_sq`` = ``||gbar||^2`` of the reduced gradient; S, V, SNR None when the settings need no SNR.
    """

    update: UpdateResult
    totals: BatchTotals
    n_prompts: int
    grad_sq: torch.Tensor
    S: torch.Tensor | None = None
    V: torch.Tensor | None = None
    snr: torch.Tensor | None = None


def trainable(model) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def data_parallel_gradient(model, batch, rewards: torch.Tensor, settings: UpdateSettings, parallel, *,
                           ref_model=None) -> DataParallelUpdate:
    """Fill ``.grad`` with the global step's gradient and return the global statistics (see module doc).

    ``model``: what ``parallel.prepare`` returned; ``batch``/``rewards`` [N/W, G]: this rank's rows.
    """
    n_local, G = rewards.shape
    rm = batch.response_mask
    totals = global_totals(rm)
    if totals.sequences % G:
        raise ValueError(f"the ranks hold {totals.sequences} sequences in all, not a multiple of G = {G}")
    N = totals.sequences // G
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref_model, totals=totals,
                                     grad_sink=parallel.grad_sink())
    params = trainable(model)
    parallel.reduce_grads(params)
    grad_sq = grad_sq_norm(params)
    metrics = reduce_metrics(res.metrics, n_prompts=n_local, n_prompts_total=N, tokens=float(rm.sum()),
                             tokens_total=float(totals.tokens))
    gks, S, V, snr = None, None, None, None
    if res.per_prompt_sq_norms is not None:
        gks = all_gather_cat(res.per_prompt_sq_norms)
        S, V, snr = signal_noise(gks.double(), grad_sq.to(gks.device), N)  # float64: S can be a small difference
        S, V, snr, grad_sq = broadcast_(torch.stack([S, V, snr, grad_sq.to(S.device)])).unbind()
    else:
        grad_sq = broadcast_(grad_sq.reshape(1))[0]
    update = dataclasses.replace(res, per_prompt_sq_norms=gks, metrics=metrics)
    return DataParallelUpdate(update, totals, N, grad_sq, S, V, snr)


def data_parallel_clipped_gradient(model, batch, advantages: torch.Tensor, old_logprobs: torch.Tensor,
                                   settings: UpdateSettings, parallel, totals: BatchTotals, *,
                                   ref_model=None) -> dict:
    """A later epoch (``epochs > 1``) on this rank's rows with the global factors, gradients reduced.

    ``totals``: the step's :attr:`DataParallelUpdate.totals`. Returns the rank's metrics (token means of
    the clip fraction and ratio over its rows)."""
    metrics = accumulate_clipped_gradient(model, batch, advantages, old_logprobs, settings, ref_model=ref_model,
                                          totals=totals)
    parallel.reduce_grads(trainable(model))
    return metrics


def clip_grads_(params, max_norm: float, grad_sq: torch.Tensor) -> torch.Tensor:
    """Scale every ``.grad`` by ``min(1, max_norm / (||grad|| + 1e-6))`` (torch's clip rule) using the global
    ``grad_sq``, so replicated and sharded gradients are clipped alike. Returns the norm before clipping."""
    norm = grad_sq.sqrt()
    coef = min(1.0, max_norm / (float(norm) + 1e-6))  # one host sync
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)
    return norm
