"""Answer grading for math tasks: ``grade(response, reference, *, kind) -> bool``.

Kinds
-----
``"gsm8k"``  numeric answers, decided exactly in this process (``fractions.Fraction``). The answer is the
             last answer statement (``####``, a box, "the answer is ..."; :mod:`oblr.grading.extract`),
             else the last numeric expression of the text, and it is read as the VALUE it states
             (:mod:`oblr.grading.numbers`): ``2/3``, ``1 1/2``, ``3 x 10^5``, ``1e9``, ``1010_2`` are
             read whole; ``12:30``, ``1,00``, ``12, 13``, ``5 + 3`` state no single number and are wrong.
             Thousands commas in groups of three, ``$``, units and ``%`` after the number and a trailing
             period are ignored.
``"math"``   the last answer statement (the last ``\\boxed{}``/``\\fbox{}``, or an answer sentence written
             after it: "The final answer is 7.78.", "Answer: 2/3"; several boxes together when the
             reference has several answers), normalized (:func:`~oblr.grading.normalize.normalize_answer`:
             delimiters, trailing period, ``28 percent`` -> ``28\\%``, ``1 1/2``, ``1e9``), compared with the
             reference by math-verify (symbolic and numeric equivalence, fractions, radicals, intervals,
             tuples, sets / multiple answers in any order, matrices, equations ``x=5`` vs ``5``, spelling
             differences (spaces, ``\\dfrac``, ``\\left``, ``E_1`` vs ``E_{1}``:
             :func:`~oblr.grading.normalize.canonical_latex` on both sides; ``32, 349`` stays two numbers),
             percent, units named by ``unit``; a different known unit, "45 hours" for 45 minutes, is
             wrong). Two plain decimals (thousands commas in their valid shape allowed) are compared
             exactly here; anything else goes to a worker process (:mod:`oblr.grading.pool`) with a hard
             per-check time limit ``timeout`` (default 5 s). Without any statement, math-verify's own
             extraction of the last LaTeX answer is used.

Model text is never executed or eval'd: extraction is string scanning; math-verify is used with its LaTeX
(ANTLR) parser only, never sympy's ``parse_expr``/``sympify`` on strings. A check that times out or fails
counts as wrong and is reported in :class:`GradeResult.status`.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from oblr.grading.extract import extract_gsm8k_number, final_answer, last_boxed, read_gsm8k
from oblr.grading.normalize import (
    answer_parts,
    canonical_latex,
    normalize_answer,
    normalize_reference,
    unit_conflict,
)
from oblr.grading.numbers import plain_number
from oblr.grading.pool import GraderPool, default_pool

KINDS = ("gsm8k", "math")
DEFAULT_TIMEOUT = 5.0

__all__ = [
    "DEFAULT_TIMEOUT",
    "KINDS",
    "GradeResult",
    "GraderPool",
    "extract_gsm8k_number",
    "final_answer",
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


def _pred_text(value) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):g}"


def _grade_gsm8k(response: str, reference: Any) -> GradeResult:
    ref, _, _ = read_gsm8k(str(reference))
    if ref is None or ref.value is None:
        why = f" ({ref.note})" if ref is not None else ""
        raise ValueError(f"gsm8k reference {str(reference)[:80]!r} holds no number{why}")
    r, source, text = read_gsm8k(response)
    if r is None:
        if source == "none":
            return GradeResult(False, None, "no_answer")
        return GradeResult(False, text[:80], "ok", "the answer holds no number")
    if r.value is None:
        return GradeResult(False, text[:80], "ok", f"the answer states no single number: {r.note}")
    return GradeResult(r.value == ref.value, _pred_text(r.value))


_BARE_MAX = 40  # a response this short, on one line and without a statement, is read whole as the answer


def _several(gold: str) -> bool:
    """True when the reference has several answers: a list ``1, 2, 3`` or a set ``\\{1,2,3\\}``."""
    g = gold.strip()
    if g.startswith("\\{") and g.endswith("\\}"):
        g = g[2:-2]
    return len(answer_parts(g)) > 1


def _grade_math(response: str, reference: Any, unit: str | None, timeout: float,
                pool: GraderPool | None) -> GradeResult:
    gold = normalize_answer(normalize_reference(reference))
    if not gold:
        raise ValueError(f"math reference {reference!r} is empty")
    answer = final_answer(response, several=_several(gold))
    pred = normalize_answer(answer.text) if answer is not None else ""
    if answer is None and _BARE_MAX >= len(response.strip()) > 0 and "\n" not in response.strip():
        pred = normalize_answer(response.strip())  # a bare answer: "28 percent", "2 or 3"
    if pred:
        if unit_conflict(pred, unit):
            return GradeResult(False, pred, "ok", f"unit differs from the reference unit {unit!r}")
        a, b = plain_number(pred), plain_number(gold)
        if a is not None and b is not None:  # exact fast path for two plain decimals
            return GradeResult(a == b, pred)
        canon_pred, canon_gold = canonical_latex(pred), canonical_latex(gold)
        if canon_pred == canon_gold and canon_pred:  # the same LaTeX up to spelling
            return GradeResult(True, pred)
        pred_text = "\\boxed{" + canon_pred + "}"
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
