"""The model cache folder and the build lock a built-in model or a preparation is made under.

:func:`cache_dir` is ``$OBLR_CACHE_DIR`` or ``~/.cache/oblr``; :func:`build_lock` holds an OS lock beside a
folder being built, writes its holder's pid and start time into the lock file, and makes a waiting process say
who holds it and since when (:func:`lock_holder`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from oblr.file_lock import try_lock

#: seconds between the lines a process prints while it waits for another's build lock
LOCK_REPORT_EVERY_S = 30.0


def lock_holder(lock_file: Path) -> str:
    """Who holds a build lock, as its holder wrote it: ``process PID (oblr ..., since HH:MM:SS, N s ago)``, or
    ``another process`` when the file says nothing readable (an older holder)."""
    import time

    try:
        info = lock_file.read_text().split()
        pid, since = int(info[0]), float(info[1])
    except (OSError, ValueError, IndexError):
        return "another process"
    when = time.strftime("%H:%M:%S", time.localtime(since))
    return f"process {pid} (since {when}, {max(0.0, time.time() - since):.0f} s ago)"


@contextlib.contextmanager
def build_lock(path: Path, *, say=None):
    """Hold an OS lock (:func:`oblr.file_lock.try_lock`, released by the kernel if the process dies) beside the
    built-in model's folder while it is built, so that concurrent first uses build it once. The holder writes its
    pid and start time into the lock file; a process that has to wait says who holds it and since when (``say``,
    default a ``[oblr]`` line on stderr), then again every :data:`LOCK_REPORT_EVERY_S` seconds."""
    import sys
    import time

    if say is None:
        def say(msg):
            print(f"[oblr] {msg}", file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_file = path.parent / f".{path.name}.lock"
    t0 = time.monotonic()
    next_report = t0
    while (fh := try_lock(lock_file, note=f"{os.getpid()} {time.time():.3f}")) is None:
        now = time.monotonic()
        if now >= next_report:
            waited = f", waited {now - t0:.0f} s" if now > t0 else ""
            say(f"waiting for {path.name}: {lock_holder(lock_file)} holds its lock {lock_file}{waited}")
            next_report = now + LOCK_REPORT_EVERY_S
        time.sleep(0.2)
    with fh:  # closing the file releases the lock
        yield


def cache_dir() -> Path:
    """``$OBLR_CACHE_DIR`` or ``~/.cache/oblr``."""
    env = os.environ.get("OBLR_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "oblr"
