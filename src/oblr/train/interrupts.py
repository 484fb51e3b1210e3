"""Ctrl-C at a safe point: :func:`sigint_deferred` holds SIGINT back while a block runs and raises it after.

The trainer wraps the few statements that change its state (the optimizer update, the learning-rate
controller, logging a step and marking it complete) so that an interrupt lands either before a step
changes anything or after it is complete and logged, never in between. Everything else (generation,
evaluation) stays interruptible at once.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def sigint_deferred():
    """Run the block with SIGINT recorded instead of acted on; afterwards the previous handler is back and a
    recorded SIGINT is delivered (``KeyboardInterrupt`` under Python's default handler). Outside the main
    thread (where handlers cannot be set) the block runs unprotected."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if got:
        if previous is signal.default_int_handler:
            raise KeyboardInterrupt
        if callable(previous):
            previous(signal.SIGINT, None)
