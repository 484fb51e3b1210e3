"""One policy-gradient accumulation: rollouts and rewards in, ``.grad`` filled, the rows' statistics out.

This is the piece the trainer, the cost benchmark and the framework adapters share. Per micro-batch of
whole prompt groups (all of them at once by default) it runs one forward pass, computes the per-output
weights w_i the estimator declares (:data:`WEIGHT_SOURCES`), the advantages, and adds to ``.grad`` the
gradient of the per-row objective

    obj_i = coeff_i l_i + kl_coef c_i KL_i,     coeff_i = -A_i c_i

(``l_i`` the sequence log-likelihood under the distribution that sampled the rollouts --
``softmax(logits / rollout.temperature)``, top-p truncated and renormalised, as the samplers draw -- so the
update stays on-policy at any sampling setting (:func:`oblr.logprobs.response_token_logprobs`), ``c_i`` the aggregation factor of :func:`oblr.losses.sequence_scale`,
``KL_i`` the k3 KL to the frozen reference of :func:`oblr.losses.sequence_kl`, present when
``kl_coef > 0``). ``optim/loss`` is ``sum_i obj_i`` on every path, and the estimator metrics
(``baseline/*``, ``adv/*``, ``weights/*``) describe the whole batch's applied advantages and weights
whatever the micro-batch split. Two paths, chosen by what the estimator and the schedule need, never by a
method name:

- book-keeping path (exact weights or SNR statistics needed): the forward runs inside
  :meth:`oblr.gradnorm.BookKeeper.record`; ONE backward of ``sum_i l_i`` gives ``w_i = c_i^2 ||s_i||^2``;
  from the same records the gradient ``sum_i coeff_i s_i`` goes into ``.grad`` and the per-prompt squared
  norms ``||g_k||^2`` (``g_k = N sum_{i in k} grad obj_i``) come out. With KL on, the KL gradient must be
  inside each g_k, so the rows' objective ``obj_i`` gets a second recorded backward on the retained graph
  (the first one only when exact weights are needed) and g_k and ``.grad`` come from that record;
- with activation checkpointing on (``model.activation_checkpointing``) the book-keeping path runs on
  :class:`oblr.gradnorm.TwoPassBookKeeper` (:func:`oblr.gradnorm.make_book`, ``algorithm.checkpointed_engine``
  ``two_pass``): each recorded "backward" is a norm pass that keeps only per-prompt Grams, and ``.grad`` comes
  from one ordinary backward of ``sum_i obj_i`` -- the same numbers, one more backward pass, nothing kept
  per layer; or (``recompute``) on :class:`oblr.gradnorm.RecomputeBookKeeper`: the one-pass book-keeping
  taken from the recomputed layers -- the same numbers, no second backward, each layer's per-row
  contributions kept;
- plain path (proxy or no weights, no SNR): forward, advantages, one ordinary backward of
  ``sum_i obj_i``, exactly a GRPO step.

On-policy (the first update on a batch) the importance ratio is 1 and clipping is inactive, so both paths
give the gradient of :func:`oblr.losses.policy_loss`; later epochs (``epochs > 1``) go through
:func:`accumulate_clipped_gradient` with the stored old and reference log-probs.

The core computes only what is local to the rows it is given -- advantages, the rollout and reference
log-probs, the per-prompt ``||g_k||^2``, the metrics and the estimate -- and returns one
:class:`UpdateResult`, the same fields whoever calls it. It never reads ``.grad`` back: ``||gbar||^2`` of
the step's (reduced) gradient and S, V are formed once, by :func:`oblr.distributed.step.step_statistics`,
after every rank's share is in ``.grad``. A caller says which batch its rows belong to: ``totals`` (a
data-parallel rank: the global batch's :class:`~oblr.losses.BatchTotals`, so the factors c_i and the scale
of g_k are those of the global batch, with, under FSDP2, a ``grad_sink`` that sends the book-keeping
gradient to the sharded ``.grad``) or ``n_prompts`` (a framework that fixes the factors itself,
``seq_scale``); by default the rows are the whole batch.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from oblr.estimators import Estimate, estimate, get_estimator
from oblr.gradnorm import length_weights, logit_energy_weights, make_book
from oblr.logprobs import (
    chunked_response_logprobs,
    forward_logits,
    response_token_logprobs,
    sequence_logprobs,
    token_entropy,
)
from oblr.losses import BatchTotals, k3_sum, policy_loss, sequence_kl, sequence_scale
from oblr.params import grad_sq_norm, trainable_params  # noqa: F401 (re-exported: the core's API)
from oblr.registry import Registry


@dataclass
class UpdateSettings:
    """What one update needs. :meth:`from_config` derives it from a :class:`oblr.config.Config`: every
    field named like a key of ``algorithm`` is taken from there; the others are in :data:`DERIVED`."""

    baseline: str = "oblr"
    baseline_options: dict = field(default_factory=dict)
    aggregation: str = "seq_sum_const"
    max_len: int | None = None   # the constant of seq_sum_const (None: the batch width)
    need_snr: bool = True        # compute the per-prompt norms S, V are made from (book-keeping path)
    norms_method: str = "auto"
    checkpointed_engine: str = "two_pass"  # with activation checkpointing on: two_pass | recompute
    micro_batch_groups: int = 0  # 0 = the whole batch at once
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    temperature: float = 1.0     # the sampling distribution the rollouts came from (rollout.temperature) ...
    top_p: float = 1.0           # ... and its nucleus (rollout.top_p): tokens are scored under it
    assemble_grad: bool = True   # add the gradient to .grad (False: an engine that runs its own backward,
    #                              e.g. DeepSpeed, gets the advantages and, with need_snr, the norms ||g_k||^2)
    logit_chunk_tokens: int = 0  # > 0: the output layer in chunks of this many positions (model.logit_chunk_tokens)

    @classmethod
    def from_config(cls, cfg, *, schedule_needs_snr: bool) -> UpdateSettings:
        """The settings of ``cfg``: ``algorithm.*`` keys by name; ``max_len`` 0 means
        ``rollout.max_new_tokens``; ``need_snr`` when the schedule needs S, V or ``algorithm.track_snr``."""
        a = cfg.algorithm
        kw = {f.name: copy.deepcopy(getattr(a, f.name)) for f in dataclasses.fields(cls) if f.name not in DERIVED}
        kw["max_len"] = a.max_len or cfg.rollout.max_new_tokens
        return cls(**kw, need_snr=schedule_needs_snr or a.track_snr, temperature=cfg.rollout.temperature,
                   top_p=cfg.rollout.top_p, logit_chunk_tokens=cfg.model.logit_chunk_tokens)


# fields of UpdateSettings that are not keys of the config's ``algorithm`` section
DERIVED = frozenset({"need_snr", "temperature", "top_p", "assemble_grad", "logit_chunk_tokens"})


@dataclass
class UpdateResult:
    """What one call computed from its rows (every field is these rows'; the same fields in every use)."""

    advantages: torch.Tensor                # [N, G]
    old_logprobs: torch.Tensor              # [B, T] token log-probs of the rollout policy (detached)
    per_prompt_sq_norms: torch.Tensor | None  # [N] ||g_k||^2 (need_snr); mean of g_k over the batch's N = its gradient
    metrics: dict
    ref_logprobs: torch.Tensor | None = None  # [B, T] token log-probs of the reference (when kl_coef > 0)
    estimate: Estimate | None = None          # the estimator's output [N, G] behind the estimator metrics


# per-output weights w_i by the source an estimator declares (``get_estimator(name).weights``, one of
# oblr.estimators.WEIGHT_KINDS): f(book, logits, input_ids, response_mask, seq_scale) -> [b]
WEIGHT_SOURCES = Registry("weight source")
# squared norm of the per-sequence gradient the chosen aggregation produces: c_i^2 ||s_i||^2
WEIGHT_SOURCES.register("exact", lambda book, logits, ids, rm, c: book.sq_norms() * c.pow(2))
WEIGHT_SOURCES.register("logit_energy",
                        lambda book, logits, ids, rm, c: logit_energy_weights(logits.detach(), ids, rm))
WEIGHT_SOURCES.register("length", lambda book, logits, ids, rm, c: length_weights(rm))


def micro_batches(n_prompts: int, group_size: int, groups_per_mb: int):
    """``(k0, k1, rows)``: prompts k0..k1-1 and their rows, ``groups_per_mb`` prompts at a time (0 = all)."""
    step = groups_per_mb if groups_per_mb > 0 else n_prompts
    for k0 in range(0, n_prompts, step):
        k1 = min(n_prompts, k0 + step)
        yield k0, k1, slice(k0 * group_size, k1 * group_size)


def _entropy_sum(logits: torch.Tensor, response_mask: torch.Tensor, temperature: float) -> torch.Tensor:
    """Summed token entropy of the sampling distribution ``softmax(logits / temperature)`` over response tokens."""
    with torch.no_grad():
        logits = logits.detach()
        if temperature != 1.0:
            logits = logits / temperature
        return (token_entropy(logits) * response_mask).sum()


def _scored_logprobs(model, input_ids, attention_mask, response_mask, settings: UpdateSettings, autocast=None,
                     entropy: bool = False):
    """``(logits, token log-probs [B, T], entropy sum)``: response tokens scored under the distribution that
    sampled them (``softmax(logits / temperature)``, top-p truncated and renormalised), 0 elsewhere. With
    ``settings.logit_chunk_tokens`` the output layer runs in chunks
    (:func:`oblr.logprobs.chunked_response_logprobs`), ``logits`` is None and the third value is the summed
    response-token entropy when ``entropy``; otherwise it is None (the caller computes the entropy from the
    logits once its norm pass is done, so its temporaries never add to the forward's peak).
    ``autocast``: a context-manager factory the forward runs in (e.g. accelerate's mixed precision)."""
    with autocast() if autocast is not None else nullcontext():
        if settings.logit_chunk_tokens:
            lp, ent = chunked_response_logprobs(model, input_ids, attention_mask, response_mask,
                                                chunk=settings.logit_chunk_tokens,
                                                temperature=settings.temperature, top_p=settings.top_p)
            return None, lp, ent if entropy else None
        logits = forward_logits(model, input_ids, attention_mask)
    lp = response_token_logprobs(logits, input_ids, response_mask, temperature=settings.temperature,
                                 top_p=settings.top_p)
    return logits, lp, None  # the caller takes the entropy from the logits when it needs it (after its backward)


def _reference_logprobs(ref_model, input_ids, attention_mask, response_mask, settings, autocast=None) -> torch.Tensor:
    with torch.no_grad():
        return _scored_logprobs(ref_model, input_ids, attention_mask, response_mask, settings, autocast)[1]


def accumulate_policy_gradient(model, batch, rewards: torch.Tensor, settings: UpdateSettings,
                               *, ref_model=None, totals: BatchTotals | None = None,
                               grad_sink=None, seq_scale: torch.Tensor | None = None,
                               n_prompts: int | None = None, autocast=None) -> UpdateResult:
    """Add the policy-gradient of the loss to ``.grad`` of the trainable parameters.

    ``batch`` has ``input_ids``, ``attention_mask``, ``response_mask`` [B, T] (rows prompt-major,
    B = N*G) and ``response_lengths`` [B]; ``rewards`` is [N, G]; ``ref_model`` (frozen) is required when
    ``settings.kl_coef > 0``. The loss is ``sum_i obj_i`` (module docstring); exact weights are
    ``w_i = c_i^2 ||s_i||^2``, the squared norm of the per-sequence gradient that aggregation produces.
    Metrics (0-d tensors): the estimator's (over the whole batch), ``optim/loss``, ``train/entropy``
    (token mean) and with KL ``actor/kl`` (token mean of k3). ``.grad`` is not read back: the step's
    ``||gbar||^2`` and S, V come from :func:`oblr.distributed.step.step_statistics`.

    ``totals``: the batch these rows belong to (a data-parallel rank's global batch; default: these
    rows); with ``N_tot = totals.sequences / G`` prompts, c_i are the global batch's factors and
    ``per_prompt_sq_norms`` are ``||N_tot h_k||^2``, ``h_k`` prompt k's share of the gradient.
    ``grad_sink(param, increment)``: where the book-keeping path puts each parameter's gradient
    increment (default ``param.grad += increment``; see :class:`oblr.gradnorm.BookKeeper`).
    ``seq_scale`` [B]: the factors c_i, when the caller's loss fixes them (a framework's own normalisation,
    times per-row importance ratios); default :func:`oblr.losses.sequence_scale` of ``settings.aggregation``.
    ``n_prompts``: prompts of the whole batch (over all ranks) when ``seq_scale`` is given and ``totals``
    is not (the ``N_tot`` that scales ``per_prompt_sq_norms``).
    ``autocast``: a context-manager factory the forward passes run in. With ``settings.assemble_grad``
    False nothing is added to ``.grad``; the advantages and, with ``need_snr``, ``per_prompt_sq_norms``
    are computed as usual.
    """
    N, G = rewards.shape
    ids, am, rm = batch.input_ids, batch.attention_mask, batch.response_mask
    rmf = rm.to(torch.float32)
    if seq_scale is None:
        scale = sequence_scale(rmf, settings.aggregation, max_len=settings.max_len, totals=totals)  # [B]
    elif tuple(seq_scale.shape) != (ids.shape[0],):
        raise ValueError(f"seq_scale must have shape ({ids.shape[0]},), one factor per row; got {tuple(seq_scale.shape)}")
    else:
        scale = seq_scale.to(torch.float32)
    n_total = n_prompts if n_prompts is not None else N if totals is None else totals.sequences // G
    lengths = batch.response_lengths.to(torch.float32).view(N, G)
    source = get_estimator(settings.baseline).weights
    kl_on = settings.kl_coef > 0
    if kl_on and ref_model is None:
        raise ValueError(f"kl_coef = {settings.kl_coef} needs ref_model (the frozen reference policy)")
    book = (make_book(model, method=settings.norms_method, grad_sink=grad_sink, engine=settings.checkpointed_engine)
            if source == "exact" or settings.need_snr else None)
    if settings.logit_chunk_tokens and source == "logit_energy":
        raise ValueError(f"baseline {settings.baseline!r} weighs outputs by their logits, which "
                         "logit_chunk_tokens never holds whole; set it to 0")
    if settings.logit_chunk_tokens and book is not None and not book.checkpointed:
        raise ValueError("logit_chunk_tokens with exact norms needs activation checkpointing (a checkpointed engine): "
                         "the one-pass engine keeps every chunk's logit gradients anyway")

    parts: list[Estimate] = []
    old_lps, ref_lps, gks = [], [], []
    loss_sum, ent_sum, kl_sum = rmf.new_zeros(()), rmf.new_zeros(()), rmf.new_zeros(())
    try:
        for k0, k1, rows in micro_batches(N, G, settings.micro_batch_groups):
            r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], scale[rows]
            local_groups = torch.arange(k1 - k0, device=rmf.device).repeat_interleave(G)
            ref_lp = _reference_logprobs(ref_model, ids[rows], am[rows], rm[rows], settings, autocast) if kl_on else None
            with book.record() if book is not None else nullcontext():
                logits, tok_lp, ent = _scored_logprobs(model, ids[rows], am[rows], rm[rows], settings, autocast,
                                                       entropy=True)
                seq_lp = sequence_logprobs(tok_lp, rm_mb)
                if book is not None and (source == "exact" or not kl_on):
                    book.backward(seq_lp, retain_graph=kl_on, group_ids=local_groups)  # s_i; with KL, kept for obj_i
            ent_sum = ent_sum + (ent if logits is None else _entropy_sum(logits, rm_mb, settings.temperature))

            weights = None
            if source is not None:
                weights = WEIGHT_SOURCES.get(source)(book, logits, ids[rows], rm_mb, c_mb).view(k1 - k0, G)
            est = estimate(settings.baseline, r_mb, weights=weights, lengths=lengths[k0:k1],
                           **settings.baseline_options)
            parts.append(est)
            coeffs = -est.advantages.reshape(-1).to(torch.float32) * c_mb  # d loss / d l_i
            obj = coeffs * seq_lp
            if kl_on:
                kl = sequence_kl(tok_lp, ref_lp, rm_mb)
                obj = obj + settings.kl_coef * c_mb * kl
                kl_sum = kl_sum + kl.detach().sum()
                ref_lps.append(ref_lp)

            if book is None:
                if settings.assemble_grad:
                    obj.sum().backward()
            else:
                row_coeffs = coeffs
                if kl_on:  # the records of obj_i itself: each row's gradient includes its KL term
                    book.backward(obj, group_ids=local_groups)
                    row_coeffs = torch.ones_like(coeffs)
                if settings.need_snr:  # .grad and ||g_k||^2 (g_k = N sum_{i in k} grad obj_i) from one pass
                    gk = (book.accumulate_grad_with_group_norms(row_coeffs, local_groups) if settings.assemble_grad
                          else book.group_sq_norms(row_coeffs, local_groups))
                    gks.append(gk * (n_total * n_total))
                elif settings.assemble_grad:
                    book.accumulate_grad(row_coeffs)
                book.clear()
            loss_sum = loss_sum + obj.detach().sum()
            old_lps.append(tok_lp.detach())
            del logits, tok_lp, seq_lp, obj
    except BaseException:
        if book is not None:  # no hook, graph or kept contribution outlives a failed step (two-pass Taps included)
            book.clear()
        raise

    est = Estimate.cat(parts)
    metrics = est.metrics()
    n_tok = rmf.sum().clamp(min=1)
    metrics["optim/loss"] = loss_sum
    metrics["train/entropy"] = ent_sum / n_tok
    if kl_on:
        metrics["actor/kl"] = kl_sum / n_tok
    return UpdateResult(est.advantages.detach(), torch.cat(old_lps), torch.cat(gks) if gks else None, metrics,
                        ref_logprobs=torch.cat(ref_lps) if ref_lps else None, estimate=est)


