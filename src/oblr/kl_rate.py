"""The policy-change learning rate: ``algorithm.lr_schedule=kl`` sets each step's lr so that the update
moves the policy by a target per-token KL (a trust region on the step's size; an extension, NOT the
paper's rule).

A step ``theta -> theta + eta u`` (``u`` the lr-free direction the optimizer takes: ``-c g`` for SGD,
``-c mhat/(sqrt(vhat)+eps)`` for AdamW, ``c`` the clip factor) changes the policy by the per-token KL

    KL(eta) = eta^2 u^T F u / 2 + O(eta^3)        (F the per-token Fisher information on the batch)

quadratic in eta whatever the optimizer. oblr measures that KL after every update, exactly on the update's
own rows (``policy/step_kl``, :func:`oblr.update.step_kl_sums`), at the lr it applied, so the stiffness
``k_t = KL_t / lr_t^2`` is measured, not modelled, and the lr that would have moved the policy by the target
``delta`` is ``sqrt(delta / k_t)``. The rule (pure: :func:`next_lr`):

    log k averaged over the measured steps (bias-corrected EMA, ``kl_ema``; 0 = the last step only)
    lr_{t+1} = min(sqrt(delta / kbar), max_change * lr_t)      (shrinks at once, grows by at most max_change)

The first step is a probe at ``probe * optim.lr`` (``optim.lr`` is only a guess of the scale); the lr after
the first measurement is ``sqrt(delta / k_0)`` uncapped (the quadratic law needs one measurement to set the
scale). A step that did not move the policy (KL = 0: no reward variance in any group, so a zero gradient)
keeps the lr. ``delta`` is in nats per response token and means the same for SGD and AdamW: the rates those
two need differ by four decades, the KL a step may move the policy need not. Whether one ``delta`` serves
every task is a measurement (docs/results.md, "The paper's regime"), not a property of the rule.

``delta`` (``schedule_options.target``) defaults to 1.5e-3 x N / 128 for N prompts per step with AdamW (``oblr
train`` passes ``rollout.prompts_per_step``): 1.5e-3 at the paper's N = 128, 1.875e-4 at N = 16; with SGD to
3e-3 at every N. Adam's step has a normalised size, so its KL per step does not see the gradient's noise: a
smaller batch's step of the same KL is more noise, and Adam's square-root scaling rule (lr ~ sqrt(batch)) is, in
KL ~ lr^2, a KL per step proportional to the batch. SGD's step grows with the noise (``|g|^2`` counts it), so its
KL already does, and the rule shrinks SGD's rate as N falls by itself. The values are measurements on the three
built-in tasks (docs/results.md, docs/algorithm.md): 1.5e-3 is about the KL per step that the tuned AdamW rates
moved the policy by over steps 10-12 at N = 128 (3e-3, the default until this commit, was their mean over steps
1-12, and applied 1.4-1.5x the tuned rate); at N = 16 AdamW with an unscaled 3e-3 applied 3x the best fixed rate
and lost; SGD with 3e-3 was level with the tuned rate and with 3.75e-4 fell behind it.

Cost: one forward pass without gradients over the batch per step (``time/step_kl``). It runs where that
measurement runs: ``oblr train`` in one process and under torchrun (DDP, FSDP2: every rank reads the same
gathered KL, so the lrs are bit-identical), TRL's ``OBLRGRPOTrainer`` (``oblr_lr_schedule='kl'``: a post-step
hook of the optimizer, not under DeepSpeed) and verl's recipe (``+actor_rollout_ref.oblr.lr_schedule=kl``:
after the actor engine's ``optimizer_step``), each summing the KL over processes before dividing.
"""

from __future__ import annotations

import math
from typing import Annotated

from oblr.checks import Range
from oblr.lr_control import LRController
from oblr.schedules import register_schedule

#: the per-token KL an AdamW step moves the policy by at :data:`REFERENCE_PROMPTS` prompts per step, when
#: ``schedule_options.target`` is not given: about what the tuned AdamW rates of the built-in tasks moved it by
#: over steps 10-12 in the paper's regime (benchmarks/step_kl_report.py)
DEFAULT_TARGET = 1.5e-3
#: the same for SGD, at every N (its KL per step counts the gradient's noise already)
SGD_TARGET = 3e-3
#: the batch :data:`DEFAULT_TARGET` was measured at (N = 128 prompts x 8 samples)
REFERENCE_PROMPTS = 128


