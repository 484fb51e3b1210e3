"""One data-parallel policy-gradient accumulation with the semantics of one process on the global batch,
and the step's ``||gbar||^2`` and S, V (:func:`step_statistics`, their one owner).

Every rank holds its block of whole prompt groups (:mod:`oblr.distributed.layout`). Per step:

1. ``global_totals``: one all-gather of (sequences, response tokens, width) gives the global batch's
   :class:`~oblr.losses.BatchTotals`, so each rank's factors c_i are those of the global batch and the
   per-prompt estimates are scaled by the GLOBAL prompt count N;
2. :func:`oblr.update.accumulate_policy_gradient` on the rank's rows: w_i, advantages and leave-one-out
   baselines within each group (local), the rank's share ``sum_{i on rank} c_i A_i s_i`` of the gradient,
   and ``||g_k||^2`` of its own prompts;
3. ``parallel.reduce_grads``: ``.grad`` becomes the sum over ranks = the one-process gradient
   (ddp: bucketed all-reduce; fsdp: reduce-scatter into the shards);
4. the N per-prompt norms by an all-gather in rank (= prompt) order, then :func:`step_statistics`:
   ``||gbar||^2`` of the reduced gradient, summed once, and S, V, SNR by :func:`oblr.snr.snr_statistics`,
   broadcast from rank 0 so every rank sets bit-identical learning rates; the estimator's metrics from
   the gathered [N, G] estimate (as one process computes them), the others by one all-reduce.

In a single process every collective is the identity: step 2 on the whole batch, then step 4's
:func:`step_statistics` with ``||gbar||^2`` summed in float32 (:func:`oblr.params.params_grad_sq_norm`, as the
one-process step always has; ranks sum in float64). :func:`step_statistics` is also what the TRL and verl
adapters call on their reduced ``.grad``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from oblr.estimators import Estimate
from oblr.losses import BatchTotals
from oblr.params import params_grad_sq_norm, trainable_params
from oblr.snr import SNRStats, snr_statistics
from oblr.update import (
    UpdateResult,
    UpdateSettings,
    accumulate_clipped_gradient,
    accumulate_policy_gradient,
    step_kl_sums,
)

from .collectives import all_gather_cat, broadcast_, global_totals, grad_sq_norm, reduce_metrics
from .env import is_distributed


def step_statistics(params, per_prompt_sq_norms: torch.Tensor | None, n_prompts: int | None = None, *,
                    float64: bool = True) -> tuple[torch.Tensor, SNRStats | None]:
    """``(||gbar||^2, SNRStats or None)`` of a step whose gradient gbar is in ``.grad`` of ``params``.

    ``.grad`` must be the whole step's gradient (reduced over ranks; sharded DTensors are summed over
    their process group). ``per_prompt_sq_norms``: every prompt's ``||g_k||^2`` [N] in prompt order, or
    their 0-d sum over all ranks (then ``n_prompts``, the prompt count, is required), or None (no S, V).
    ``float64`` (default): ``||gbar||^2`` by :func:`oblr.distributed.collectives.grad_sq_norm` (float64)
    and S, V in float64; False: the float32 sum of :func:`oblr.params.grad_sq_norm` and S, V in the
    norms' own dtype -- one process of ``oblr train``, whose numbers have always been those. The squared
    norm is summed here once; nothing else re-sums it for the same step.
    """
    params = list(params)
    gsq = grad_sq_norm(params) if float64 else params_grad_sq_norm(params)
    if per_prompt_sq_norms is None:
        return gsq, None
    sq = per_prompt_sq_norms.double() if float64 else per_prompt_sq_norms
    return gsq, snr_statistics(sq, gsq, n_prompts)


@dataclass
class DataParallelUpdate:
    """The step's global statistics (equal on every rank) and this rank's own per-row results.

    ``update``: :class:`UpdateResult` whose ``advantages`` [N/W, G] and ``old_logprobs`` are this rank's,
    ``per_prompt_sq_norms`` the global [N] (prompt order) and ``metrics`` reduced over ranks.
    ``grad_sq`` = ``||gbar||^2`` of the reduced gradient (what the finite check and clipping read);
    ``snr``: the step's :class:`~oblr.snr.SNRStats` (S, V, SNR, signal), None when the settings need no SNR.
    """

    update: UpdateResult
    totals: BatchTotals
    n_prompts: int
    grad_sq: torch.Tensor
    snr: SNRStats | None = None


def gather_estimate(est: Estimate) -> Estimate:
    """The global batch's estimate: every rank's [N/W, G] tensors concatenated in rank (= prompt) order."""
    def cat(t):
        if t is None:
            return None
        if t.dtype == torch.bool:  # gloo gathers numbers
            return all_gather_cat(t.to(torch.uint8)).bool()
        return all_gather_cat(t.detach())

    return Estimate(cat(est.advantages), cat(est.baseline), cat(est.weights), cat(est.fallback))


def data_parallel_gradient(model, batch, rewards: torch.Tensor, settings: UpdateSettings, parallel, *,
                           ref_model=None) -> DataParallelUpdate:
    """Fill ``.grad`` with the global step's gradient and return the global statistics (see module doc).

    ``model``: what ``parallel.prepare`` returned; ``batch``/``rewards`` [N/W, G]: this rank's rows.
    """
    n_local, G = rewards.shape
    rm = batch.response_mask
    if not is_distributed():  # one process: the ordinary step, bit for bit
        res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref_model)
        grad_sq, stats = step_statistics(trainable_params(model), res.per_prompt_sq_norms, n_local, float64=False)
        return DataParallelUpdate(res, BatchTotals.of(rm), n_local, grad_sq, stats)
    totals = global_totals(rm)
    if totals.sequences % G:
        raise ValueError(f"the ranks hold {totals.sequences} sequences in all, not a multiple of G = {G}")
    N = totals.sequences // G
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref_model, totals=totals,
                                     grad_sink=parallel.grad_sink())
    params = trainable_params(model)
    parallel.reduce_grads(params)
    est_metrics = gather_estimate(res.estimate).metrics()
    metrics = reduce_metrics({k: v for k, v in res.metrics.items() if k not in est_metrics}, n_prompts=n_local,
                             n_prompts_total=N, tokens=float(rm.sum()), tokens_total=float(totals.tokens))
    metrics.update(est_metrics)
    gks = None if res.per_prompt_sq_norms is None else all_gather_cat(res.per_prompt_sq_norms)
    grad_sq, stats = step_statistics(params, gks, N)  # float64: S can be a small difference
    if stats is not None:  # rank 0's numbers on every rank: bit-identical learning rates
        vals = broadcast_(torch.stack([stats.S, stats.V, stats.snr, stats.signal, grad_sq.to(stats.S.device)]))
        stats = SNRStats(*vals[:4].unbind(), n=N)
        grad_sq = vals[4]
    else:
        grad_sq = broadcast_(grad_sq.reshape(1))[0]
    update = dataclasses.replace(res, per_prompt_sq_norms=gks, metrics=metrics)
    return DataParallelUpdate(update, totals, N, grad_sq, stats)


def data_parallel_clipped_gradient(model, batch, first: UpdateResult, settings: UpdateSettings, parallel,
                                   totals: BatchTotals) -> dict:
    """A later epoch (``epochs > 1``) on this rank's rows with the global factors, gradients reduced.

    ``first``/``totals``: the step's :attr:`DataParallelUpdate.update` and ``.totals``. Returns the rank's
    metrics (token means of the clip fraction, ratio and KL over its rows)."""
    metrics = accumulate_clipped_gradient(model, batch, first, settings, totals=totals)
    parallel.reduce_grads(trainable_params(model))
    return metrics


def data_parallel_step_kl(model, batch, old_logprobs: torch.Tensor, settings: UpdateSettings,
                          group_size: int, autocast=None, group=None, gather: bool = True) -> float:
    """The per-token KL(pi_old || pi_new) of the step just taken, over the global batch (``policy/step_kl``).

    Each rank sums k3 and its response tokens over its own rows (:func:`oblr.update.step_kl_sums`, one forward
    pass without gradients); the [W, 2] sums are gathered over ``group`` (None: the default group) and added in
    rank order, so every rank gets the same number (a schedule that reads it sets bit-identical lrs). 0.0 when
    the batch has no response token. Also the TRL adapter's measurement (``autocast``: its accelerator's) and
    verl's (``group``: the actor's data-parallel group; ``gather=False`` when it has none: this rank's rows)."""
    sums = step_kl_sums(model, batch, old_logprobs, settings, group_size, autocast).reshape(1, 2)
    if gather:
        sums = all_gather_cat(sums, group)
    kl, tokens = (float(x) for x in sums.sum(0))
    return kl / tokens if tokens > 0 else 0.0


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