def step_kl_sums(model, batch, old_logprobs: torch.Tensor, settings: UpdateSettings, group_size: int,
                 autocast=None) -> torch.Tensor:
    """``[sum_{i,t} m_it k3_it, sum_{i,t} m_it]`` (float64, shape [2]) of the step just taken, on these rows.

    ``k3_it = exp(d_it) - d_it - 1`` with ``d_it = new_it - old_it``: Schulman's estimator of
    ``KL(pi_old || pi_new)`` from the tokens pi_old sampled (:func:`oblr.losses.k3_sum`: in float64 with
    ``expm1``, so the tiny KL of a probe step far below a working rate is not float32 rounding noise), ``old_logprobs`` the update's own [B, T] (``UpdateResult.old_logprobs``) and the
    new ones from one forward pass of ``model`` without gradients, per micro-batch of ``settings``, scored
    under the sampling distribution as the update scores them. Their ratio is the per-token KL of the step
    (``policy/step_kl``); ranks add the two sums before dividing."""
    B = batch.input_ids.shape[0]
    rows_per_mb = settings.micro_batch_groups * group_size if settings.micro_batch_groups > 0 else B
    rm = batch.response_mask
    total = torch.zeros(2, dtype=torch.float64, device=old_logprobs.device)
    with torch.no_grad():
        for r0 in range(0, B, rows_per_mb):
            rows = slice(r0, min(B, r0 + rows_per_mb))
            new_lp = _scored_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows], rm[rows], settings,
                                      autocast)[1]
            k3 = k3_sum(old_logprobs[rows], new_lp, rm[rows])
            total += torch.stack([k3, rm[rows].to(torch.float64).sum()])
    return total