def default_target(prompts_per_step: int | None, adaptive: bool = True) -> float:
    """The target when none is given: for an adaptive optimizer (``adaptive``: AdamW) :data:`DEFAULT_TARGET` x
    N / :data:`REFERENCE_PROMPTS` (the square-root scaling of Adam's rate with the batch, lr ~ sqrt(N), written
    in KL ~ lr^2), and :data:`DEFAULT_TARGET` when N is not known (a controller built outside ``oblr train``);
    :data:`SGD_TARGET` for SGD at every N (its KL counts the noise already: module docstring)."""
    if not adaptive:
        return SGD_TARGET
    if prompts_per_step is None:
        return DEFAULT_TARGET
    return DEFAULT_TARGET * prompts_per_step / REFERENCE_PROMPTS


def stiffness(kl: float, lr: float) -> float | None:
    """``KL / lr^2`` of a step that moved the policy (None when it did not: KL <= 0, lr <= 0 or not finite)."""
    if not (kl > 0 and lr > 0 and math.isfinite(kl) and math.isfinite(lr)):
        return None
    return kl / lr**2


def average_log(avg: float, n: int, value: float, beta: float) -> tuple[float, int, float]:
    """One bias-corrected EMA update of ``log value``: ``(new raw average, new count, corrected mean)``;
    ``beta = 0`` keeps only the newest value (the mean is then exactly ``log value``)."""
    avg = beta * avg + (1 - beta) * math.log(value)
    n += 1
    return avg, n, avg / (1 - beta**n)


def next_lr(mean_log_k: float, target: float, lr: float, max_change: float, first: bool) -> float:
    """``sqrt(target / kbar)`` with ``kbar = exp(mean_log_k)``, at most ``max_change * lr`` unless this is
    the first measurement (``first``: the scale is set by it, in either direction)."""
    want = math.sqrt(target) * math.exp(-0.5 * mean_log_k)
    return want if first else min(want, max_change * lr)


def is_sgd(optimizer) -> bool:
    import torch

    return isinstance(optimizer, torch.optim.SGD)


@register_schedule("kl")
class KLStepSchedule(LRController):
    """lr_{t+1} = min(sqrt(target / kbar), max_change lr_t) from the measured per-step KL (module docstring).

    ``lr``: the guess of the scale (the first step runs at ``probe * lr``); ``eta_min``: a floor; warm-up
    multiplies the rule's lr. The trainer calls :meth:`step` before each update (sets its lr) and
    :meth:`observe_step_kl` after it with ``policy/step_kl``; ``needs_step_kl`` asks it to measure."""

    needs_snr = False
    needs_step_kl = True

    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0,
                 target: Annotated[float | None, Range(gt=0, le=10)] = None,
                 prompts_per_step: Annotated[int | None, Range(ge=1)] = None,
                 max_change: Annotated[float, Range(ge=1, le=1e6)] = 2.0,
                 kl_ema: Annotated[float, Range(ge=0, lt=1)] = 0.5,
                 probe: Annotated[float, Range(gt=0, le=1)] = 0.1):
        if target is None:
            target = default_target(prompts_per_step, adaptive=not is_sgd(optimizer))
        if not (0 < target and max_change >= 1 and 0 <= kl_ema < 1 and 0 < probe <= 1):
            raise ValueError(f"kl schedule: need target > 0, max_change >= 1, 0 <= kl_ema < 1, 0 < probe <= 1; "
                             f"got {target}, {max_change}, {kl_ema}, {probe}")
        super().__init__(optimizer, warmup_steps)
        self.lr, self.eta_min = float(lr) * probe, float(eta_min)
        self.target, self.max_change, self.kl_ema = float(target), float(max_change), float(kl_ema)
        self.avg, self.n = 0.0, 0
        self.last: dict = {}
        self._set()

    def _set(self) -> None:
        self._apply(self.warmup() * max(self.eta_min, self.lr))

    def step(self, stats=None) -> None:
        """Set the lr of the step about to be taken (the statistics are not read)."""
        self._set()
        self.t += 1

    def observe_step_kl(self, kl: float) -> None:
        """The per-token KL the step just taken (at :meth:`get_last_lr`) moved the policy by."""
        k = stiffness(kl, self._last[0])
        if k is None:
            self.last = {"kl/skipped": 1.0}
            return
        first = self.n == 0
        self.avg, self.n, mean_log_k = average_log(self.avg, self.n, k, self.kl_ema)
        self.lr = next_lr(mean_log_k, self.target, self.lr, self.max_change, first)
        self.last = {"kl/stiffness": k, "kl/stiffness_avg": math.exp(mean_log_k), "kl/skipped": 0.0}

    def metrics(self) -> dict:
        return {**super().metrics(), "kl/target": self.target, **self.last}

    _STATE = ("lr", "eta_min", "target", "max_change", "kl_ema", "avg", "n", "last")
