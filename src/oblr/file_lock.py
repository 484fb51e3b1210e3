"""OS file locks (``flock``) that say who holds them: the one way oblr takes and tests a lock.

:func:`try_lock` takes an exclusive lock on a file without waiting and writes the holder's note (its pid by
default) into it, or returns None when another open file holds it; :func:`holder` reads that note for a lock
another open file holds, creating nothing. The kernel releases a lock when its file is closed or its process
ends, however it ends, so a killed process never leaves a stale lock. Users: a run folder's ``.oblr.lock``
(:mod:`oblr.train.run_dir`), the build lock of a built-in model (:mod:`oblr.models.cache`) and the long-grid
runner's claims (``scripts/pinned_runs.py``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from typing import IO


def _busy(e: OSError) -> bool:
    return e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


def try_lock(path: Path, note: str | None = None) -> IO[str] | None:
    """The open file ``path`` (created if missing, never emptied by opening) holding an exclusive lock, with
    ``note`` (default: this process's pid) written into it; keep it open while the lock is needed, closing it
    releases the lock. None when another open file holds the lock; other errors (a folder that is not
    writable) are raised."""
    fh = open(path, "a+")  # append mode: opening never erases the holder's note
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        fh.close()
        if _busy(e):
            return None
        raise
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid() if note is None else note}\n")
    fh.flush()
    return fh


def holder(path: Path) -> str | None:
    """The note (``"unknown"`` before one is written) of another open file holding ``path``'s lock, or None
    when none does or the file does not exist. Creates nothing; a lock this process holds through another
    open file counts as held."""
    try:
        fh = open(path)
    except OSError:
        return None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if not _busy(e):
                raise
            return fh.read().strip() or "unknown"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None
