"""Write failures as the ``OSError`` behind them: a full disk or a folder made read-only reaches oblr as a
bare ``RuntimeError`` from torch's zip writer, a ``SafetensorError`` from safetensors' Rust writer, or a
``CheckpointException`` from torch.distributed.checkpoint. :func:`writes_as_os_errors` around a write turns
each into the ``OSError`` it is, so the trainer and the CLI report it in one line (what, where, and what is
intact) whichever library was writing."""

from __future__ import annotations

import contextlib
import os
import re


def os_error_of(e: BaseException) -> OSError | None:
    """The operating-system error behind an exception raised by a file writer, or None if there is none:
    ``e`` itself, one in its cause/context chain (torch's zip writer raises a RuntimeError over it), one a
    rank reported to torch.distributed.checkpoint (``CheckpointException.failures``), or the ``os error N``
    / ``[Errno N]`` that safetensors' Rust writer puts in its message."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError):
            return x
        todo += [x.__cause__, x.__context__]
        for f in (getattr(x, "failures", None) or {}).values():
            todo.append(f[0] if isinstance(f, tuple) else f)
        m = re.search(r"os error (\d+)\)|\[Errno (\d+)\]", str(x))
        if m:
            code = int(m.group(1) or m.group(2))
            return OSError(code, os.strerror(code))
    return None


@contextlib.contextmanager
def writes_as_os_errors():
    """Re-raise a failed write (a full disk, a folder made read-only) as the ``OSError`` behind it, so the
    trainer reports it in one line whichever library was writing; anything else passes unchanged."""
    try:
        yield
    except OSError:
        raise
    except BaseException as e:
        err = os_error_of(e)
        if err is None:
            raise
        raise err from e
