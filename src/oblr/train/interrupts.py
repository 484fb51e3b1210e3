"""Ctrl-C and SIGTERM at a safe point: :func:`sigint_deferred` holds both back while a block runs and
delivers them after; :func:`sigterm_as_interrupt` makes SIGTERM an interrupt like Ctrl-C.

The trainer wraps the few statements that change its state (the optimizer update, the learning-rate
controller, logging a step and marking it complete) so that an interrupt lands either before a step
changes anything or after it is complete and logged, never in between. Everything else (generation,
evaluation) stays interruptible at once. During a run SIGTERM (``kill PID``, a scheduler ending a job)
raises :class:`Terminated`, a ``KeyboardInterrupt``, so it takes Ctrl-C's path: the last completed step is
checkpointed and the summary written (exit status 143 instead of 130). While that wrap-up runs,
:func:`hold_interrupts` keeps further Ctrl-C / SIGTERM from cutting it short (each is acknowledged once on
stderr), so pressing Ctrl-C three times still ends with the checkpoint and one line.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager

DEFERRED = (signal.SIGINT, signal.SIGTERM)


class Terminated(KeyboardInterrupt):
    """SIGTERM during a run, delivered as an interrupt (see :func:`sigterm_as_interrupt`)."""


def _raise_terminated(signum, frame):
    raise Terminated


@contextmanager
def sigterm_as_interrupt():
    """Within the block SIGTERM raises :class:`Terminated` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigint_deferred():
    """Run the block with SIGINT and SIGTERM recorded instead of acted on; afterwards the previous handlers
    are back and a recorded signal is delivered to them (``KeyboardInterrupt`` under Python's default SIGINT
    handler, :class:`Terminated` under :func:`sigterm_as_interrupt`, the default action re-raised). Outside
    the main thread (where handlers cannot be set) the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: got.append(signum)) for s in DEFERRED}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for s in dict.fromkeys(got):  # each signal once, in the order they came
        handler = previous[s]
        if handler is signal.default_int_handler:
            raise KeyboardInterrupt
        if callable(handler):
            handler(s, None)
        elif handler == signal.SIG_DFL:
            os.kill(os.getpid(), s)  # the default action (SIGTERM: the process ends), now that the block is done


def hold_interrupts(message: str):
    """Until the returned ``restore()`` is called, SIGINT and SIGTERM are acknowledged (``message`` on stderr,
    once) and otherwise ignored: for the wrap-up after an interrupt (checkpoint, summary). Main thread only
    (elsewhere ``restore`` does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    said: list[bool] = []

    def acknowledge(signum, frame):
        if not said:
            said.append(True)
            try:
                os.write(2, (message + "\n").encode())
            except OSError:
                pass

    previous = {s: signal.signal(s, acknowledge) for s in DEFERRED}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    return restore