# policy_loss metrics that are token means (merged over micro-batches weighted by their token counts)
_TOKEN_MEANS = ("actor/clip_frac", "actor/ratio_mean", "actor/kl")


def accumulate_clipped_gradient(model, batch, first: UpdateResult, settings: UpdateSettings,
                                *, totals: BatchTotals | None = None) -> dict:
    """A later epoch on the same rollouts: the clipped importance-weighted policy loss
    (:func:`oblr.losses.policy_loss`) with the rollout log-probs, advantages and reference log-probs of
    ``first`` (the result of :func:`accumulate_policy_gradient` on this batch); one ordinary backward per
    micro-batch. Returns ``actor/{clip_frac,ratio_mean,kl}`` (token means over the whole batch) and
    ``actor/pg_loss``. ``totals`` as in :func:`accumulate_policy_gradient`."""
    N, G = first.advantages.shape
    rmf = batch.response_mask.to(torch.float32)
    scale = sequence_scale(rmf, settings.aggregation, max_len=settings.max_len, totals=totals)
    ref = first.ref_logprobs
    if settings.kl_coef > 0 and ref is None:
        raise ValueError(f"kl_coef = {settings.kl_coef}: the first update of this batch kept no reference log-probs")
    sums: dict = {}
    for k0, k1, rows in micro_batches(N, G, settings.micro_batch_groups):
        tok_lp = _scored_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows],
                                  batch.response_mask[rows], settings)[1]
        loss, m = policy_loss(tok_lp, first.old_logprobs[rows], first.advantages[k0:k1].reshape(-1), rmf[rows],
                              aggregation=settings.aggregation, max_len=settings.max_len,
                              clip_eps=settings.clip_eps, seq_scale=scale[rows],
                              ref_logprobs=None if ref is None else ref[rows], kl_coef=settings.kl_coef)
        loss.backward()
        n_mb = rmf[rows].sum()
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + (v * n_mb if k in _TOKEN_MEANS else v)
    n_tok = rmf.sum().clamp(min=1)
    out = {k: (v / n_tok if k in _TOKEN_MEANS else v) for k, v in sums.items()}
    if ref is None:
        out.pop("actor/kl", None)
    return out
