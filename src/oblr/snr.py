"""Gradient signal/noise statistics and the SNR learning-rate controller (OBLR-PO, paper Theorem 4).

This module is the one home of S, V, the SNR and the learning-rate factor: the update
(:func:`oblr.update.accumulate_policy_gradient`), the trainer and the schedules call
:func:`snr_statistics`; nothing else computes them. With per-prompt gradient estimates g_k (k = 1..N)
of one step and their mean gbar (the step's gradient):

    V      = (sum_k ||g_k||^2 - N ||gbar||^2) / (N - 1)   unbiased for tr Cov(g_q)
    signal = ||gbar||^2 - V / N                            unbiased for ||grad J||^2 (can be < 0)
    S      = max(signal, 0)
    SNR    = S / V
    eta    = eta_max * S / (S + V/N) = eta_max * N SNR / (1 + N SNR)
    snr_adam: eta = eta_max * S / (S + kappa_k V/N), kappa_k = momentum_noise_share(beta1, k) (oblr's rule for
              Adam's averaged step, :class:`AdamSNRLearningRate`; not the paper's)

Only the ratio matters for the step size, so the g_k may carry any common scale; what matters is that
gbar = (1/N) sum_k g_k. If a backward pass yields per-prompt *contributions* h_k with g = sum_k h_k, then
g_k = N h_k. Conventions where the maths is undefined (never NaN):
V = 0 -> SNR = inf when S > 0, 0 when S = 0; S = V = 0 -> factor 0 (:func:`snr_factor`). In the
controller (:class:`SNRLearningRate`) a step with S = V = 0 gives factor 0 (lr = ``eta_min``) only without
EMA history (``ema = 0`` or the first update); with history it is averaged in and the factor stays the
previous step's (both averages shrink by the same ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oblr.lr_control import LRController

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch


def _snr(S: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """S / V with V <= 0 -> inf (S > 0) or 0 (S == 0). Never NaN for finite inputs."""
    import torch

    pos = V > 0
    safe = torch.where(pos, V, torch.ones_like(V))
    return torch.where(pos, S / safe, torch.where(S > 0, torch.full_like(S, math.inf), torch.zeros_like(S)))


@dataclass(frozen=True)
class SNRStats:
    """The gradient statistics of one step (0-d tensors; nothing is copied to the host until asked).

    ``S`` = max(signal, 0), ``V`` (unclamped; >= 0 up to rounding when the g_k are the per-prompt terms of
    the update), ``snr`` = S / V, ``signal`` = ||gbar||^2 - V/N unclamped (what an average over steps
    should average), ``n`` = N prompts.
    """

    S: torch.Tensor
    V: torch.Tensor
    snr: torch.Tensor
    signal: torch.Tensor
    n: int

    def metrics(self) -> dict[str, float]:
        """``snr/{S,V,snr,n_snr,factor}`` of this step (floats; one host sync)."""
        return snr_metrics(float(self.S), float(self.V), self.n)


def snr_statistics(per_prompt_sq_norms: torch.Tensor, mean_grad_sq_norm, n_prompts: int | None = None) -> SNRStats:
    """:class:`SNRStats` from per-prompt squared norms and the squared norm of their mean.

    per_prompt_sq_norms: [N] tensor of ||g_k||^2, or a 0-d tensor holding their sum (e.g. after an
    all-reduce over data-parallel ranks; then ``n_prompts`` is required). mean_grad_sq_norm: ||gbar||^2.
    Computed in the dtype of ``per_prompt_sq_norms`` (float64 for integer input). No host sync.
    """
    import torch

    sq = torch.as_tensor(per_prompt_sq_norms)
    if not sq.is_floating_point():
        sq = sq.double()
    if sq.dim() == 1:
        if n_prompts is not None and n_prompts != sq.shape[0]:
            raise ValueError(f"per_prompt_sq_norms has {sq.shape[0]} entries but n_prompts = {n_prompts}")
        n_prompts = sq.shape[0]
        total = sq.sum()
    elif sq.dim() == 0:
        if n_prompts is None:
            raise ValueError("per_prompt_sq_norms is a scalar (a sum): pass n_prompts")
        total = sq
    else:
        raise ValueError(f"per_prompt_sq_norms must be [N] or a scalar sum, got shape {tuple(sq.shape)}")
    if n_prompts < 2:
        raise ValueError(f"signal_noise needs at least N = 2 prompts to estimate the noise, got N = {n_prompts}")
    mean_sq = torch.as_tensor(mean_grad_sq_norm, dtype=total.dtype, device=total.device)
    V = (total - n_prompts * mean_sq) / (n_prompts - 1)
    return _stats(mean_sq - V / n_prompts, V, int(n_prompts))


def _stats(signal: torch.Tensor, V: torch.Tensor, n: int) -> SNRStats:
    S = signal.clamp(min=0.0)
    return SNRStats(S=S, V=V, snr=_snr(S, V), signal=signal, n=n)


def signal_noise(per_prompt_sq_norms: torch.Tensor, mean_grad_sq_norm, n_prompts: int | None = None):
    """``(S, V, SNR)`` as 0-d tensors: the first three fields of :func:`snr_statistics` (same arguments).

    V is returned as computed (it is >= 0 up to rounding); S is clamped at 0. No host sync.
    """
    st = snr_statistics(per_prompt_sq_norms, mean_grad_sq_norm, n_prompts)
    return st.S, st.V, st.snr


def signal_noise_from_microbatches(micro_sq_norms, micro_size: int, full_sq_norm, full_size: int):
    """(S, V, SNR) from micro-batch and full-batch gradient squared norms (McCandlish et al. 2018).

    micro_sq_norms: [M] squared norms ||G_m||^2 of micro-batch mean gradients, each over ``micro_size``
    prompts (or a 0-d mean of them); full_sq_norm: ||G||^2 of the mean gradient over ``full_size`` prompts.
    With E||G_b||^2 = ||grad J||^2 + tr Sigma / b for a mean over b iid prompts:

        V = (mean_m ||G_m||^2 - ||G||^2) / (1/micro_size - 1/full_size)       unbiased for tr Sigma
        S = max(||G||^2 - V / full_size, 0)   (= (B|G|^2 - b|G_b|^2)/(B - b), clamped)

    V is NOT clamped (it can be negative by chance; the controller clamps after any smoothing).
    """
    import torch

    if not (0 < micro_size < full_size):
        raise ValueError(f"need 0 < micro_size < full_size, got micro_size={micro_size}, full_size={full_size}")
    micro = torch.as_tensor(micro_sq_norms)
    if not micro.is_floating_point():
        micro = micro.double()
    if micro.dim() > 1 or micro.numel() == 0:
        raise ValueError(f"micro_sq_norms must be [M] (M >= 1) or a scalar mean, got shape {tuple(micro.shape)}")
    small = micro.mean()
    big = torch.as_tensor(full_sq_norm, dtype=small.dtype, device=small.device)
    V = (small - big) / (1.0 / micro_size - 1.0 / full_size)
    st = _stats(big - V / full_size, V, int(full_size))
    return st.S, st.V, st.snr


def snr_factor(S: float, V: float, n: int) -> float:
    """S / (S + V/n) in [0, 1] for S >= 0, V >= 0; 1 when V = 0 < S, 0 when S = V = 0."""
    den = S + V / n
    return S / den if den > 0 else 0.0


def momentum_noise_share(beta1: float, k: int) -> float:
    """kappa_k: the variance of Adam's bias-corrected first moment after k steps, as a share of one step's
    gradient variance, for independent gradients of equal variance.

    ``mhat_k = (1 - b)/(1 - b^k) sum_{j<k} b^j g_{k-j}`` weighs the last k gradients, so its variance is
    ``sum_j w_j^2 = (1 - b)(1 + b^k) / ((1 + b)(1 - b^k))`` times one gradient's: 1 at k = 1 (and for
    b = 0, no momentum), falling to ``(1 - b)/(1 + b)`` (0.053 at b = 0.9) as k grows. The step applies the
    average of about ``1/kappa`` gradients, so its noise is that of ``N / kappa`` prompts.
    """
    if not (0.0 <= beta1 < 1.0):
        raise ValueError(f"beta1 must be in [0, 1), got {beta1}")
    if int(k) != k or k < 1:
        raise ValueError(f"k (optimizer steps including this one) must be a positive integer, got {k}")
    if beta1 == 0.0:
        return 1.0
    bk = beta1 ** int(k)
    return (1.0 - beta1) * (1.0 + bk) / ((1.0 + beta1) * (1.0 - bk))


def snr_metrics(S: float, V: float, n: int) -> dict[str, float]:
    """``snr/{S,V,snr,n_snr,factor}`` for logging (floats), with the module's conventions for V <= 0."""
    import torch

    snr = float(_snr(torch.tensor(S, dtype=torch.float64), torch.tensor(V, dtype=torch.float64)))
    return {"snr/S": S, "snr/V": V, "snr/snr": snr, "snr/n_snr": n * snr if snr else 0.0,
            "snr/factor": snr_factor(S, V, n)}


