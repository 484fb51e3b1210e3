"""Answer grading for math tasks: ``grade(response, reference, *, kind) -> bool``.

Kinds
-----
``"gsm8k"``  numeric answers, decided exactly in this process (``fractions.Fraction``): the number after
             the last ``####``, else in the last ``\\boxed{}``, else after "answer is" / "answer:" / "A:",
             else the last number. Commas, ``$``, units after the number and a trailing period are ignored.
``"math"``   the last ``\\boxed{}`` (nested braces), compared with the reference by math-verify (symbolic
             and numeric equivalence, fractions, radicals, intervals, tuples, sets / multiple answers in any
             order, matrices, equations ``x=5`` vs ``5``, spelling differences (spaces, ``\\dfrac``,
             ``\\left``, ``E_1`` vs ``E_{1}``: :func:`~oblr.grading.extract.canonical_latex` on both sides), percent, units named by ``unit``; a different known unit, "45 hours" for 45 minutes, is wrong). Two plain
             decimals are compared exactly here; anything else goes to a worker process
             (:mod:`oblr.grading.pool`) with a hard per-check time limit ``timeout`` (default 5 s).
             Without a box, math-verify's own extraction of the last LaTeX answer is used.

Model text is never executed or eval'd: extraction is string scanning; math-verify is used with its LaTeX
(ANTLR) parser only, never sympy's ``parse_expr``/``sympify`` on strings. A check that times out or fails
counts as wrong and is reported in :class:`GradeResult.status`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from oblr.grading.extract import (
    canonical_latex,
    extract_gsm8k_number,
    last_boxed,
    normalize_reference,
    plain_number,
    strip_dollars,
    unit_conflict,
)
from oblr.grading.pool import GraderPool, default_pool

KINDS = ("gsm8k", "math")
DEFAULT_TIMEOUT = 5.0

__all__ = [
    "DEFAULT_TIMEOUT",
    "KINDS",
    "GradeResult",
    "GraderPool",
    "extract_gsm8k_number",
    "grade",
    "grade_detailed",
    "grade_many",
    "last_boxed",
    "normalize_reference",
]


@dataclass
class GradeResult:
    """Outcome of one check. ``status``: ``"ok"`` (decided), ``"no_answer"`` (nothing to extract),
    ``"timeout"`` (over the time limit: wrong) or ``"error"`` (the check failed: wrong; see ``error``)."""

    correct: bool
    pred: str | None
    status: str = "ok"
    error: str = ""


def _grade_gsm8k(response: str, reference: Any) -> GradeResult:
    ref, _ = extract_gsm8k_number(str(reference))
    if ref is None:
        raise ValueError(f"gsm8k reference {str(reference)[:80]!r} holds no number")
    value, _ = extract_gsm8k_number(response)
    if value is None:
        return GradeResult(False, None, "no_answer")
    pred = str(value.numerator) if value.denominator == 1 else f"{float(value):g}"
    return GradeResult(value == ref, pred)


def _grade_math(response: str, reference: Any, unit: str | None, timeout: float,
                pool: GraderPool | None) -> GradeResult:
    gold = normalize_reference(reference)
    if not gold:
        raise ValueError(f"math reference {reference!r} is empty")
    boxed = last_boxed(response)
    if boxed is not None:
        boxed = strip_dollars(boxed)
        if unit_conflict(boxed, unit):
            return GradeResult(False, boxed, "ok", f"unit differs from the reference unit {unit!r}")
        a, b = plain_number(boxed), plain_number(gold)
        if a is not None and b is not None:  # exact fast path for two plain decimals
            return GradeResult(a == b, boxed)
        canon_pred, canon_gold = canonical_latex(boxed), canonical_latex(gold)
        if canon_pred == canon_gold and canon_pred:  # the same LaTeX up to spelling
            return GradeResult(True, boxed)
        pred_text, pred = "\\boxed{" + canon_pred + "}", boxed
    else:
        if not response.strip():
            return GradeResult(False, None, "no_answer")
        pred_text, pred, canon_gold = response, None, canonical_latex(gold)
    reply = (pool or default_pool()).check(pred_text, "\\boxed{" + canon_gold + "}", unit, timeout)
    return GradeResult(bool(reply["correct"]), pred, reply["status"], reply.get("error", ""))


def grade_detailed(response: str, reference: Any, *, kind: str = "math", unit: str | None = None,
                   timeout: float = DEFAULT_TIMEOUT, pool: GraderPool | None = None) -> GradeResult:
    """Grade ``response`` against ``reference`` (a string, number, or list of strings for several answers).

    ``unit``: the reference's unit (OlympiadBench), accepted when written in the answer.
    ``timeout``: hard limit in seconds for the symbolic check (math kind). Returns a :class:`GradeResult`.
    """
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    if kind == "gsm8k":
        return _grade_gsm8k(response, reference)
    if kind == "math":
        return _grade_math(response, reference, unit, timeout, pool)
    raise ValueError(f"unknown grading kind {kind!r}; known kinds: {', '.join(KINDS)}")


def grade(response: str, reference: Any, *, kind: str = "math", unit: str | None = None,
          timeout: float = DEFAULT_TIMEOUT, pool: GraderPool | None = None) -> bool:
    """True when the final answer in ``response`` equals ``reference``; see :func:`grade_detailed`."""
    return grade_detailed(response, reference, kind=kind, unit=unit, timeout=timeout, pool=pool).correct


def grade_many(responses: Sequence[str], references: Sequence[Any], *, kind: str = "math",
               units: Sequence[str | None] | None = None, timeout: float = DEFAULT_TIMEOUT,
               pool: GraderPool | None = None) -> list[GradeResult]:
    """:func:`grade_detailed` over pairs, using all of ``pool``'s workers at once. Order is kept."""
    if len(responses) != len(references):
        raise ValueError(f"{len(responses)} responses but {len(references)} references")
    units = list(units) if units is not None else [None] * len(responses)
    if len(units) != len(responses):
        raise ValueError(f"{len(units)} units for {len(responses)} responses")
    pool = pool or default_pool()

    def one(i: int) -> GradeResult:
        return grade_detailed(responses[i], references[i], kind=kind, unit=units[i], timeout=timeout,
                              pool=pool)

    if pool.size == 1 or kind == "gsm8k":
        return [one(i) for i in range(len(responses))]
    with ThreadPoolExecutor(pool.size) as ex:
        return list(ex.map(one, range(len(responses))))
