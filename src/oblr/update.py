"""One policy-gradient accumulation: rollouts and rewards in, ``.grad`` filled, statistics out.

This is the piece the trainer, the cost benchmark and the framework adapters share. Two paths, chosen by
what the estimator and the schedule need, never by a method name:

- book-keeping path (exact weights or SNR statistics needed): per micro-batch of whole prompt groups, ONE
  forward and ONE backward of ``sum_i l_i`` with :class:`oblr.gradnorm.BookKeeper` recording each layer's
  inputs and output gradients; then ``w_i`` (exact), advantages, and from the same records the weighted
  gradient ``sum_i c_i s_i`` into ``.grad`` and the per-prompt squared norms ``||g_k||^2`` for the SNR;
- plain path (proxy or no weights, no SNR): forward, advantages, the policy loss, one ordinary backward,
  exactly a GRPO step.

On the first (on-policy) update the importance ratio is 1 and clipping is inactive, so both paths give
the gradient of :func:`oblr.losses.policy_loss`; later epochs (``epochs > 1``) go through
:func:`accumulate_clipped_gradient` with the stored old log-probs.

A data-parallel rank calls the same functions on its shard of whole prompt groups with ``totals`` (the
global batch's :class:`~oblr.losses.BatchTotals`, so the factors c_i and the scale of g_k are those of
the global batch) and, under FSDP2, a ``grad_sink`` that sends the book-keeping gradient to the sharded
``.grad`` (:mod:`oblr.distributed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from oblr.estimators import compute_advantages, get_estimator
from oblr.gradnorm import BookKeeper, length_weights, logit_energy_weights
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs, token_entropy
from oblr.losses import BatchTotals, policy_loss, sequence_scale


@dataclass
class UpdateSettings:
    baseline: str = "oblr"
    baseline_options: dict = field(default_factory=dict)
    aggregation: str = "seq_sum_const"
    max_len: int | None = None
    need_snr: bool = True
    norms_method: str = "auto"
    micro_batch_groups: int = 0  # 0 = the whole batch at once
    clip_eps: float = 0.2
    kl_coef: float = 0.0


@dataclass
class UpdateResult:
    advantages: torch.Tensor                # [N, G]
    old_logprobs: torch.Tensor              # [B, T] token log-probs of the rollout policy (detached)
    per_prompt_sq_norms: torch.Tensor | None  # [N] ||g_k||^2, g_k scaled so that mean_k g_k = .grad
    metrics: dict


# per-output weights w_i by the source an estimator declares (``get_estimator(name).weights``):
# f(book, logits, input_ids, response_mask, seq_scale) -> [b]
_WEIGHT_SOURCES = {
    # squared norm of the per-sequence gradient the chosen aggregation produces: c_i^2 ||s_i||^2
    "exact": lambda book, logits, ids, rm, c: book.sq_norms() * c.pow(2),
    "logit_energy": lambda book, logits, ids, rm, c: logit_energy_weights(logits.detach(), ids, rm),
    "length": lambda book, logits, ids, rm, c: length_weights(rm),
}


def _micro_batches(n_prompts: int, group_size: int, groups_per_mb: int):
    step = groups_per_mb if groups_per_mb > 0 else n_prompts
    for k0 in range(0, n_prompts, step):
        k1 = min(n_prompts, k0 + step)
        yield k0, k1, slice(k0 * group_size, k1 * group_size)


def _entropy_sum(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return (token_entropy(logits.detach()) * response_mask).sum()


def accumulate_policy_gradient(model, batch, rewards: torch.Tensor, settings: UpdateSettings,
                               *, ref_model=None, totals: BatchTotals | None = None,
                               grad_sink=None) -> UpdateResult:
    """Add the policy-gradient of the loss to ``.grad`` of the trainable parameters.

    ``batch`` has ``input_ids``, ``attention_mask``, ``response_mask`` [B, T] (rows prompt-major,
    B = N*G) and ``response_lengths`` [B]; ``rewards`` is [N, G]. The loss is
    ``sum_i -A_i c_i l_i`` with c_i from :func:`oblr.losses.sequence_scale`; exact weights are
    ``w_i = c_i^2 ||s_i||^2``, the squared norm of the per-sequence gradient that aggregation produces.

    ``totals``: the batch these rows belong to (default: these rows); with ``N_tot = totals.sequences / G``
    prompts, c_i are the global batch's factors and ``per_prompt_sq_norms`` are ``||N_tot h_k||^2``.
    ``grad_sink(param, increment)``: where the book-keeping path puts each parameter's gradient
    increment (default ``param.grad += increment``; see :class:`oblr.gradnorm.BookKeeper`).
    """
    N, G = rewards.shape
    ids, am, rm = batch.input_ids, batch.attention_mask, batch.response_mask
    rmf = rm.to(torch.float32)
    scale = sequence_scale(rmf, settings.aggregation, max_len=settings.max_len, totals=totals)  # [B]
    n_total = N if totals is None else totals.sequences // G
    lengths = batch.response_lengths.to(torch.float32).view(N, G)
    source = get_estimator(settings.baseline).weights
    use_book = source == "exact" or settings.need_snr
    book = BookKeeper(model, method=settings.norms_method, grad_sink=grad_sink) if use_book else None

    advs, old_lps, gks, est_metrics = [], [], [], []
    loss_sum = rmf.new_zeros(())
    ent_sum = rmf.new_zeros(())
    for k0, k1, rows in _micro_batches(N, G, settings.micro_batch_groups):
        r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], scale[rows]
        if book is not None:
            with book.record():
                logits = forward_logits(model, ids[rows], am[rows])
                tok_lp = gather_logprobs(logits, ids[rows])
                seq_lp = sequence_logprobs(tok_lp, rm_mb)
                book.backward(seq_lp)
        else:
            logits = forward_logits(model, ids[rows], am[rows])
            tok_lp = gather_logprobs(logits, ids[rows])
        ent_sum = ent_sum + _entropy_sum(logits, rm_mb)

        weights = None
        if source is not None:
            weights = _WEIGHT_SOURCES[source](book, logits, ids[rows], rm_mb, c_mb).view(k1 - k0, G)
        adv, m = compute_advantages(settings.baseline, r_mb, weights=weights, lengths=lengths[k0:k1],
                                    return_metrics=True, **settings.baseline_options)
        est_metrics.append((k1 - k0, m))
        coeffs = -adv.reshape(-1).to(torch.float32) * c_mb  # d loss / d l_i

        if book is not None:
            if settings.need_snr:  # .grad and ||g_k||^2 (g_k = N sum_{i in k} coeffs_i s_i) from one pass
                local_groups = torch.arange(k1 - k0, device=coeffs.device).repeat_interleave(G)
                gks.append(book.accumulate_grad_with_group_norms(coeffs, local_groups) * (n_total * n_total))
            else:
                book.accumulate_grad(coeffs)
            loss_sum = loss_sum + (coeffs * seq_lp.detach()).sum()
            book.clear()
        else:
            loss, _ = policy_loss(tok_lp, tok_lp.detach(), adv.reshape(-1).detach(), rm_mb,
                                  aggregation=settings.aggregation, max_len=settings.max_len,
                                  seq_scale=c_mb)
            loss.backward()
            loss_sum = loss_sum + loss.detach()
        advs.append(adv.detach())
        old_lps.append(tok_lp.detach())
        del logits, tok_lp

    metrics = _merge_metrics(est_metrics, N)
    metrics["optim/loss"] = loss_sum
    metrics["train/entropy"] = ent_sum / rmf.sum().clamp(min=1)
    result = UpdateResult(torch.cat(advs), torch.cat(old_lps), torch.cat(gks) if gks else None, metrics)
    if settings.kl_coef > 0 and ref_model is not None:
        metrics.update(_accumulate_kl(model, ref_model, batch, settings, totals))
    return result


def accumulate_clipped_gradient(model, batch, advantages: torch.Tensor, old_logprobs: torch.Tensor,
                                settings: UpdateSettings, *, ref_model=None,
                                totals: BatchTotals | None = None) -> dict:
    """Later epochs: clipped importance-weighted policy loss with the rollout log-probs, plain backward.

    ``totals`` as in :func:`accumulate_policy_gradient`."""
    N, G = advantages.shape
    rmf = batch.response_mask.to(torch.float32)
    scale = sequence_scale(rmf, settings.aggregation, max_len=settings.max_len, totals=totals)
    metrics: dict = {}
    for k0, k1, rows in _micro_batches(N, G, settings.micro_batch_groups):
        tok_lp = gather_logprobs(forward_logits(model, batch.input_ids[rows], batch.attention_mask[rows]),
                                 batch.input_ids[rows])
        loss, m = policy_loss(tok_lp, old_logprobs[rows], advantages[k0:k1].reshape(-1), rmf[rows],
                              aggregation=settings.aggregation, max_len=settings.max_len,
                              clip_eps=settings.clip_eps, seq_scale=scale[rows])
        loss.backward()
        metrics = m
    if settings.kl_coef > 0 and ref_model is not None:
        metrics.update(_accumulate_kl(model, ref_model, batch, settings, totals))
    return metrics


def _accumulate_kl(model, ref_model, batch, settings: UpdateSettings, totals: BatchTotals | None = None) -> dict:
    """k3 KL to the frozen reference, aggregated like the policy loss; its gradient is added to .grad.

    It costs one more forward/backward; S and V describe the policy-gradient estimator only.
    """
    rmf = batch.response_mask.to(torch.float32)
    scale = sequence_scale(rmf, settings.aggregation, max_len=settings.max_len, totals=totals)
    with torch.no_grad():
        ref_lp = gather_logprobs(forward_logits(ref_model, batch.input_ids, batch.attention_mask), batch.input_ids)
    tok_lp = gather_logprobs(forward_logits(model, batch.input_ids, batch.attention_mask), batch.input_ids)
    d = ref_lp - tok_lp
    k3 = (d.exp() - d - 1) * rmf
    kl = (k3.sum(-1) * scale).sum()
    (settings.kl_coef * kl).backward()
    return {"actor/kl": k3.detach().sum() / rmf.sum().clamp(min=1)}  # token-mean k3, as policy_loss logs it


def _merge_metrics(parts: list[tuple[int, dict]], n_total: int) -> dict:
    """Average per-micro-batch estimator metrics weighted by their number of prompts (counts are summed)."""
    out: dict = {}
    for n, m in parts:
        for k, v in m.items():
            w = 1.0 if k.endswith("count") else n / n_total
            out[k] = out.get(k, 0.0) + v * w
    return out