class SNRLearningRate(LRController):
    """Sets every param group's lr to ``warm(t) * max(eta_min, eta_max * S / (S + V/n))`` each step.

    Call ``step(signal, V, n)`` once per optimizer step, BEFORE ``optimizer.step()``, with the statistics of
    the gradient about to be applied (floats or 0-d tensors; n: prompts in the step). Pass the UNCLAMPED
    signal estimate (``SNRStats.signal``); a clamped S gives the same lr when ``ema = 0`` but biases an EMA
    upward.

    - ``eta_max``: a float (every group), a list (one per group) or None: each group's initial lr
      (``group["initial_lr"]`` if set, else its ``lr``), which makes the rule a multiplier of the
      optimizer's lr (the AdamW use).
    - ``eta_min``: absolute lr floor (applied before warm-up), so that training never stalls.
    - ``ema``: in [0, 1); when > 0, the signal and V are exponential moving averages with bias correction
      ``avg / (1 - ema^k)`` after k accepted updates. Both are averaged unclamped (averages of unbiased
      estimates stay unbiased) and clamped at 0 afterwards: S = max(avg signal, 0), V = max(avg V, 0).
    - S = V = 0 in a step (every g_k = 0): factor 0, lr = ``eta_min``, when there is no EMA history
      (``ema = 0`` or the first update); with history both averages are multiplied by the same number, so
      the factor and lr stay the previous step's. The step's gradient is 0 either way: SGD does not move,
      AdamW moves along its momentum at that lr.
    - ``warmup_steps``: linear warm-up factor ``min(1, k / warmup_steps)`` at the k-th accepted update
      (:class:`oblr.lr_control.LRController`, with its step counter ``t = k - 1`` before the update).

    A non-finite S or V leaves the lr unchanged, does not advance k, and is counted (``n_skipped``).
    """

    def __init__(self, optimizer, eta_max=None, *, eta_min: float = 0.0, ema: float = 0.0, warmup_steps: int = 0):
        groups = optimizer.param_groups
        if eta_max is None:
            for g in groups:
                g.setdefault("initial_lr", g["lr"])
            eta_max = [float(g["initial_lr"]) for g in groups]
        elif isinstance(eta_max, (list, tuple)):
            if len(eta_max) != len(groups):
                raise ValueError(f"eta_max has {len(eta_max)} entries for {len(groups)} param groups")
            eta_max = [float(e) for e in eta_max]
        else:
            eta_max = [float(eta_max)] * len(groups)
        if any(not math.isfinite(e) or e <= 0 for e in eta_max):
            raise ValueError(f"eta_max must be positive and finite, got {eta_max}")
        if not (math.isfinite(eta_min) and eta_min >= 0):
            raise ValueError(f"eta_min must be >= 0, got {eta_min}")
        if not (0.0 <= ema < 1.0):
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        super().__init__(optimizer, warmup_steps)  # t: accepted updates so far
        self.eta_max, self.eta_min, self.ema = eta_max, float(eta_min), float(ema)
        self.n_skipped = 0      # ignored updates (non-finite S or V)
        self._s_avg = self._v_avg = 0.0
        self.last_S = self.last_V = None
        self.last_n = None
        self.last_factor = None

    @property
    def steps(self) -> int:
        """Accepted updates (the step counter ``t``)."""
        return self.t

    def _smooth(self, S: float, V: float, k: int) -> tuple[float, float]:
        if self.ema == 0.0:
            return S, V
        b = self.ema
        self._s_avg = b * self._s_avg + (1 - b) * S
        self._v_avg = b * self._v_avg + (1 - b) * V
        corr = 1.0 - b**k
        return self._s_avg / corr, self._v_avg / corr

    def step(self, S, V, n: int) -> list[float]:
        """Update the lrs from this step's unclamped signal estimate ``S`` and ``V`` (n prompts). Returns the
        new lrs (one per group)."""
        if int(n) != n or n < 1:
            raise ValueError(f"n (prompts in the step) must be a positive integer, got {n}")
        S, V = float(S), float(V)  # one host sync per step: not the hot path
        if not (math.isfinite(S) and math.isfinite(V)):
            self.n_skipped += 1
            return self.get_last_lr()
        S, V = self._smooth(S, V, self.t + 1)  # average the unclamped estimates, clamp the averages
        S, V = max(S, 0.0), max(V, 0.0)
        factors = [snr_factor(S, share * V, int(n)) for share in self.noise_shares(self.t + 1)]
        warm = self.warmup()
        self._apply([warm * max(self.eta_min, e * f) for e, f in zip(self.eta_max, factors)])
        self.t += 1
        self.last_S, self.last_V, self.last_n, self.last_factor = S, V, int(n), factors[0]
        return self.get_last_lr()

    def noise_shares(self, k: int) -> list[float]:
        """The share of V that the k-th update's step carries, one per param group: 1 here (the paper's
        rule, one step's gradient); :class:`AdamSNRLearningRate` counts the momentum's averaging."""
        return [1.0] * len(self.eta_max)

    def metrics(self) -> dict[str, float]:
        """``snr/{S,V,snr,n_snr,factor,lr,skipped}`` (S, V after smoothing; before the first accepted
        update only ``snr/lr`` and ``snr/skipped``)."""
        m = {**super().metrics(), "snr/skipped": float(self.n_skipped)}
        if self.last_factor is not None:
            m.update(snr_metrics(self.last_S, self.last_V, self.last_n))
            m["snr/factor"] = self.last_factor  # the applied factor (the first param group's)
        return m

    COUNTER_KEY, LAST_KEY = "steps", "last_lr"  # this controller's checkpoint format (oblr.lr_control)
    _STATE = ("eta_max", "eta_min", "ema", "warmup_steps", "n_skipped", "_s_avg", "_v_avg",
              "last_S", "last_V", "last_n", "last_factor")


