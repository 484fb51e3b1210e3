"""Grading worker processes with a hard per-check time limit.

Each :class:`_Worker` owns one ``python -m oblr.grading._server`` child. A check writes one request line
and waits for the reply with ``select`` until the deadline; past it the child is killed (SIGKILL, so even
C code stuck in a big-integer power stops) and a fresh one is started for the next check. This works from
any thread, unlike math-verify's own ``signal.alarm`` timeout, which only works on the main thread.

:class:`GraderPool` hands its workers to callers through a queue, so it is safe to share between threads;
``GraderPool(k)`` runs up to ``k`` checks at once.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0  # importing sympy + math-verify, once per worker start (not part of a check's limit)
SOFT_SHARE = 0.8  # the child's own soft limit, as a share of the hard limit


class GraderStartupError(RuntimeError):
    pass


class _Worker:
    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self._buf = b""
        self.restarts = 0

    def _start(self) -> None:
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])  # the directory holding the oblr package
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oblr.grading._server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env, bufsize=0,
        )
        self._buf = b""
        line = self._readline(time.monotonic() + STARTUP_TIMEOUT_S)
        if line is None or not json.loads(line).get("ready"):
            self.kill()
            raise GraderStartupError("the grading worker (python -m oblr.grading._server) did not start; "
                                     "is math-verify installed? (pip install 'math-verify[antlr4_13_2]')")

    def _readline(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the child died
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def kill(self) -> None:
        if self.proc is not None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
            for f in (self.proc.stdin, self.proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
            self.proc = None

    def check(self, pred: str, gold: str, unit: str | None, timeout: float, soft_share: float = SOFT_SHARE) -> dict:
        """One check under a hard limit of ``timeout`` seconds (worker start-up excluded); the child stops
        itself after ``soft_share * timeout`` where it can."""
        if self.proc is None or self.proc.poll() is not None:
            self.kill()
            self._start()
        req = {"pred": pred, "gold": gold, "unit": unit, "soft_timeout": soft_share * timeout}
        deadline = time.monotonic() + timeout
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
        except (BrokenPipeError, OSError):
            self.kill()
            return {"correct": False, "status": "error", "error": "grading worker died"}
        line = self._readline(deadline)
        if line is None:
            died = self.proc.poll() is not None
            self.kill()
            self.restarts += 1
            if died:
                return {"correct": False, "status": "error", "error": "grading worker died (memory limit?)"}
            return {"correct": False, "status": "timeout", "error": f"no answer within {timeout:g}s"}
        return json.loads(line)


class GraderPool:
    """``size`` grading workers shared between threads; children start lazily on first use.

    ``soft_share``: the child's own time limit as a share of the hard one (above 1: the hard kill only).
    """

    def __init__(self, size: int = 1, soft_share: float = SOFT_SHARE) -> None:
        if size < 1:
            raise ValueError(f"GraderPool size must be >= 1, got {size}")
        if not soft_share > 0:
            raise ValueError(f"soft_share must be > 0, got {soft_share}")
        self.size, self.soft_share = size, soft_share
        self._workers = [_Worker() for _ in range(size)]
        self._free: queue.Queue[_Worker] = queue.Queue()
        for w in self._workers:
            self._free.put(w)

    def check(self, pred: str, gold: str, unit: str | None = None, timeout: float = 5.0) -> dict:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        w = self._free.get()
        try:
            return w.check(pred, gold, unit, timeout, self.soft_share)
        finally:
            self._free.put(w)

    @property
    def restarts(self) -> int:
        return sum(w.restarts for w in self._workers)

    def close(self) -> None:
        for w in self._workers:
            w.kill()


_default: GraderPool | None = None
_default_lock = threading.Lock()


def default_pool() -> GraderPool:
    """The process-wide pool (size from env ``OBLR_GRADER_WORKERS``, default 1), closed at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GraderPool(int(os.environ.get("OBLR_GRADER_WORKERS", "1")))
            atexit.register(_default.close)
        return _default
