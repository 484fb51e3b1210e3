"""Grader validation on the built-in sets: gold answers (and gold solutions) graded against the reference.

For every benchmark, each case is a response a perfect model could write -- the gold answer in a
``\\boxed{}`` (math kind) or as text (GSM8K), with its unit when the set gives one (OlympiadBench), and for GSM8K, MATH500 and Minerva the whole gold solution --
graded against the reference the tasks use. Agreement is the share graded correct; every miss is listed.
``benchmarks/validate_grader.py`` runs it in full; the tests run a seeded subset.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

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
                if unit:  # the answer written with its unit, as a model would
                    with_unit = "\\boxed{" + normalize_reference(r.answer) + "\\text{ " + unit.strip("$") + "}}"
                    cases.append(Case(name, f"{split}/answer+unit", line, with_unit, r.answer, unit, "math"))
            if name in ("gsm8k", "math500", "minerva_math") and r.solution:
                cases.append(Case(name, f"{split}/solution", line, r.solution, r.answer, unit, spec.kind))
    return cases


def run_validation(names=None, *, per_benchmark: int | None = None, seed: int = 0,
                   timeout: float = DEFAULT_TIMEOUT, pool: GraderPool | None = None) -> dict[str, dict]:
    """Grade the cases of ``names`` (default: all); ``per_benchmark`` cases drawn with ``seed`` (None: all).

    Returns ``{name: {"n", "correct", "agreement", "seconds", "misses": [(what, line, response tail,
    reference, status)]}}``.
    """
    out = {}
    for name in names or list(BENCHMARKS):
        cases = gold_cases(name)
        if per_benchmark is not None and per_benchmark < len(cases):
            cases = random.Random(f"{seed}/{name}").sample(cases, per_benchmark)
        t0 = time.perf_counter()
        results = []
        for kind in ("gsm8k", "math"):
            sub = [c for c in cases if c.kind == kind]
            res = grade_many([c.response for c in sub], [c.reference for c in sub], kind=kind,
                             units=[c.unit for c in sub], timeout=timeout, pool=pool)
            results += list(zip(sub, res))
        misses = [(c.what, c.line, c.response[-120:], c.reference, r.status) for c, r in results if not r.correct]
        n = len(results)
        out[name] = {"n": n, "correct": n - len(misses), "agreement": (n - len(misses)) / max(n, 1),
                     "seconds": time.perf_counter() - t0, "misses": misses}
    return out