class AdamSNRLearningRate(SNRLearningRate):
    """``snr_adam``: OBLR-PO's factor for an Adam-family step, ``S / (S + kappa_k V / n)`` with kappa_k =
    :func:`momentum_noise_share` of each param group's beta1 at the k-th update (docs/algorithm.md).

    Adam applies ``mhat / (sqrt(vhat) + eps)``: the bias-corrected average of the last ~1/kappa gradients,
    so the noise of the step it takes is kappa_k V / n, not the V / n of one step's gradient that the paper's
    rule (derived for SGD) charges. With ``beta1 = 0`` every kappa is 1 and the rule is
    :class:`SNRLearningRate` exactly. Everything else (``eta_max``, ``eta_min``, the EMA of the unclamped
    estimates, warm-up, skipped steps) is the parent's. ``beta1``: one number, or one per param group.
    """

    _STATE = SNRLearningRate._STATE + ("beta1",)

    def __init__(self, optimizer, eta_max=None, *, beta1, eta_min: float = 0.0, ema: float = 0.0,
                 warmup_steps: int = 0):
        super().__init__(optimizer, eta_max, eta_min=eta_min, ema=ema, warmup_steps=warmup_steps)
        n = len(self.eta_max)
        beta1 = [float(b) for b in beta1] if isinstance(beta1, (list, tuple)) else [float(beta1)] * n
        if len(beta1) != n:
            raise ValueError(f"beta1 has {len(beta1)} entries for {n} param groups")
        for b in beta1:
            momentum_noise_share(b, 1)  # range check
        self.beta1 = beta1

    def noise_shares(self, k: int) -> list[float]:
        return [momentum_noise_share(b, k) for b in self.beta1]

    def metrics(self) -> dict[str, float]:
        """The parent's, plus ``snr/n_eff``: the prompts whose noise the step carries, n / kappa (first group)."""
        m = super().metrics()
        if self.last_factor is not None:
            m["snr/n_eff"] = self.last_n / momentum_noise_share(self.beta1[0], self.t)
        return m
