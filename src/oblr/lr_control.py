"""What every learning-rate controller shares: :class:`LRController`, the base of the four schedules.

A controller sets the learning rate of every param group of an optimizer once per optimizer step. The part
that does not depend on the rule lives here, once: the step counter ``t`` (steps taken so far), the linear
warm-up factor ``min(1, (t + 1) / warmup_steps)`` of the step about to be taken (:func:`warmup_factor`),
writing the lrs into the param groups, ``get_last_lr()``, the ``snr/lr`` metric, and the counter and last lrs
in ``state_dict()`` / ``load_state_dict()``. Each subclass keeps only its own rule (``constant`` and
``cosine`` in :mod:`oblr.schedules`, OBLR-PO's :class:`oblr.snr.SNRLearningRate`, ``auto`` in
:mod:`oblr.step_scale`). Imports nothing from oblr and no torch.
"""

from __future__ import annotations


def warmup_factor(t: int, warmup_steps: int) -> float:
    """The linear warm-up factor of the step with 0-based index ``t``: ``min(1, (t + 1) / warmup_steps)``;
    1 without warm-up (``warmup_steps = 0``)."""
    return min(1.0, (t + 1) / warmup_steps) if warmup_steps else 1.0


class LRController:
    """The shared part of a learning-rate controller (module docstring).

    ``t`` counts the steps the rule has taken (for OBLR-PO's rule: accepted updates); :meth:`warmup`
    is the factor of the step about to be taken. Subclasses call :meth:`_apply` with the step's lrs and
    name their own state in ``_STATE`` (attribute names; a leading ``_`` is dropped in the key).
    ``COUNTER_KEY`` and ``LAST_KEY`` are the state_dict keys of ``t`` and the last lrs, kept as each
    controller wrote them before this base existed, so its checkpoints still load.
    """

    needs_snr = False
    COUNTER_KEY = "t"
    LAST_KEY = "last"
    _STATE: tuple[str, ...] = ()

    def __init__(self, optimizer, warmup_steps: int = 0):
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be a non-negative integer, got {warmup_steps}")
        self.optimizer = optimizer
        self.warmup_steps = int(warmup_steps)
        self.t = 0
        self._last = [float(g["lr"]) for g in optimizer.param_groups]

    def warmup(self) -> float:
        """The warm-up factor of the step about to be taken (index ``t``)."""
        return warmup_factor(self.t, self.warmup_steps)

    def _apply(self, lrs) -> None:
        """Set the param groups' lrs: one float for every group, or a list with one per group."""
        groups = self.optimizer.param_groups
        lrs = [lrs for _ in groups] if isinstance(lrs, (int, float)) else list(lrs)
        if len(lrs) != len(groups):
            raise ValueError(f"{type(self).__name__}: {len(lrs)} learning rates for {len(groups)} param groups")
        for g, lr in zip(groups, lrs):
            g["lr"] = lr
        self._last = lrs

    def get_last_lr(self) -> list[float]:
        return list(self._last)

    def metrics(self) -> dict:
        return {"snr/lr": self._last[0]}

    def state_dict(self) -> dict:
        out = {k.lstrip("_"): (list(v) if isinstance(v, list) else v)
               for k, v in ((k, getattr(self, k)) for k in self._STATE)}
        out[self.COUNTER_KEY] = self.t
        out[self.LAST_KEY] = list(self._last)
        return out

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output and re-apply its last lrs to the optimizer's param groups. The
        last lrs may also be one number for every group (the ``auto`` schedule's format before this base)."""
        keys = [k.lstrip("_") for k in self._STATE] + [self.COUNTER_KEY, self.LAST_KEY]
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"{type(self).__name__} state_dict is missing keys {missing}")
        last = state[self.LAST_KEY]
        n = len(self.optimizer.param_groups)
        lrs = [last] * n if isinstance(last, (int, float)) else list(last)
        if len(lrs) != n:
            raise ValueError(f"state has {len(lrs)} param groups, optimizer has {n}")
        for k in self._STATE:
            v = state[k.lstrip("_")]
            setattr(self, k, list(v) if isinstance(v, list) else v)
        self.t = state[self.COUNTER_KEY]
        self._apply(lrs)
