"""Baselines and advantages for every policy-gradient method, one pure function per method, by name.

Layout: ``rewards`` [N, G] (N prompts, G outputs each, rows prompt-major as in ``docs/architecture.md``),
per-output ``weights`` [N, G] (w_i: ``||s_i||^2`` or a proxy), ``lengths`` [N, G] (response lengths).
The advantage is ``A = F - b``; ``grpo`` with std scaling divides by the group std:
``A = (F - mean) / (std + eps)``.

+-------------+-------------------------------------------------+---------------+-----------------+
| name        | baseline b_i                                    | weights       | unbiased        |
+=============+=================================================+===============+=================+
| reinforce   | 0                                               | --            | yes             |
| rloo        | mean_{j != i} F_j                               | --            | yes             |
| grpo        | mean_j F_j (self included); A / (std_j F_j+eps) | --            | no              |
| dr_grpo     | mean_j F_j (self included), no std              | --            | x (G-1)/G       |
| opo         | sum_j L_j F_j / sum_j L_j (self included)       | ``length``    | no              |
| otb_proxy   | sum_{j!=i} w_j F_j / sum_{j!=i} w_j, w = proxy  | logit_energy  | yes             |
| oblr        | sum_{j!=i} w_j F_j / sum_{j!=i} w_j, w = exact  | ``exact``     | yes             |
| oblr_self   | sum_j w_j F_j / sum_j w_j (self included)       | ``exact``     | no (ablation)   |
+-------------+-------------------------------------------------+---------------+-----------------+

Guard (weighted baselines): when the weights in the denominator sum to at most
``guard_eps * scale_i`` -- ``scale_i`` being the mean weight of all *other* outputs of the batch, so
that the decision for output i never depends on o_i -- the baseline falls back to the plain
(leave-one-out, or group for the self-included methods) mean, and the fallback is counted in the
metric ``baseline/fallback_count``.

Leave-one-out sums are formed as ``x @ (1 - I)`` (a sum of the G - 1 other entries), not as
``total - x_i``, so that a huge w_i cannot cancel the others away. Cost O(N G^2), negligible for G ~ 8.

Register a new method with :func:`register_estimator`; the trainer reads ``get_estimator(name).weights``
to know which per-output weights to compute and never branches on a method name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oblr.registry import Registry, option_parameters

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch

WEIGHT_KINDS = (None, "exact", "length", "logit_energy")


@dataclass
class BaselineOutput:
    """What an estimator function returns. All tensors [N, G].

    ``baseline``: b; ``scale``: optional divisor of the advantage (A = (F - b) / scale);
    ``fallback``: optional bool mask of outputs whose baseline used the guard's fallback.
    """

    baseline: torch.Tensor
    scale: torch.Tensor | None = None
    fallback: torch.Tensor | None = None


@dataclass(frozen=True)
class Estimator:
    """A registered method. ``weights``: which per-output weights it needs (one of ``WEIGHT_KINDS``);
    ``min_group_size``: the smallest G it accepts; ``fn(rewards, weights, **options) -> BaselineOutput``."""

    name: str
    fn: Callable[..., BaselineOutput | torch.Tensor]
    weights: str | None = None
    min_group_size: int = 2

    def option_names(self) -> set[str] | None:
        """Keyword options the function accepts (None when it takes ``**kwargs``)."""
        params = option_parameters(self.fn, leading=2)
        return None if params is None else set(params)


# an entry's options are its function's parameters after (rewards, weights): algorithm.baseline_options
ESTIMATORS = Registry("estimator", leading=2, target=lambda est: est.fn)


def register_estimator(name: str, *, weights: str | None = None, min_group_size: int = 2):
    """Decorator: register ``fn(rewards [N,G], weights [N,G] | None, **options)`` under ``name``.

    ``fn`` returns the baselines [N, G] or a :class:`BaselineOutput`. ``weights`` says which per-output
    weights the method needs (None, "exact", "length", "logit_energy"); the ``weights`` argument it
    receives is ``lengths`` for "length" and ``weights`` otherwise. Duplicate names are rejected.
    Returns ``fn`` unchanged, so that one function can be registered under several names.
    """
    if weights not in WEIGHT_KINDS:
        raise ValueError(f"estimator {name!r}: weights must be one of {WEIGHT_KINDS}, got {weights!r}")
    if min_group_size < 1:
        raise ValueError(f"estimator {name!r}: min_group_size must be >= 1, got {min_group_size}")

    def deco(fn):
        ESTIMATORS.register(name, Estimator(name=name, fn=fn, weights=weights, min_group_size=min_group_size))
        return fn

    return deco


def available_estimators() -> list[str]:
    return ESTIMATORS.names()


def get_estimator(name: str | Estimator) -> Estimator:
    """The registered :class:`Estimator` called ``name`` (an Estimator is returned as is)."""
    if isinstance(name, Estimator):
        return name
    return ESTIMATORS.get(name)


# ----------------------------------------------------------------------------------------------------
# building blocks (all vectorised over N and G)


def _others(x: torch.Tensor) -> torch.Tensor:
    """Leave-one-out sums: out[n, i] = sum_{j != i} x[n, j]. [N, G] -> [N, G]."""
    import torch

    g = x.shape[-1]
    off = 1.0 - torch.eye(g, dtype=x.dtype, device=x.device)
    return x @ off


def _loo_mean(rewards: torch.Tensor) -> torch.Tensor:
    return _others(rewards) / (rewards.shape[-1] - 1)


def _other_outputs_mean(w: torch.Tensor) -> torch.Tensor:
    """Mean weight of all outputs of the batch except output (n, i), [N, G] (the guard's scale)."""
    import torch

    count = w.numel() - 1
    if count == 0:
        return torch.zeros_like(w)
    return ((w.sum() - w) / count).clamp(min=0.0)


def _weighted_mean(rewards, w, fallback_mean, *, leave_one_out: bool, guard_eps: float) -> BaselineOutput:
    """sum w_j F_j / sum w_j over j != i (leave_one_out) or all j, with the guard's fallback."""
    import torch

    if leave_one_out:
        num, den = _others(w * rewards), _others(w)
    else:
        num, den = (w * rewards).sum(-1, keepdim=True), w.sum(-1, keepdim=True)
        num, den = num.expand_as(rewards), den.expand_as(rewards)
    fallback = den <= guard_eps * _other_outputs_mean(w)
    safe_den = torch.where(fallback, torch.ones_like(den), den)
    baseline = torch.where(fallback, fallback_mean, num / safe_den)
    return BaselineOutput(baseline=baseline, fallback=fallback)


# ----------------------------------------------------------------------------------------------------
# the methods


@register_estimator("reinforce", min_group_size=1)
def reinforce(rewards, weights=None):
    """b = 0."""
    import torch

    return torch.zeros_like(rewards)


@register_estimator("rloo")
def rloo(rewards, weights=None):
    """b_i = (1/(G-1)) sum_{j != i} F_j."""
    return _loo_mean(rewards)


@register_estimator("grpo")
def grpo(rewards, weights=None, *, scale_std: bool = True, eps: float = 1e-6):
    """b = group mean (self included); with ``scale_std`` A = (F - b) / (std + eps), std unbiased (G-1)."""
    baseline = rewards.mean(-1, keepdim=True).expand_as(rewards)
    scale = None
    if scale_std:
        scale = (rewards.std(-1, keepdim=True) + eps).expand_as(rewards)
    return BaselineOutput(baseline=baseline, scale=scale)


@register_estimator("dr_grpo")
def dr_grpo(rewards, weights=None):
    """b = group mean (self included), no std scaling (Dr. GRPO; aggregation is the loss's job)."""
    return rewards.mean(-1, keepdim=True).expand_as(rewards)


@register_estimator("opo", weights="length")
def opo(rewards, weights, *, guard_eps: float = 1e-6):
    """b = sum_j L_j F_j / sum_j L_j (self included, as in OPO); guard falls back to the group mean."""
    group_mean = rewards.mean(-1, keepdim=True).expand_as(rewards)
    return _weighted_mean(rewards, weights, group_mean, leave_one_out=False, guard_eps=guard_eps)


def _oblr_loo(rewards, weights, *, guard_eps: float = 1e-6):
    """b_i = sum_{j != i} w_j F_j / sum_{j != i} w_j; guard falls back to the leave-one-out mean."""
    return _weighted_mean(rewards, weights, _loo_mean(rewards), leave_one_out=True, guard_eps=guard_eps)


register_estimator("oblr", weights="exact")(_oblr_loo)
register_estimator("otb_proxy", weights="logit_energy")(_oblr_loo)


@register_estimator("oblr_self", weights="exact")
def oblr_self(rewards, weights, *, guard_eps: float = 1e-6):
    """b = sum_j w_j F_j / sum_j w_j (self included: biased, ablation only); fallback: group mean."""
    group_mean = rewards.mean(-1, keepdim=True).expand_as(rewards)
    return _weighted_mean(rewards, weights, group_mean, leave_one_out=False, guard_eps=guard_eps)


# ----------------------------------------------------------------------------------------------------
# public entry points


def _as_float(x: torch.Tensor, what: str, like: torch.Tensor | None = None) -> torch.Tensor:
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if like is not None:
        return x.to(device=like.device, dtype=like.dtype)
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    return x


def _validate(est: Estimator, rewards, weights, lengths):
    """Check inputs and pick the weights the method uses. Returns (rewards, w or None)."""
    import torch

    rewards = _as_float(rewards, "rewards")
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be 2-D [N prompts, G outputs], got shape {tuple(rewards.shape)}")
    n, g = rewards.shape
    if n == 0:
        raise ValueError("rewards is empty (N = 0 prompts)")
    if g < est.min_group_size:
        raise ValueError(f"estimator {est.name!r} needs G >= {est.min_group_size} outputs per prompt, "
                         f"got rewards of shape {tuple(rewards.shape)}")
    checks = [torch.isfinite(rewards).all()]
    w = None
    if est.weights is not None:
        arg = "lengths" if est.weights == "length" else "weights"
        w = lengths if est.weights == "length" else weights
        if w is None:
            raise ValueError(f"estimator {est.name!r} needs `{arg}` [N, G] ({est.weights} weights), got None")
        w = _as_float(w, arg, like=rewards)
        if w.shape != rewards.shape:
            raise ValueError(f"{arg} shape {tuple(w.shape)} does not match rewards shape {tuple(rewards.shape)}")
        checks += [torch.isfinite(w).all(), (w >= 0).all()]
    ok = torch.stack(checks).cpu()  # one host sync for all the checks
    if not ok[0]:
        raise ValueError(f"rewards contain non-finite values (NaN or Inf): {int((~torch.isfinite(rewards)).sum())} entries")
    if w is not None:
        if not ok[1]:
            raise ValueError(f"{arg} contain non-finite values (NaN or Inf): {int((~torch.isfinite(w)).sum())} entries")
        if not ok[2]:
            raise ValueError(f"{arg} must be >= 0, got minimum {float(w.min())}")
    return rewards, w


def _run(method, rewards, weights, lengths, options):
    import torch

    est = get_estimator(method)
    accepted = est.option_names()
    if accepted is not None:
        unknown = set(options) - accepted
        if unknown:
            raise ValueError(f"estimator {est.name!r} got unknown option(s) {sorted(unknown)}; "
                             f"it accepts {sorted(accepted) or 'none'}")
    rewards, w = _validate(est, rewards, weights, lengths)
    out = est.fn(rewards, w, **options)
    if isinstance(out, torch.Tensor):
        out = BaselineOutput(baseline=out)
    if out.baseline.shape != rewards.shape:
        raise ValueError(f"estimator {est.name!r} returned baselines of shape {tuple(out.baseline.shape)}, "
                         f"expected {tuple(rewards.shape)}")
    return rewards, w, out


@dataclass
class Estimate:
    """Advantages with what produced them, all [N, G]: ``weights`` are the ones the method used (the
    validated ``weights`` or ``lengths``; None for methods without weights), ``fallback`` marks outputs
    whose baseline used the guard's fallback (None for methods without a guard)."""

    advantages: torch.Tensor
    baseline: torch.Tensor
    weights: torch.Tensor | None = None
    fallback: torch.Tensor | None = None

    @staticmethod
    def cat(parts: list[Estimate]) -> Estimate:
        """The estimate of a batch processed in parts of whole prompts (concatenated along N)."""
        import torch

        def cat(name):
            ts = [getattr(p, name) for p in parts]
            return None if any(t is None for t in ts) else torch.cat(ts)

        return Estimate(cat("advantages"), cat("baseline"), cat("weights"), cat("fallback"))

    def metrics(self) -> dict[str, torch.Tensor]:
        """Detached 0-d tensors (no host sync); stds and variances are population ones (never NaN):
        ``baseline/{mean,std_across_prompts,fallback_count}``, ``adv/{mean,std,var_across_prompts}`` and,
        with weights, ``weights/{mean,std,cv_within_group,max_over_mean}``."""
        import torch

        b, adv = self.baseline.detach(), self.advantages.detach()
        if self.fallback is None:
            fallback = torch.zeros((), dtype=torch.long, device=b.device)
        else:
            fallback = self.fallback.sum()
        m = {
            "baseline/mean": b.mean(),
            "baseline/std_across_prompts": b.mean(-1).std(correction=0),
            "baseline/fallback_count": fallback,
            "adv/mean": adv.mean(),
            "adv/std": adv.std(correction=0),
            "adv/var_across_prompts": adv.mean(-1).var(correction=0),
        }
        if self.weights is not None:
            w = self.weights.detach()
            mean = w.mean()
            g_mean = w.mean(-1)
            g_cv = torch.where(g_mean > 0, w.std(-1, correction=0) / g_mean.clamp(min=torch.finfo(w.dtype).tiny),
                               torch.zeros_like(g_mean))
            m.update({
                "weights/mean": mean,
                "weights/std": w.std(correction=0),
                "weights/cv_within_group": g_cv.mean(),
                "weights/max_over_mean": torch.where(mean > 0, w.max() / mean.clamp(min=torch.finfo(w.dtype).tiny),
                                                     torch.zeros_like(mean)),
            })
        return m


def estimate(method, rewards, *, weights=None, lengths=None, **options) -> Estimate:
    """The :class:`Estimate` of ``method``: advantages A = (F - b) [/ scale] and what produced them.

    Arguments as :func:`compute_advantages`. Raises ValueError on bad shapes, G too small, non-finite or
    negative inputs, missing weights.
    """
    rewards, w, out = _run(method, rewards, weights, lengths, options)
    adv = rewards - out.baseline
    if out.scale is not None:
        adv = adv / out.scale
    return Estimate(advantages=adv, baseline=out.baseline, weights=w, fallback=out.fallback)


def compute_baselines(method, rewards, *, weights=None, lengths=None, **options) -> torch.Tensor:
    """Baselines b [N, G] of ``method`` (a registered name). Arguments as :func:`compute_advantages`."""
    return _run(method, rewards, weights, lengths, options)[2].baseline


def compute_advantages(method, rewards, *, weights=None, lengths=None, return_metrics=False, **options):
    """Advantages A [N, G] = (F - b) [/ scale] of ``method``.

    rewards [N, G]; weights [N, G] (w_i >= 0; exact ``||s_i||^2`` or a proxy, used by methods whose
    ``get_estimator(method).weights`` is "exact"/"logit_energy"); lengths [N, G] (used by "length"
    methods). ``options`` go to the method (e.g. ``scale_std``, ``eps`` for grpo; ``guard_eps``).
    With ``return_metrics`` returns ``(A, metrics)`` (:meth:`Estimate.metrics`).
    Raises ValueError on bad shapes, G too small, non-finite or negative inputs, missing weights.
    """
    est = estimate(method, rewards, weights=weights, lengths=lengths, **options)
    return (est.advantages, est.metrics()) if return_metrics else est.advantages
