"""Policy loss: token-level importance ratio, optional PPO clip, aggregation modes, the k3 KL penalty.

Shapes: ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``response_mask`` [B, T]; ``advantages`` [B]
(rows prompt-major: reshape [N, G] advantages with ``.reshape(-1)``).

Every aggregation is "per-sequence factor c_i times the token sum of sequence i":

    loss = - sum_i c_i sum_t m_it min(r_it A_i, clip(r_it) A_i)   (+ kl_coef * sum_i c_i KL_i)

with ``r_it = exp(logp_it - old_it)`` and ``KL_i = sum_t m_it k3_it`` (:func:`sequence_kl`, the one KL
implementation of oblr). On-policy (old = logp, r = 1) the gradient of the first term is
``- sum_i A_i c_i s_i`` with ``s_i = grad sum_t m_it logp_it``. The factors (:func:`sequence_scale`,
registry :data:`AGGREGATIONS`):

- ``seq_sum_const`` (default, unbiased): c_i = 1 / (B * max_len), a constant;
- ``token_mean``: c_i = 1 / sum_{j,t} m_jt (each token weighs 1/total tokens). The factor depends on the
  sampled lengths of the whole batch: biased, for comparison;
- ``seq_mean`` (original GRPO): c_i = 1 / (B * L_i), L_i = sum_t m_it. Favours short sequences: biased.

The per-output weights w_i fed to the baseline must be ``c_i^2 ||s_i||^2`` for the aggregation used.
The factors depend on the whole batch (its size B, its width, its token count: :class:`BatchTotals`); a
micro-batch or a data-parallel rank passes the totals of the batch it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oblr.registry import Registry

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch


@dataclass(frozen=True)
class BatchTotals:
    """The whole batch's sizes that the per-sequence factors depend on.

    ``sequences``: B; ``tokens``: response tokens of the batch, ``sum_{j,t} m_jt`` (a number or a 0-d
    tensor); ``width``: the padded width T (the ``seq_sum_const`` constant when no ``max_len`` is given).
    :meth:`of` reads them from a response mask; rows of a larger batch (a data-parallel rank's shard)
    pass that batch's totals instead.
    """

    sequences: int
    tokens: float | torch.Tensor
    width: int

    @staticmethod
    def of(response_mask: torch.Tensor) -> BatchTotals:
        """Totals of the batch ``response_mask`` [B, T] (no host sync)."""
        return BatchTotals(int(response_mask.shape[0]), response_mask.sum(), int(response_mask.shape[-1]))

# name -> f(response_mask [B, T] float, max_len | None, totals: BatchTotals) -> c [B]
AGGREGATIONS = Registry("loss aggregation")


@AGGREGATIONS.register("seq_sum_const")
def _seq_sum_const(mask: torch.Tensor, max_len: int | None, totals: BatchTotals) -> torch.Tensor:
    import torch

    width = totals.width if max_len is None else max_len
    return torch.full(mask.shape[:1], 1.0 / (totals.sequences * width), dtype=mask.dtype, device=mask.device)


@AGGREGATIONS.register("token_mean")
def _token_mean(mask: torch.Tensor, max_len: int | None, totals: BatchTotals) -> torch.Tensor:
    import torch

    total = torch.as_tensor(totals.tokens, dtype=mask.dtype, device=mask.device).clamp(min=1.0)
    return (1.0 / total).expand(mask.shape[0]).clone()


@AGGREGATIONS.register("seq_mean")
def _seq_mean(mask: torch.Tensor, max_len: int | None, totals: BatchTotals) -> torch.Tensor:
    import torch

    lengths = mask.sum(-1)
    # an empty response has no tokens: its factor is irrelevant, 0 keeps it out of everything
    return torch.where(lengths > 0, 1.0 / (totals.sequences * lengths.clamp(min=1.0)), torch.zeros_like(lengths))


# aggregations whose on-policy gradient is an unbiased estimate of (a constant times) grad J
UNBIASED_AGGREGATIONS = frozenset({"seq_sum_const"})


def sequence_scale(response_mask: torch.Tensor, aggregation: str, *, max_len: int | None = None,
                   dtype: torch.dtype | None = None, totals: BatchTotals | None = None) -> torch.Tensor:
    """Per-sequence factors c [B] such that the on-policy gradient of the loss is ``-sum_i A_i c_i s_i``.

    response_mask [B, T] (1 on response tokens). ``max_len`` (``seq_sum_const`` only) should be the
    generation limit (max new tokens); None uses the batch width T, which is constant within the batch
    but depends on the sampled lengths (a tiny bias) -- pass max_len for the exact unbiased form.
    ``totals``: the sizes of the whole batch these rows belong to (default: these rows alone), e.g. the
    global batch of a data-parallel step (:func:`oblr.distributed.global_totals`). ``dtype``: of the
    factors (None: float32).
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    fn = AGGREGATIONS.get(aggregation)
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D [B, T], got shape {tuple(response_mask.shape)}")
    if response_mask.shape[0] == 0:
        raise ValueError("response_mask is empty (B = 0 sequences)")
    if max_len is not None and (int(max_len) != max_len or max_len < 1):
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be floating point, got {dtype}")
    mask = response_mask.to(dtype)
    return fn(mask, max_len, BatchTotals.of(mask) if totals is None else totals)


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence k3 KL to a reference, ``KL_i = sum_t m_it k3_it`` [B], differentiable in ``logprobs``.

    ``k3_it = exp(d_it) - d_it - 1 >= 0`` with ``d_it = ref_it - logp_it`` (Schulman's unbiased, low-variance
    estimator of KL(pi || ref) from samples of pi). Masked positions are set to 0 before ``exp`` so that
    padding values cannot leak NaN. The penalty of the loss is ``kl_coef * sum_i c_i KL_i``; oblr logs the
    token mean ``sum_i KL_i / sum_{i,t} m_it`` as ``actor/kl``.
    """
    import torch

    on = response_mask > 0
    d = torch.where(on, ref_logprobs.detach() - logprobs, torch.zeros_like(logprobs))
    return ((d.exp() - d - 1.0) * response_mask.to(logprobs.dtype)).sum(-1)


def k3_sum(old_logprobs: torch.Tensor, new_logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``sum_{i,t} m_it k3_it`` (float64, 0-d) of a step from ``old`` to ``new`` log-probs of the tokens ``old``
    sampled: ``k3 = expm1(d) - d`` with ``d = new - old``, in float64 (no gradient).

    The same k3 as :func:`sequence_kl`, computed so that a small step's KL is not lost to rounding: a step 100x
    below a working rate moves the policy by about 1e-10 nats per token, where float32's ``exp(d) - d - 1``
    (resolution about 1e-7 near ``exp(0)``) returns rounding noise; ``expm1`` in float64 keeps it (the log-probs'
    own float32 error then limits ``d`` to about 1e-7 x ``|log p|``)."""
    import torch

    on = response_mask > 0
    d = torch.where(on, new_logprobs.detach().double() - old_logprobs.detach().double(),
                    torch.zeros((), dtype=torch.float64, device=new_logprobs.device))
    return ((torch.expm1(d) - d) * on.double()).sum()


def _check_shapes(logprobs, old_logprobs, advantages, response_mask, ref_logprobs):
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be 2-D [B, T], got shape {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("response_mask", response_mask), ("ref_logprobs", ref_logprobs)):
        if t is not None and t.shape != logprobs.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} does not match logprobs shape {tuple(logprobs.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{logprobs.shape[0]}], got shape {tuple(advantages.shape)}; "
                         "reshape [N, G] advantages with .reshape(-1) (rows are prompt-major)")


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, *, aggregation: str = "seq_sum_const", max_len: int | None = None,
                clip_eps: float | None = None, clip_eps_high: float | None = None,
                ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                seq_scale: torch.Tensor | None = None):
    """Clipped importance-weighted policy loss with optional k3 KL to a reference. Returns (loss, metrics).

    logprobs/old_logprobs/ref_logprobs/response_mask [B, T]; advantages [B] (detached here).
    ratio r = exp(logp - old); with ``clip_eps`` the per-token objective is
    ``min(r A, clip(r, 1 - clip_eps, 1 + clip_eps_high) A)`` (``clip_eps_high`` defaults to ``clip_eps``),
    so tokens on the clipped branch get zero gradient. KL (when ``ref_logprobs`` is given and
    ``kl_coef`` != 0): ``kl_coef * sum_i c_i KL_i`` with KL_i from :func:`sequence_kl`.
    Metrics (detached 0-d tensors; token means over response tokens): ``actor/clip_frac`` (share of
    tokens on the clipped branch), ``actor/ratio_mean``, ``actor/kl`` (token mean of k3; 0 without a
    reference), ``actor/pg_loss`` (the loss without the KL term).

    ``seq_scale`` [B]: precomputed factors c_i (from :func:`sequence_scale` on the WHOLE batch) that
    replace the ones computed here -- needed when the batch is processed in micro-batches, since
    ``seq_sum_const``, ``token_mean`` and ``seq_mean`` all depend on the full batch size B or token count.
    """
    import torch

    _check_shapes(logprobs, old_logprobs, advantages, response_mask, ref_logprobs)
    if clip_eps is not None and clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
    if clip_eps_high is not None and (clip_eps is None or clip_eps_high <= 0):
        raise ValueError(f"clip_eps_high={clip_eps_high} needs clip_eps set and must be > 0")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs")

    mask = response_mask.to(logprobs.dtype)
    on = mask > 0
    if seq_scale is None:
        c = sequence_scale(response_mask, aggregation, max_len=max_len, dtype=logprobs.dtype)
    else:
        AGGREGATIONS.get(aggregation)  # an unknown name raises, listing the registered ones
        if seq_scale.shape != logprobs.shape[:1]:
            raise ValueError(f"seq_scale must be [B] = [{logprobs.shape[0]}], got shape {tuple(seq_scale.shape)}")
        c = seq_scale.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)[:, None]

    # masked positions are set to 0 before exp so that padding values (even -inf) cannot leak NaN
    log_ratio = torch.where(on, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    ratio = log_ratio.exp()
    obj = ratio * adv
    clipped = torch.zeros_like(on)
    if clip_eps is not None:
        high = clip_eps if clip_eps_high is None else clip_eps_high
        obj_clip = ratio.clamp(1.0 - clip_eps, 1.0 + high) * adv
        clipped = (obj_clip < obj) & on
        obj = torch.minimum(obj, obj_clip)
    pg_loss = -(c * (obj * mask).sum(-1)).sum()

    n_tok = mask.sum().clamp(min=1.0)
    kl_tok = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    loss = pg_loss
    if ref_logprobs is not None:
        kl = sequence_kl(logprobs, ref_logprobs, response_mask)
        if kl_coef != 0.0:
            loss = pg_loss + kl_coef * (c * kl).sum()
        kl_tok = kl.detach().sum() / n_tok

    metrics = {
        "actor/clip_frac": clipped.to(logprobs.dtype).sum() / n_tok,
        "actor/ratio_mean": (ratio.detach() * mask).sum() / n_tok,
        "actor/kl": kl_tok,
        "actor/pg_loss": pg_loss.detach(),
    }
    return loss, metrics
