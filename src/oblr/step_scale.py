"""The measured step scale: ``algorithm.lr_schedule=auto`` sets the learning rate from curvature and
descent measured along the step the optimizer actually took (an extension; NOT the paper's rule).

The paper's step is ``eta = S/(S + V/N) / (B L + B^2 M)`` with an unknown smoothness constant; here the
scale is measured. Write the last update as ``delta = theta_t - theta_{t-1} = eta u`` (``u`` the
lr-free direction: ``-c g`` for SGD, ``-c * mhat/(sqrt(vhat)+eps)`` for AdamW, ``c`` the clip factor).
Along that line the loss is ``f(theta + e u) ~ f - e d + e^2 h / 2`` with

    d = -<G_{t-1}, u>          descent rate per unit lr
    h = u^T H u                curvature along u

and the descent-optimal lr ``e* = d / h``. From the raw gradients g_{t-1} (which built u) and g_t
(a fresh batch at theta_t, noise independent of u):

    A = -<g_{t-1}, delta> + kappa      kappa = E<xi_{t-1}, delta>, the noise bias (xi = g - G)
    B =  <g_t, delta>                  unbiased for <G_t, delta> = -eta d + eta^2 h
    d ~ A / eta,   h ~ (A + B) / eta^2

``kappa = tr(J Sigma)/N`` with J = d delta / d g_{t-1} (linearised optimizer) and tr(Sigma) = V, oblr's own
noise estimate (:mod:`oblr.snr`); the per-optimizer gain ``j`` with ``kappa = -eta c j V / N`` comes from
the registry :data:`NOISE_GAINS` (keyed by the optimizer's class name): SGD ``j = 1`` (exact); Adam/AdamW
``j = (1-b1)/(1-b1^k) sum_i g_i^2 / (sqrt(vhat_i)+eps) / |g|^2`` (noise assumed spread over coordinates
like the gradient's energy: an approximation). For SGD, ``d/h = (1/L_u) S/(S+V/N)`` with
``L_u = g^T H g / |g|^2`` -- the paper's rule with its scale measured along the noisy gradient.
d is averaged over steps (EMA of A/eta); h is the eta^2-weighted least-squares fit of A + B = eta^2 h over
the same window (EMA of A + B over EMA of eta^2), so steps too small to resolve the curvature (the noise
of A + B is of order eta, the signal eta^2 h) weigh little; the lr aims at the cautious ratio
``(d - se_d) / (h + se_h)`` (``confidence`` standard errors, 1 by default, from the averages' own spread);
steps with a zero gradient (no reward variance in any group) are not measured. The first step is a small
probe, then the lr moves towards the target by at most a factor ``max_change`` per step. Cost: two parameter-sized buffers (previous parameters and gradient) and
a few fused passes over them per step; no extra forward or backward. docs/algorithm.md has the derivation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

from oblr.checks import Range
from oblr.lr_control import LRController
from oblr.registry import Registry
from oblr.schedules import register_schedule
from oblr.snr import SNRStats

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch

NOISE_GAINS = Registry("optimizer noise gain (auto lr)")


def dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """``sum_p <a_p, b_p>`` over parameter lists (float64, 0-d)."""
    import torch

    return sum((torch.sum(x.double() * y.double()) for x, y in zip(a, b)), torch.zeros((), dtype=torch.float64))


def line_terms(g_prev: list[torch.Tensor], g_now: list[torch.Tensor], delta: list[torch.Tensor]):
    """``(-<g_prev, delta>, <g_now, delta>, |delta|^2)`` as floats: the raw secant terms of one step."""
    return float(-dot(g_prev, delta)), float(dot(g_now, delta)), float(dot(delta, delta))


def descent_and_curvature(a_raw: float, b: float, kappa: float, lr: float) -> tuple[float, float]:
    """``(d, h)`` per unit lr from the raw terms: ``A = a_raw + kappa``, ``d = A/lr``, ``h = (A + b)/lr^2``.

    a_raw = -<g_{t-1}, delta>, b = <g_t, delta>, kappa = E<xi_{t-1}, delta> (<= 0), lr = the lr of the step."""
    A = a_raw + kappa
    return A / lr, (A + b) / lr**2


def sgd_kappa(lr: float, clip_factor: float, V: float, n: int, gain: float = 1.0) -> float:
    """``kappa = -lr * c * gain * V / n``: the expected <xi, delta> of a step delta = -lr c P g with
    ``gain = tr(P Sigma)/tr(Sigma)`` (1 for SGD)."""
    return -lr * clip_factor * gain * V / n


#: the running averages before any measurement: (d, y = h lr^2, q = lr^2, d^2, y^2)
EMPTY_AVERAGES = (0.0, 0.0, 0.0, 0.0, 0.0)


def average_line_terms(avgs: tuple, d: float, h: float, lr: float, beta: float) -> tuple:
    """One EMA update of ``(d, y, q, d^2, y^2)`` with a step's ``d``, ``h`` measured at ``lr``: ``d`` is
    averaged as it is (the noise of ``A`` is of order ``lr``, so ``A/lr`` has the same noise at any lr);
    ``h`` enters as ``y = h lr^2 = A + B`` against ``q = lr^2`` -- the lr^2-weighted least-squares fit of
    ``A + B = lr^2 h + noise`` (noise of order ``lr``), so a step too small to resolve the curvature weighs
    little (a plain average of ``h`` is dominated by them: attempt 2 in docs/algorithm.md). The squares give
    the spread of ``d`` and ``y`` for the confidence bounds of :func:`line_estimates`."""
    y = h * lr**2
    new = (d, y, lr**2, d * d, y * y)
    return tuple(beta * a + (1 - beta) * x for a, x in zip(avgs, new))


def effective_count(n: int, beta: float) -> float:
    """The number of equally weighted measurements a bias-corrected EMA of ``n`` measurements is worth:
    ``1 / sum w_i^2`` with ``w_i = (1-beta) beta^(n-i) / (1-beta^n)`` (``n`` for beta = 0 ... ``n`` small;
    ``(1+beta)/(1-beta)`` as n grows)."""
    if n <= 0:
        return 0.0
    if beta == 0.0:
        return 1.0
    sum_w2 = (1 - beta) ** 2 * (1 - beta ** (2 * n)) / ((1 - beta**2) * (1 - beta**n) ** 2)
    return 1.0 / sum_w2


def line_estimates(avgs: tuple, n: int, beta: float, z: float = 0.0) -> tuple[float, float]:
    """``(d, h)`` from the averages after ``n`` updates: ``z = 0`` gives the point estimates (the
    bias-corrected mean of ``d``; ``h = mean(y) / mean(q)``, the bias corrections cancel); ``z > 0`` gives
    the cautious ends of their confidence intervals, ``d - z se(d)`` and ``(mean(y) + z se(y)) / mean(q)``
    with ``se = spread / sqrt(effective_count)``: a step that is long only because the averages are noisy
    is not taken."""
    if n <= 0:
        return 0.0, 0.0
    corr = 1 - beta**n
    d, y, q, d2, y2 = (a / corr for a in avgs)
    if q <= 0:
        return d, 0.0
    if z > 0:
        m = effective_count(n, beta)
        d -= z * math.sqrt(max(d2 - d * d, 0.0) / m)
        y += z * math.sqrt(max(y2 - y * y, 0.0) / m)
    return d, y / q


def target_lr(d: float, h: float, lr: float, max_change: float) -> float:
    """The next lr: ``d/h`` when both are positive, kept within ``[lr/max_change, lr*max_change]``.
    No descent measured (d <= 0: the average is noise) keeps the lr; descent without measurable curvature
    (h <= 0 < d: the curvature is below the noise of a step this small) grows it by ``max_change``."""
    if not (d > 0 and math.isfinite(d)):
        return lr
    if not (h > 0 and math.isfinite(h)):
        return lr * max_change
    return min(max(d / h, lr / max_change), lr * max_change)


@NOISE_GAINS.register("SGD")
def _sgd_gain(optimizer, params, g_prev, g_prev_sq: float) -> float:
    return 1.0


@NOISE_GAINS.register("Adam")
@NOISE_GAINS.register("AdamW")
def _adam_gain(optimizer, params, g_prev, g_prev_sq: float) -> float:
    """(1-b1)/(1-b1^k) * sum_i g_i^2 / (sqrt(vhat_i) + eps) / |g|^2 from the optimizer state after step k."""
    import torch

    if g_prev_sq <= 0:
        return 0.0
    group = optimizer.param_groups[0]
    b1, b2 = group["betas"]
    eps = group["eps"]
    total = torch.zeros((), dtype=torch.float64)
    k = None
    for p, g in zip(params, g_prev):
        st = optimizer.state.get(p)
        if not st or "exp_avg_sq" not in st:
            continue
        k = float(st["step"])
        vhat = st["exp_avg_sq"].double() / (1 - b2**k)
        total = total + (g.double().pow(2) / (vhat.sqrt() + eps)).sum()
    if k is None:
        return 0.0
    return (1 - b1) / (1 - b1**k) * float(total) / g_prev_sq


@register_schedule("auto")
class AutoStepSchedule(LRController):
    """lr_{t+1} = clamp(dbar/hbar) (module docstring); ``lr`` is the initial guess.

    The first step is a probe at ``probe * lr`` (a step small enough to be harmless; AdamW's first step
    moves every coordinate by about its lr); then the lr moves towards ``dbar/hbar`` by at most a factor
    ``max_change`` per step. ``scale_ema`` smooths d and h (bias-corrected EMA; 0 = this step only;
    ``optim.snr_ema`` does not apply); ``grad_clip`` is the clip norm the trainer applies after ``step``
    (0 = off). Reads the parameters and their ``.grad`` (the raw gradient: ``step`` is called before
    clipping) from the optimizer's param groups."""

    needs_snr = True

    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0, grad_clip=0.0,
                 max_change: Annotated[float, Range(ge=1, le=1e6)] = 1.1,
                 scale_ema: Annotated[float, Range(ge=0, lt=1)] = 0.98,
                 probe: Annotated[float, Range(gt=0, le=1)] = 0.01,
                 confidence: Annotated[float, Range(ge=0, le=100)] = 1.0):
        name = type(optimizer).__name__
        self.gain = NOISE_GAINS.get(name)
        self.params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not (0.0 <= scale_ema < 1.0 and max_change >= 1.0 and 0 < probe <= 1 and confidence >= 0):
            raise ValueError(f"auto schedule: need 0 <= scale_ema < 1, max_change >= 1, 0 < probe <= 1, "
                             f"confidence >= 0; got {scale_ema}, {max_change}, {probe}, {confidence}")
        self.confidence = float(confidence)
        super().__init__(optimizer, warmup_steps)
        self.lr, self.eta_min, self.ema, self.grad_clip = float(lr) * probe, float(eta_min), float(scale_ema), float(grad_clip)
        self.max_change = float(max_change)
        self.prev: dict | None = None  # theta, g (lists), lr, clip factor, V, n, |g|^2 of the last step
        self.avgs = EMPTY_AVERAGES
        self.n_avg = 0
        self.last: dict = {}
        self._set(self.lr)

    def _set(self, lr: float) -> None:
        self._apply(self.warmup() * max(self.eta_min, lr))

    def _measure(self, g_now: list[torch.Tensor], g_now_sq: float) -> None:
        import torch

        p = self.prev
        with torch.no_grad():
            delta = torch._foreach_sub([q.detach() for q in self.params], p["theta"])
            a_raw, b, dd = line_terms(p["g"], g_now, delta)
        if dd <= 0 or p["lr"] <= 0 or p["g_sq"] <= 0 or g_now_sq <= 0:
            # nothing to learn from: no step, or a zero gradient (every group's rewards equal, e.g. a
            # collapsed policy): the lr is kept, not grown on averages that only decay
            self.last = {**self.last, "auto/skipped": 1.0}
            return
        gain = self.gain(self.optimizer, self.params, p["g"], p["g_sq"])
        kappa = sgd_kappa(p["lr"], p["clip"], p["V"], p["n"], gain)
        d, h = descent_and_curvature(a_raw, b, kappa, p["lr"])
        if not (math.isfinite(d) and math.isfinite(h)):
            return
        self.n_avg += 1
        self.avgs = average_line_terms(self.avgs, d, h, p["lr"], self.ema)
        d_bar, h_bar = line_estimates(self.avgs, self.n_avg, self.ema)
        d_lo, h_hi = line_estimates(self.avgs, self.n_avg, self.ema, z=self.confidence)
        self.last = {"auto/d": d, "auto/h": h, "auto/d_avg": d_bar, "auto/h_avg": h_bar, "auto/d_low": d_lo,
                     "auto/h_high": h_hi, "auto/skipped": 0.0,
                     "auto/curvature": (a_raw + kappa + b) / dd, "auto/kappa_share": -kappa / a_raw if a_raw else 0.0}
        self.lr = target_lr(d_lo, h_hi, self.lr, self.max_change)

    def step(self, stats: SNRStats | None = None) -> None:
        import torch

        if stats is None:
            raise ValueError("the auto schedule needs the step's SNR statistics (V: the noise correction)")
        g_now = [q.grad.detach() if q.grad is not None else torch.zeros_like(q) for q in self.params]
        with torch.no_grad():
            g_sq = float(dot(g_now, g_now))
        if self.prev is not None:
            self._measure(g_now, g_sq)
        self._set(self.lr)
        self.t += 1
        self.stats = stats
        with torch.no_grad():
            clip = min(1.0, self.grad_clip / math.sqrt(g_sq)) if self.grad_clip > 0 and g_sq > 0 else 1.0
            self.prev = {"theta": [q.detach().clone() for q in self.params], "g": [g.clone() for g in g_now],
                         "lr": self._last[0], "clip": clip, "V": max(float(stats.V), 0.0), "n": int(stats.n),
                         "g_sq": g_sq}

    def metrics(self) -> dict:
        m = {**super().metrics(), **self.last}
        if getattr(self, "stats", None) is not None:
            m.update(self.stats.metrics())
        return m

    # the counter is ``t`` and the applied lr ``_applied`` as before oblr.lr_control (which writes it as a list
    # of one lr per group and reads the old single number too)
    COUNTER_KEY, LAST_KEY = "t", "_applied"
    _STATE = ("lr", "eta_min", "ema", "grad_clip", "warmup_steps", "max_change", "prev", "avgs", "confidence",
              "n_avg", "last")
