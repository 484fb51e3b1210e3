"""Learning-rate schedules behind one interface, chosen by name (``algorithm.lr_schedule``).

Every controller is built by ``make_lr_controller(name, optimizer, lr=..., ...)`` from the registry
:data:`SCHEDULES` and has ``step(stats)`` (called once per optimizer step, before it, with the step's
:class:`oblr.snr.SNRStats` or None; constant/cosine ignore it), ``needs_snr`` (whether the update must
compute the statistics), ``get_last_lr()``, ``metrics()``, ``state_dict()`` and ``load_state_dict()``.
The trainer never branches on the schedule's name. The warm-up, the step counter, setting the param
groups' lr and the shared state live once in :class:`oblr.lr_control.LRController`, which every built-in
controller subclasses (:class:`SNRSchedule` adapts :class:`~oblr.snr.SNRLearningRate`, one of them). Registered: ``snr`` (OBLR-PO, :class:`SNRSchedule`
over :class:`oblr.snr.SNRLearningRate`), ``snr_adam`` (the same factor for an Adam-family step, counting its
momentum's averaging: :class:`oblr.snr.AdamSNRLearningRate`; Adam-family optimizers only, the
``optimizers`` attribute), ``constant``, ``cosine`` (with linear warm-up), ``auto``
(the measured step scale, :mod:`oblr.step_scale`) and ``kl`` (the lr that moves the policy by a target KL per
step, :mod:`oblr.kl_rate`; its controller also has ``observe_step_kl``, called after each update when its
``needs_step_kl`` is set), the last two registered when the registry first loads their modules.
"""

from __future__ import annotations

import inspect
import math

from oblr.lr_control import LRController, warmup_factor
from oblr.registry import Registry
from oblr.snr import AdamSNRLearningRate, SNRLearningRate, SNRStats

SCHEDULES = Registry("learning-rate schedule", modules=("oblr.step_scale", "oblr.kl_rate"))  # "auto", "kl"


def register_schedule(name: str):
    """Decorator: register a controller class/factory ``f(optimizer, *, lr, eta_min, warmup_steps,
    total_steps, ema)`` under ``name`` (duplicates rejected)."""
    return SCHEDULES.register(name)


def available_schedules() -> list[str]:
    return SCHEDULES.names()


#: the keyword arguments every schedule factory takes (the rest of a factory's keywords are its own options)
COMMON_ARGS = frozenset({"optimizer", "lr", "eta_min", "warmup_steps", "total_steps", "ema", "grad_clip"})


def schedule_options(name: str) -> list[str]:
    """The options of schedule ``name`` beyond :data:`COMMON_ARGS` (e.g. ``auto``'s ``max_change``)."""
    params = inspect.signature(SCHEDULES.get(name)).parameters
    return [k for k, p in params.items() if k not in COMMON_ARGS and p.kind == p.KEYWORD_ONLY]


def check_schedule_options(name: str, options: dict) -> str | None:
    """None when every key of ``options`` is an option of schedule ``name``, else a one-line complaint
    naming the unknown keys and the accepted ones."""
    known = schedule_options(name)
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return None
    return (f"unknown option(s) {', '.join(unknown)} for the {name!r} schedule; it accepts "
            f"{', '.join(known) if known else 'none'}")


def make_lr_controller(name: str, optimizer, *, lr: float, eta_min: float = 0.0, warmup_steps: int = 0,
                       total_steps: int = 1, ema: float = 0.0, **options):
    """The controller registered as ``name``. ``options`` (e.g. ``grad_clip``) go only to factories that
    take them by keyword, so a schedule that needs more of the config declares it in its signature."""
    factory = SCHEDULES.get(name)
    accepted = inspect.signature(factory).parameters
    extra = {k: v for k, v in options.items() if k in accepted}
    return factory(optimizer, lr=lr, eta_min=eta_min, warmup_steps=warmup_steps, total_steps=total_steps, ema=ema,
                   **extra)


class _StepSchedule(LRController):
    """lr = f(t) for every param group (the rule: ``_lr_at``); S and V are ignored. The lr of step 0 is set
    at construction, each ``step`` sets the lr of the step about to be taken."""

    def __init__(self, optimizer, lr: float, eta_min: float, warmup_steps: int, total_steps: int):
        super().__init__(optimizer, warmup_steps)
        self.lr, self.eta_min = lr, eta_min
        self.total_steps = max(1, total_steps)
        self._apply(self._lr_at(0))

    def _lr_at(self, t: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, stats: SNRStats | None = None) -> None:
        self._apply(self._lr_at(self.t))
        self.t += 1


@register_schedule("constant")
class ConstantSchedule(_StepSchedule):
    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0):
        super().__init__(optimizer, lr, eta_min, warmup_steps, total_steps)

    def _lr_at(self, t: int) -> float:
        return self.lr * warmup_factor(t, self.warmup_steps)


@register_schedule("cosine")
class CosineSchedule(_StepSchedule):
    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0):
        super().__init__(optimizer, lr, eta_min, warmup_steps, total_steps)

    def _lr_at(self, t: int) -> float:
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, max(0, t - self.warmup_steps) / span)
        cos = self.eta_min + 0.5 * (self.lr - self.eta_min) * (1 + math.cos(math.pi * progress))
        return cos * warmup_factor(t, self.warmup_steps)


@register_schedule("snr")
class SNRSchedule:
    """OBLR-PO: lr = eta_max * S / (S + V/n) (see :class:`oblr.snr.SNRLearningRate`); with ``ema > 0`` the
    controller averages the step's unclamped ``stats.signal`` and V, then clamps."""

    needs_snr = True

    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0):
        self.inner = SNRLearningRate(optimizer, eta_max=lr, eta_min=eta_min, ema=ema, warmup_steps=warmup_steps)

    def step(self, stats: SNRStats | None = None) -> None:
        if stats is None:
            raise ValueError("the snr schedule needs the step's SNR statistics (compute them: needs_snr is True)")
        self.inner.step(stats.signal, stats.V, stats.n)  # unclamped: the EMA averages it

    def get_last_lr(self) -> list[float]:
        return self.inner.get_last_lr()

    def metrics(self) -> dict:
        return self.inner.metrics()

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)


@register_schedule("snr_adam")
class AdamSNRSchedule(SNRSchedule):
    """OBLR-PO's factor for an Adam-family optimizer: lr = eta_max * S / (S + kappa_k V/n), kappa_k the
    share of one step's gradient noise left in Adam's bias-corrected momentum after k steps
    (:class:`oblr.snr.AdamSNRLearningRate`). beta1 is read from each param group's ``betas``; an optimizer
    without them (SGD) is refused: its step has no such average, use ``snr``."""

    #: ``optim.optimizer`` values this schedule is derived for (checked with the config, before a model loads)
    optimizers = ("adamw",)
    instead = "; with sgd use lr_schedule=snr"  # what the refusal suggests

    def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0):
        groups = optimizer.param_groups
        if any("betas" not in g for g in groups):
            raise ValueError(f"the snr_adam schedule needs an Adam-family optimizer (param groups with betas), "
                             f"got {type(optimizer).__name__}; with SGD use lr_schedule=snr")
        self.inner = AdamSNRLearningRate(optimizer, eta_max=lr, beta1=[g["betas"][0] for g in groups],
                                         eta_min=eta_min, ema=ema, warmup_steps=warmup_steps)
