"""Live progress lines for training and long loops, readable both in a terminal and in CI logs.

On a TTY a single line is rewritten in place (``\\r`` + padding to erase the previous text); on anything
else (a file, a CI log) whole lines are printed, so the log stays readable. Also exposed as
``oblr.tracking.ProgressDisplay`` / ``oblr.tracking.progress``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

__all__ = ["ProgressDisplay", "format_duration", "progress"]

# metric keys shown by ProgressDisplay, first present wins (docs/architecture.md)
_REWARD_KEYS = ("train/reward_mean",)
_EVAL_KEYS = ("eval/accuracy_sampled", "eval/accuracy_greedy")
_LR_KEYS = ("optim/lr", "snr/lr")
_SNR_KEYS = ("snr/snr",)
_KL_KEYS = ("policy/step_kl",)  # the kl schedule's measurement (and algorithm.track_step_kl)


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or not a real stream
        return False


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h02m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _num(v: Any) -> float | None:
    """A float for display, from python numbers or 1-element tensors; None if not a number."""
    if v is None or isinstance(v, (bool, str)):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _first(metrics: dict, keys: tuple[str, ...]) -> float | None:
    for k in keys:
        if k in metrics:
            v = _num(metrics[k])
            if v is not None:
                return v
    return None


class _Line:
    """Writes status text: rewritten in place on a TTY, one line per call otherwise."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.tty = _is_tty(stream)
        self._width = 0
        self._open = False

    def write(self, text: str) -> None:
        if self.tty:
            pad = " " * max(0, self._width - len(text))
            self.stream.write("\r" + text + pad)
            self._width = len(text)
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self._open:
            self.stream.write("\n")
            self.stream.flush()
        self._open = False


class ProgressDisplay:
    """One compact status line per training step.

    ``step 12/100 | reward 0.431 | eval 0.520 | lr 3.00e-04 | snr 0.124 | 2.31 s/step | ETA 3m22s``

    (``step kl 3.1e-04``, the policy's change per token at that step, in place of or beside ``snr`` when logged.)

    The eval accuracy shown is the latest one seen (greedy if logged, else sampled), since evaluation
    runs only every few steps. Seconds per step = wall time since the first update / steps done since;
    before two updates exist, ``time/step`` from the metrics is used when present.
    Prints every ``every`` steps and always at ``total_steps``.
    """

    def __init__(self, total_steps: int, *, stream: TextIO | None = None, every: int = 1):
        if total_steps < 0:
            raise ValueError(f"total_steps must be >= 0, got {total_steps}")
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.total = int(total_steps)
        self.every = int(every)
        self._line = _Line(sys.stderr if stream is None else stream)
        self._t0: float | None = None
        self._step0: int | None = None
        self._eval: float | None = None
        self._greedy: float | None = None
        self._clock = time.monotonic

    def seconds_per_step(self, step: int, metrics: dict) -> float | None:
        now = self._clock()
        if self._t0 is None:
            self._t0, self._step0 = now, step
        if step > self._step0:
            return (now - self._t0) / (step - self._step0)
        return _num(metrics.get("time/step"))

    def format(self, step: int, metrics: dict, sec_per_step: float | None) -> str:
        parts = [f"step {step}/{self.total}"]
        reward = _first(metrics, _REWARD_KEYS)
        if reward is not None:
            parts.append(f"reward {reward:.3f}")
        if self._eval is not None:
            parts.append(f"eval {self._eval:.3f}" + (f" (greedy {self._greedy:.3f})" if self._greedy is not None else ""))
        lr = _first(metrics, _LR_KEYS)
        if lr is not None:
            parts.append(f"lr {lr:.2e}")
        snr = _first(metrics, _SNR_KEYS)
        if snr is not None:
            parts.append(f"snr {snr:.3g}")
        kl = _first(metrics, _KL_KEYS)
        if kl is not None:
            parts.append(f"step kl {kl:.2g}")
        if sec_per_step is not None:
            parts.append(f"{sec_per_step:.2f} s/step")
            parts.append("ETA " + format_duration(sec_per_step * max(0, self.total - step)))
        return " | ".join(parts)

    def update(self, step: int, metrics: dict | None = None) -> None:
        """Record ``step``'s metrics and print the status line when due."""
        metrics = metrics or {}
        acc = _first(metrics, _EVAL_KEYS)
        if acc is not None:
            self._eval = acc
            self._greedy = metrics.get("eval/accuracy_greedy") if "eval/accuracy_sampled" in metrics else None
        sps = self.seconds_per_step(step, metrics)
        if step % self.every == 0 or step >= self.total:
            self._line.write(self.format(step, metrics, sps))

    def close(self) -> None:
        """End the live line (a newline on a TTY)."""
        self._line.close()

    def __enter__(self) -> ProgressDisplay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Iterable, total: int | None = None, desc: str = "", *, stream: TextIO | None = None,
             min_interval: float = 0.1) -> Iterator:
    """Yield from ``iterable`` while showing ``desc: i/total (rate it/s, ETA)``.

    On a TTY the line is redrawn at most every ``min_interval`` seconds (and at the end). Elsewhere
    plain lines are printed at every 10% of ``total`` (or at every power of two when ``total`` is unknown),
    so CI logs get about ten lines per loop.
    """
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    line = _Line(sys.stderr if stream is None else stream)
    label = f"{desc}: " if desc else ""
    t0 = time.monotonic()
    last_draw = -math.inf
    next_mark = 1  # non-TTY: next item count at which to print

    def text(i: int) -> str:
        elapsed = time.monotonic() - t0
        rate = i / elapsed if elapsed > 0 else float("nan")
        s = f"{label}{i}/{total}" if total is not None else f"{label}{i}"
        if i and math.isfinite(rate):
            s += f" ({rate:.3g} it/s" if rate >= 1 else f" ({1 / rate:.3g} s/it"
            s += f", ETA {format_duration((total - i) / rate)})" if total is not None else ")"
        return s

    i = 0
    shown = -1  # item count of the last line written

    def show(n: int) -> None:
        nonlocal shown
        line.write(text(n))
        shown = n

    try:
        for item in iterable:
            yield item
            i += 1
            if line.tty:
                now = time.monotonic()
                if now - last_draw >= min_interval or (total is not None and i >= total):
                    show(i)
                    last_draw = now
            elif i >= next_mark or (total is not None and i >= total):
                show(i)
                next_mark = i + max(1, math.ceil(total / 10)) if total is not None else 2 * next_mark
        if shown != i:
            show(i)  # the final count is always shown
    finally:
        line.close()
