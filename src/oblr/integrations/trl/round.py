"""One generation batch through the book-keeping engine: exact w_i, advantages, and the gradient or its statistics.

The local rows of a TRL generation batch (prompt-major, whole groups of G completions) go through
:class:`oblr.gradnorm.BookKeeper` in chunks of whole groups. Per chunk: ONE forward and ONE
activation-only backward of ``l_i = sum_t response_mask[i,t] log pi_T(o_i,t | ...)`` (``pi_T``: logits
divided by the sampling temperature, the distribution the completions were drawn from), then

- ``w_i = c_i^2 ||s_i||^2`` (exact; or the proxy the estimator declares), ``c_i`` the per-sequence loss factor;
- ``A = oblr.estimators.compute_advantages(baseline, rewards, weights=w)`` (leave-one-out within each group);
- ``coeffs_i = -A_i c_i`` (d loss / d l_i) and, from the same records, either the weighted gradient
  ``sum_i coeffs_i s_i`` added into ``.grad`` (``assemble_grad``: the folded backward, no second pass) and/or
  the per-prompt squared norms ``||g_k||^2`` with ``g_k = N sum_{i in k} coeffs_i s_i`` (N = prompts over
  all processes), so that ``mean_k g_k`` is the full gradient and :func:`oblr.snr.snr_statistics` applies.

Nothing here knows about TRL or torch.distributed: the trainer feeds tensors in and reduces the results.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from oblr.estimators import compute_advantages, get_estimator
from oblr.gradnorm import length_weights, logit_energy_weights
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs, token_entropy


@dataclass
class RoundInputs:
    """Local rows of one generation batch. Rows prompt-major: row ``k*G + j`` is completion j of prompt k."""

    input_ids: torch.Tensor       # [B, T] prompt (left-padded) then completion (right-padded)
    attention_mask: torch.Tensor  # [B, T]
    response_mask: torch.Tensor   # [B, T] 1 on completion tokens that enter the loss
    rewards: torch.Tensor         # [n, G]
    seq_scale: torch.Tensor       # [B] c_i: the loss is -sum_i A_i c_i l_i


@dataclass
class RoundSettings:
    baseline: str                 # a name in oblr.estimators.available_estimators()
    temperature: float            # sampling temperature (the score is that of pi_T)
    rows_per_chunk: int           # rows per forward/backward, rounded down to whole groups (>= one group)
    n_prompts: int                # N: prompts of the generation batch over all processes
    assemble_grad: bool           # add sum_i coeffs_i s_i into .grad of the trainable parameters
    group_norms: bool             # compute ||g_k||^2 per prompt (needed by the SNR learning rate)


@dataclass
class RoundResult:
    weights: torch.Tensor | None        # [B] the w_i the baseline used (None for unweighted estimators)
    advantages: torch.Tensor            # [n, G]
    coeffs: torch.Tensor                # [B] d loss / d l_i = -A_i c_i
    group_sq_norms: torch.Tensor | None  # [n] ||g_k||^2, g_k = N sum_{i in k} coeffs_i s_i
    fallback_count: torch.Tensor        # 0-d: outputs whose weighted baseline fell back to the plain mean
    loss: torch.Tensor                  # 0-d: sum_i coeffs_i l_i (its gradient is what was assembled)
    entropy_sum: torch.Tensor           # 0-d: sum of per-token entropies of pi_T over response tokens


# per-output weights by the source an estimator declares: f(book, logits, ids, response_mask, c) -> [b]
_WEIGHTS = {
    "exact": lambda book, logits, ids, rm, c: book.sq_norms() * c.pow(2),  # ||c_i s_i||^2
    "logit_energy": lambda book, logits, ids, rm, c: logit_energy_weights(logits, ids, rm),
    "length": lambda book, logits, ids, rm, c: length_weights(rm),
}


def group_chunks(n_prompts: int, group_size: int, rows_per_chunk: int):
    """``(k0, k1, rows)``: prompts ``k0..k1-1`` and their row slice; whole groups, at least one per chunk."""
    per = max(1, rows_per_chunk // group_size)
    for k0 in range(0, n_prompts, per):
        k1 = min(n_prompts, k0 + per)
        yield k0, k1, slice(k0 * group_size, k1 * group_size)


def run_round(model, book, batch: RoundInputs, settings: RoundSettings, *, autocast=nullcontext) -> RoundResult:
    """Score the local generation batch, form the advantages, and assemble the gradient and/or its statistics.

    ``book`` is a :class:`oblr.gradnorm.BookKeeper` over ``model``'s trainable parameters. With
    ``assemble_grad`` the gradient of the loss ``sum_i coeffs_i l_i`` is ADDED to ``.grad``.
    """
    n, G = batch.rewards.shape
    if batch.input_ids.shape[0] != n * G:
        raise ValueError(f"{batch.input_ids.shape[0]} rows for rewards of shape {tuple(batch.rewards.shape)}")
    source = get_estimator(settings.baseline).weights
    rm_all = batch.response_mask.to(torch.float32)
    lengths = rm_all.sum(-1).view(n, G)
    inv_t = 1.0 / settings.temperature
    weights, advs, coeffs, gks = [], [], [], []
    dev = batch.input_ids.device
    fallback = torch.zeros((), dtype=torch.long, device=dev)
    loss = torch.zeros((), dtype=torch.float32, device=dev)
    ent = torch.zeros((), dtype=torch.float32, device=dev)
    for k0, k1, rows in group_chunks(n, G, settings.rows_per_chunk):
        ids, am, rm, c = batch.input_ids[rows], batch.attention_mask[rows], rm_all[rows], batch.seq_scale[rows]
        with book.record():
            with autocast():
                logits = forward_logits(model, ids, am)
            if inv_t != 1.0:
                logits = logits * inv_t
            seq_lp = sequence_logprobs(gather_logprobs(logits, ids), rm)
            book.backward(seq_lp)
        with torch.no_grad():
            ent = ent + (token_entropy(logits.detach()) * rm).sum()
        w = None if source is None else _WEIGHTS[source](book, logits.detach(), ids, rm, c).view(k1 - k0, G)
        del logits
        adv, m = compute_advantages(settings.baseline, batch.rewards[k0:k1], weights=w, lengths=lengths[k0:k1],
                                    return_metrics=True)
        co = -adv.reshape(-1).to(torch.float32) * c.to(torch.float32)
        groups = torch.arange(k1 - k0, device=co.device).repeat_interleave(G)
        gk = None
        if settings.assemble_grad and settings.group_norms:
            gk = book.accumulate_grad_with_group_norms(co, groups)
        elif settings.assemble_grad:
            book.accumulate_grad(co)
        elif settings.group_norms:
            gk = book.group_sq_norms(co, groups)
        book.clear()
        if gk is not None:
            gks.append(gk * float(settings.n_prompts) ** 2)
        loss = loss + (co * seq_lp.detach()).sum()
        fallback = fallback + m["baseline/fallback_count"].to(dev)
        weights.append(None if w is None else w.reshape(-1))
        advs.append(adv.detach())
        coeffs.append(co.detach())
    return RoundResult(
        weights=None if source is None else torch.cat(weights),
        advantages=torch.cat(advs),
        coeffs=torch.cat(coeffs),
        group_sq_norms=torch.cat(gks) if gks else None,
        fallback_count=fallback,
        loss=loss,
        entropy_sum=ent,
    )
