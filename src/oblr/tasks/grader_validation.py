"""Grader validation: the built-in sets' own answers and solutions, and the hand-labelled sets.

It lives in :mod:`oblr.tasks` because it reads the sets (:mod:`oblr.tasks.loaders`), which sit above the
grader they check (:mod:`oblr.grading`).

:func:`gold_cases` builds, for every row of a benchmark, responses whose verdict is known (case types):

- ``answer``: the gold answer as a perfect model writes it: ``\\boxed{}`` (math kind), "The answer is N."
  (GSM8K); ``answer~sentence``: the Minerva few-shot line "Final Answer: The final answer is $X$. I hope
  it is correct."; ``answer+unit``: the answer with the set's unit in ``\\text{}`` (OlympiadBench);
- ``solution``: the set's own worked solution, where it states its answer in a box or after ``####``
  (GSM8K, MATH500, Minerva, AIME24);
- ``neighbour``: the next row's solution (or boxed answer, where the set has no solution) against this
  row's reference, expected WRONG; rows whose references are equal are skipped;
- ``answer~form`` (stress): the gold answer rewritten so that string equality cannot decide
  (:func:`rewrite_form`);
- ``solution~prose`` (information): OlympiadBench's solutions, proofs that state the answer somewhere in
  prose, not in a place any answer extraction looks for.

Agreement is the share of cases graded as expected; every miss is listed. :func:`run_labelled` grades the
hand-labelled sets of :mod:`oblr.grading.labelled`. ``benchmarks/validate_grader.py`` runs everything;
the tests run the required types in full (neighbours sampled) and a seeded sample of the stress cases.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from oblr.grading import DEFAULT_TIMEOUT, GradeResult, GraderPool, grade_many, normalize_reference
from oblr.grading.extract import read_gsm8k
from oblr.grading.labelled import labelled_sets
from oblr.grading.normalize import canonical_latex, normalize_answer
from oblr.grading.numbers import plain_number
from oblr.tasks.loaders import BENCHMARKS, MathRecord, load_benchmark


@dataclass
class Case:
    benchmark: str
    what: str  # "<split>/<case type>"
    line: int
    response: str
    reference: object
    unit: str | None
    kind: str
    expect: bool = True


SOLUTION_SETS = ("gsm8k", "math500", "minerva_math", "aime24")  # solutions that state the answer in a box / ####
PROSE_SOLUTIONS = ("olympiadbench",)
REQUIRED = ("answer", "answer~sentence", "solution", "answer+unit", "neighbour")
STRESS = ("answer~form",)  # equivalent rewrites: a harder, extra check of the symbolic path
INFO = ("solution~prose",)

_PLAIN_INT = re.compile(r"-?\d{1,12}")
_PLAIN_DEC = re.compile(r"-?\d{1,8}\.\d{1,8}")
_SIMPLE_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_MIXED = re.compile(r"\d\s*\\[dt]?frac")  # "1\frac{4}{5}" is the mixed number 9/5: not rewritten


def rewrite_form(answer: str) -> str | None:
    """The same answer written differently, so that the symbolic check (not string equality) decides:
    an integer ``k`` -> ``\\frac{2k}{2}``; a decimal -> an exact fraction; ``\\frac{a}{b}`` -> ``((a)/(b))``,
    ``\\left``/``\\right`` dropped. None when no rewrite applies."""
    if _PLAIN_INT.fullmatch(answer):
        return f"\\frac{{{2 * int(answer)}}}{{2}}"
    if _PLAIN_DEC.fullmatch(answer):
        q = Fraction(answer)
        return f"\\frac{{{q.numerator}}}{{{q.denominator}}}"
    if _MIXED.search(answer):
        return None
    out = _SIMPLE_FRAC.sub(r"((\1)/(\2))", answer).replace("\\left", "").replace("\\right", "")
    return out if out != answer else None


_LHS = re.compile(r"^[A-Za-z]\s*=\s*")


def _reference_key(answer, kind: str):
    """What makes two references the same answer for certain (neighbour pairs with the same key are
    skipped): the value for GSM8K and plain numbers, else the canonical LaTeX spelling (``x=5`` as ``5``)."""
    if kind == "gsm8k":
        r = read_gsm8k(str(answer))[0]
        return r.value if r is not None else str(answer)
    s = _LHS.sub("", normalize_answer(normalize_reference(answer)))
    v = plain_number(s)
    return v if v is not None else canonical_latex(s)


def _row_cases(name: str, split: str, r: MathRecord, nxt: MathRecord) -> list[Case]:
    kind = BENCHMARKS[name].kind
    unit, line = r.meta.get("unit"), r.meta["line"]

    def case(what: str, response: str, expect: bool = True) -> Case:
        return Case(name, f"{split}/{what}", line, response, r.answer, unit, kind, expect)

    gold = str(r.answer) if kind == "gsm8k" else normalize_reference(r.answer)
    out = [case("answer", f"The answer is {gold}." if kind == "gsm8k" else f"The final answer is \\boxed{{{gold}}}."),
           case("answer~sentence", "Final Answer: The final answer is "
                + (gold if kind == "gsm8k" else f"${gold}$") + ". I hope it is correct.")]
    if kind == "math":
        rewritten = rewrite_form(gold)
        if rewritten is not None:
            out.append(case("answer~form", "\\boxed{" + rewritten + "}"))
        if unit:  # the answer written with its unit, as a model would
            out.append(case("answer+unit", "\\boxed{" + gold + "\\text{ " + unit.strip("$") + "}}"))
    if r.solution and name in SOLUTION_SETS + PROSE_SOLUTIONS:
        out.append(case("solution" if name in SOLUTION_SETS else "solution~prose", r.solution))
    if _reference_key(nxt.answer, kind) != _reference_key(r.answer, kind):
        if name in SOLUTION_SETS and nxt.solution:
            out.append(case("neighbour", nxt.solution, expect=False))
        else:
            out.append(case("neighbour", "The final answer is \\boxed{" + normalize_reference(nxt.answer) + "}.",
                            expect=False))
    return out


def gold_cases(name: str) -> list[Case]:
    """All validation cases of one benchmark (every split); see the module docstring for the types."""
    cases = []
    for split in BENCHMARKS[name].splits:
        rows = load_benchmark(name, split)
        for i, r in enumerate(rows):
            cases += _row_cases(name, split, r, rows[(i + 1) % len(rows)])
    return cases


def case_type(case: Case) -> str:
    return case.what.split("/", 1)[1]


def grade_cases(cases: Sequence[Case], *, timeout: float = DEFAULT_TIMEOUT,
                pool: GraderPool | None = None) -> list[tuple[Case, GradeResult]]:
    """Grade validation cases (each with its own kind), all workers of ``pool`` at once."""
    results = []
    for kind in ("gsm8k", "math"):
        sub = [c for c in cases if c.kind == kind]
        res = grade_many([c.response for c in sub], [c.reference for c in sub], kind=kind,
                         units=[c.unit for c in sub], timeout=timeout, pool=pool)
        results += list(zip(sub, res))
    return results


def _summary(results: list[tuple[Case, GradeResult]], seconds: float) -> dict:
    by_type: dict[str, list[int]] = {}
    for c, r in results:
        t = by_type.setdefault(case_type(c), [0, 0])
        t[0] += 1
        t[1] += int(r.correct == c.expect)
    misses = [(c.what, c.line, c.response[-120:], c.reference, r.status, c.expect)
              for c, r in results if r.correct != c.expect]
    n = len(results)
    return {"n": n, "correct": n - len(misses), "agreement": (n - len(misses)) / max(n, 1), "seconds": seconds,
            "by_type": by_type, "misses": misses}


def run_validation(names=None, *, types: tuple[str, ...] = REQUIRED + STRESS + INFO,
                   per_benchmark: int | None = None, seed: int = 0, timeout: float = DEFAULT_TIMEOUT,
                   pool: GraderPool | None = None) -> dict[str, dict]:
    """Grade the cases of ``names`` (default: all) whose type is in ``types``; ``per_benchmark`` cases drawn
    with ``seed`` (None: all).

    Returns ``{name: {"n", "correct", "agreement", "seconds", "by_type": {type: [n, agreeing]},
    "misses": [(what, line, response tail, reference, status, expected verdict)]}}``; "correct" counts
    the cases graded as expected.
    """
    out = {}
    for name in names or list(BENCHMARKS):
        cases = [c for c in gold_cases(name) if case_type(c) in types]
        if per_benchmark is not None and per_benchmark < len(cases):
            cases = random.Random(f"{seed}/{name}").sample(cases, per_benchmark)
        t0 = time.perf_counter()
        results = grade_cases(cases, timeout=timeout, pool=pool)
        out[name] = _summary(results, time.perf_counter() - t0)
    return out


def run_labelled(*, timeout: float = DEFAULT_TIMEOUT, pool: GraderPool | None = None) -> dict[str, dict]:
    """Grade every hand-labelled set (:func:`oblr.grading.labelled.labelled_sets`); same summary as
    :func:`run_validation`, with the set name as the case type."""
    out = {}
    for name, (kind, rows) in labelled_sets().items():
        cases = [Case(name, f"labelled/{name}", i, resp, ref, unit, kind, correct)
                 for i, (resp, ref, unit, correct) in enumerate(rows, start=1)]
        t0 = time.perf_counter()
        out[name] = _summary(grade_cases(cases, timeout=timeout, pool=pool), time.perf_counter() - t0)
    return out
