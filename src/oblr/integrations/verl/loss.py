"""The ``oblr`` policy loss in verl's form: oblr's clipped loss with ``seq_sum_const`` factors, verl's settings checked.

Whose code: oblr's -- the loss and the refused settings; verl's -- the registered policy loss's call
and the actor config it reads (public fields). No verl import, no private verl name
(docs/integrations_private_api.md).

verl's actor (``verl.workers.utils.losses.ppo_loss``) calls the registered policy loss with per-token
``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask`` [B, T], ``loss_agg_mode`` and the actor's
config, whose ``global_batch_info`` holds ``dp_size``, ``global_batch_size`` and ``loss_scale_factor``.
:func:`oblr_policy_loss` takes each row's advantage A_i, builds the ``seq_sum_const`` factors
``c_i = 1 / (global_batch_size * loss_scale_factor)`` (:func:`oblr.losses.sequence_scale`) and returns
``dp_size * oblr.losses.policy_loss(...)`` (FSDP averages gradients over ranks, so each rank's loss carries
``dp_size``, as verl's own aggregation does). On-policy its gradient is oblr's ``-sum_i A_i c_i s_i``, the
gradient whose per-sequence norms the w_i and S, V describe.

Refused (:data:`RULES`, one line each): settings under which verl would add to or reshape that gradient --
another ``loss_agg_mode``, no constant ``loss_scale_factor``, an entropy bonus, a KL loss, later PPO epochs,
token-level importance weights, advantages that vary along a response. Nothing here imports verl.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

#: the verl aggregation whose factors are oblr's seq_sum_const: seq-mean of token sums, / loss_scale_factor
LOSS_AGG_MODE = "seq-mean-token-sum-norm"


def _get(cfg, name, default=None):
    return cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)


@dataclass(frozen=True)
class Rule:
    """One refused actor setting: ``ok(config)`` is False for a value that changes the gradient."""

    setting: str
    ok: Callable
    use: str
    why: str


RULES: tuple[Rule, ...] = (
    Rule("loss_agg_mode", lambda c: _get(c, "loss_agg_mode") == LOSS_AGG_MODE, f"loss_agg_mode={LOSS_AGG_MODE}",
         "only it divides each sequence's token sum by constants (batch size x loss_scale_factor); token-mean, "
         "token-sum and seq-mean-token-mean weigh sequences by sampled lengths or token counts, which biases "
         "the estimator and the per-sequence weights"),
    Rule("loss_scale_factor", lambda c: isinstance(_get(c, "loss_scale_factor"), int)
         and not isinstance(_get(c, "loss_scale_factor"), bool) and _get(c, "loss_scale_factor") > 0,
         "loss_scale_factor=<the response length limit, data.max_response_length>",
         "it is the constant of the seq_sum_const normalisation (unset, verl uses the padded width)"),
    Rule("entropy_coeff", lambda c: not _get(c, "entropy_coeff", 0), "entropy_coeff=0",
         "the entropy bonus's gradient is not part of the estimator S and V describe"),
    Rule("use_kl_loss", lambda c: not _get(c, "use_kl_loss", False), "use_kl_loss=False",
         "the KL loss's gradient is not part of the per-prompt gradients S and V are computed from"),
    Rule("ppo_epochs", lambda c: _get(c, "ppo_epochs", 1) == 1, "ppo_epochs=1",
         "later epochs reuse the batch off-policy (ratios, clipping), while w_i, the baseline and S, V "
         "describe the on-policy gradient"),
)


def refusal(config) -> str | None:
    """The one-line message for the first refused actor setting of ``config``, or None when all are compatible."""
    if config is None:
        return "oblr policy loss: no actor config given (verl passes actor_rollout_ref.actor)"
    for r in RULES:
        if not r.ok(config):
            return (f"oblr policy loss: actor.{r.setting}={_get(config, r.setting)!r} is not supported: {r.why}; "
                    f"use actor.{r.setting}={r.use.split('=', 1)[1]}")
    return None


def sequence_advantages(advantages, response_mask, *, atol: float = 1e-6):
    """Each row's A_i [B] from verl's token layout [B, T]; refuses advantages that vary along a response."""
    import torch

    mask = response_mask.to(advantages.dtype)
    n = mask.sum(-1)
    a = (advantages * mask).sum(-1) / n.clamp(min=1)
    spread = ((advantages - a[:, None]).abs() * mask).amax() if mask.numel() else advantages.new_zeros(())
    if float(spread) > atol * max(1.0, float(a.abs().max()) if a.numel() else 1.0):
        raise ValueError(f"oblr policy loss: advantages vary along a response (spread {float(spread):.3g}); the "
                         f"oblr loss needs one advantage per sequence (an outcome estimator such as oblr)")
    return torch.where(n > 0, a, torch.zeros_like(a))


def oblr_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode: str = "token-mean",
                     config=None, rollout_is_weights=None):
    """verl's policy-loss signature (registered as ``oblr``): ``(loss, metrics)``; see the module docstring."""
    import torch

    from oblr.losses import BatchTotals, policy_loss, sequence_scale

    msg = refusal(config)
    if msg is None and loss_agg_mode != LOSS_AGG_MODE:
        msg = (f"oblr policy loss: loss_agg_mode={loss_agg_mode!r} is not supported: {RULES[0].why}; "
               f"use actor.loss_agg_mode={LOSS_AGG_MODE}")
    if msg is None and rollout_is_weights is not None:
        msg = ("oblr policy loss: rollout_is_weights are not supported: token-level importance weights make a "
               "sequence's gradient something other than c_i A_i s_i; use algorithm.rollout_correction off")
    if msg is not None:
        raise ValueError(msg)
    mask = response_mask.to(log_prob.dtype)
    info = _get(config, "global_batch_info") or {}
    dp_size = int(info.get("dp_size") or 1)
    gbs = info.get("global_batch_size")
    if gbs is None and dp_size > 1:
        raise ValueError("oblr policy loss: global_batch_size is required when dp_size > 1")
    width = int(_get(config, "loss_scale_factor"))
    totals = BatchTotals(int(gbs) if gbs is not None else int(mask.shape[0]), mask.sum(), width)
    c = sequence_scale(mask, "seq_sum_const", max_len=width, dtype=log_prob.dtype, totals=totals)
    a = sequence_advantages(advantages.detach(), mask)
    low = _get(config, "clip_ratio_low")
    high = _get(config, "clip_ratio_high")
    eps = _get(config, "clip_ratio", 0.2)
    loss, m = policy_loss(log_prob, old_log_prob, a, mask, aggregation="seq_sum_const", max_len=width,
                          clip_eps=eps if low is None else low, clip_eps_high=eps if high is None else high,
                          seq_scale=c)
    with torch.no_grad():
        metrics = {"actor/pg_clipfrac": float(m["actor/clip_frac"]), "actor/ratio_mean": float(m["actor/ratio_mean"])}
    return loss * dp_size, metrics
