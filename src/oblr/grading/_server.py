"""Grading worker process: reads JSON requests on stdin, writes JSON replies on stdout, one per line.

Run by :mod:`oblr.grading.pool` as ``python -m oblr.grading._server``. It is the only place where
math-verify / sympy run, so that a check that hangs (sympy on ``2^{10^{10}}``, a pathological parse) can be
killed by the parent without touching the caller. Inside, a soft time limit (``setitimer`` + SIGALRM, this
process's main thread) answers ``"timeout"`` without a restart in the common case; the parent's hard kill
covers C code that never returns to the interpreter. Only the LaTeX extractor of math-verify is used
(ANTLR parser building sympy objects): model text never reaches ``eval``/``parse_expr``/``sympify``.

Request: ``{"pred": str, "gold": str, "unit": str | null, "soft_timeout": float}``
Reply:   ``{"correct": bool, "status": "ok" | "timeout" | "error", "error": str}``
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from collections import OrderedDict


class _SoftTimeout(BaseException):  # BaseException: math-verify/sympy catch Exception and would swallow it
    pass


def _on_alarm(signum, frame):
    raise _SoftTimeout()


def _limit_memory() -> None:
    mb = int(os.environ.get("OBLR_GRADER_MEM_MB", "4096"))
    if mb <= 0:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mb * 2**20, mb * 2**20))
    except (ImportError, ValueError, OSError):  # not available on this platform: the hard kill remains
        pass


_PERCENT_RE = re.compile(r"\\?%")


class Checker:
    def __init__(self) -> None:
        from math_verify import LatexExtractionConfig, parse, verify

        logging.getLogger("math_verify").setLevel(logging.ERROR)
        self._parse, self._verify = parse, verify
        self._config = [LatexExtractionConfig(boxed_match_priority=0)]
        self._gold_cache: OrderedDict[str, list] = OrderedDict()

    def parse(self, text: str) -> list:
        return self._parse(text, extraction_config=self._config, parsing_timeout=None)

    def gold(self, text: str) -> list:
        if text in self._gold_cache:
            self._gold_cache.move_to_end(text)
            return self._gold_cache[text]
        g = self.parse(text)
        self._gold_cache[text] = g
        if len(self._gold_cache) > 4096:
            self._gold_cache.popitem(last=False)
        return g

    def same(self, gold: str, pred: str) -> bool:
        g, p = self.gold(gold), self.parse(pred)
        return bool(g) and bool(p) and self._verify(g, p, timeout_seconds=None)

    def check(self, pred: str, gold: str, unit: str | None) -> bool:
        if self.same(gold, pred):
            return True
        # a percent sign on one side only ("4.2\%" vs "4.2" with unit "%"): compare the bare numbers
        if _PERCENT_RE.search(pred) or _PERCENT_RE.search(gold):
            if self.same(_PERCENT_RE.sub("", gold), _PERCENT_RE.sub("", pred)):
                return True
        if unit:  # the reference's unit written out in the answer ("50 km/h" with unit "km/h")
            bare = unit.replace("$", "").strip()
            if bare and bare in pred:
                return self.same(gold, pred.replace(bare, " "))
        return False


def main() -> None:
    _limit_memory()
    signal.signal(signal.SIGALRM, _on_alarm)
    out = sys.stdout
    checker = Checker()
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            out.write(json.dumps({"correct": False, "status": "error", "error": f"bad request: {e}"}) + "\n")
            out.flush()
            continue
        reply = {"correct": False, "status": "ok", "error": ""}
        try:
            signal.setitimer(signal.ITIMER_REAL, max(float(req.get("soft_timeout", 5.0)), 1e-3))
            try:
                reply["correct"] = checker.check(req["pred"], req["gold"], req.get("unit"))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            reply["status"] = "timeout"
        except MemoryError:
            reply["status"], reply["error"] = "error", "MemoryError"
        except Exception as e:  # noqa: BLE001 - a failing check is a wrong answer, reported, never a crash
            reply["status"], reply["error"] = "error", f"{type(e).__name__}: {e}"[:300]
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
