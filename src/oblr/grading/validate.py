"""Grader validation on the built-in sets: gold answers (and gold solutions) graded against the reference.

For every benchmark, each case is a response a perfect model could write -- the gold answer in a
``\\boxed{}`` (math kind) or as text (GSM8K), with its unit when the set gives one (OlympiadBench), rewritten in an equivalent form that
string equality would miss (:func:`rewrite_form`), and for GSM8K, MATH500 and Minerva the whole gold solution --
graded against the reference the tasks use. Agreement is the share graded correct; every miss is listed.
``benchmarks/validate_grader.py`` runs it in full; the tests run a seeded subset.
"""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from fractions import Fraction

from oblr.grading import DEFAULT_TIMEOUT, GraderPool, grade_many, normalize_reference
from oblr.tasks.loaders import BENCHMARKS, load_benchmark


@dataclass
class Case:
    benchmark: str
    what: str  # "answer" or "solution"
    line: int
    response: str
    reference: object
    unit: str | None
    kind: str


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


def gold_cases(name: str) -> list[Case]:
    """All validation cases of one benchmark (every split)."""
    spec = BENCHMARKS[name]
    cases = []
    for split in spec.splits:
        for r in load_benchmark(name, split):
            unit, line = r.meta.get("unit"), r.meta["line"]
            if spec.kind == "gsm8k":
                cases.append(Case(name, f"{split}/answer", line, f"The answer is {r.answer}.", r.answer, unit,
                                  "gsm8k"))
            else:
                boxed = "\\boxed{" + normalize_reference(r.answer) + "}"
                cases.append(Case(name, f"{split}/answer", line, f"The final answer is {boxed}.", r.answer, unit,
                                  "math"))
                rewritten = rewrite_form(normalize_reference(r.answer))
                if rewritten is not None:
                    cases.append(Case(name, f"{split}/answer~form", line, "\\boxed{" + rewritten + "}", r.answer,
                                      unit, "math"))
                if unit:  # the answer written with its unit, as a model would
                    with_unit = "\\boxed{" + normalize_reference(r.answer) + "\\text{ " + unit.strip("$") + "}}"
                    cases.append(Case(name, f"{split}/answer+unit", line, with_unit, r.answer, unit, "math"))
            if name in ("gsm8k", "math500", "minerva_math") and r.solution:
                cases.append(Case(name, f"{split}/solution", line, r.solution, r.answer, unit, spec.kind))
    return cases


REQUIRED = ("answer", "solution", "answer+unit")  # the validation: gold vs reference
STRESS = ("answer~form",)  # equivalent rewrites: a harder, extra check of the symbolic path


def case_type(case: Case) -> str:
    return case.what.split("/", 1)[1]


def run_validation(names=None, *, types: tuple[str, ...] = REQUIRED + STRESS, per_benchmark: int | None = None,
                   seed: int = 0, timeout: float = DEFAULT_TIMEOUT, pool: GraderPool | None = None) -> dict[str, dict]:
    """Grade the cases of ``names`` (default: all) whose type is in ``types``; ``per_benchmark`` cases drawn
    with ``seed`` (None: all).

    Returns ``{name: {"n", "correct", "agreement", "seconds", "by_type": {type: [n, correct]},
    "misses": [(what, line, response tail, reference, status)]}}``.
    """
    out = {}
    for name in names or list(BENCHMARKS):
        cases = [c for c in gold_cases(name) if case_type(c) in types]
        if per_benchmark is not None and per_benchmark < len(cases):
            cases = random.Random(f"{seed}/{name}").sample(cases, per_benchmark)
        t0 = time.perf_counter()
        results = []
        for kind in ("gsm8k", "math"):
            sub = [c for c in cases if c.kind == kind]
            res = grade_many([c.response for c in sub], [c.reference for c in sub], kind=kind,
                             units=[c.unit for c in sub], timeout=timeout, pool=pool)
            results += list(zip(sub, res))
        by_type: dict[str, list[int]] = {}
        for c, r in results:
            t = by_type.setdefault(case_type(c), [0, 0])
            t[0] += 1
            t[1] += int(r.correct)
        misses = [(c.what, c.line, c.response[-120:], c.reference, r.status) for c, r in results if not r.correct]
        n = len(results)
        out[name] = {"n": n, "correct": n - len(misses), "agreement": (n - len(misses)) / max(n, 1),
                     "seconds": time.perf_counter() - t0, "by_type": by_type, "misses": misses}
    return out
