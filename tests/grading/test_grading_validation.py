"""Grader validation on every built-in set: gold answers vs the reference, >= 99.5 %.

The boxed gold answers and the answers with units run in full (a few seconds); the sets' own solutions,
the Minerva-style answer sentences and the neighbours are in test_grading_references.py. The
equivalent-rewrite stress cases take ~40 s in full, so the suite grades a fixed seeded sample of them;
benchmarks/validate_grader.py runs everything (numbers in docs/grading.md).
"""

from __future__ import annotations

import pytest

from oblr.grading import GraderPool
from oblr.tasks.grader_validation import STRESS, case_type, gold_cases, run_validation
from oblr.tasks.loaders import BENCHMARKS

ANSWERS = ("answer", "answer+unit")


@pytest.fixture(scope="module")
def validation():
    pool = GraderPool(1)
    try:
        yield (run_validation(pool=pool, types=ANSWERS),
               run_validation(pool=pool, types=STRESS, per_benchmark=40, seed=0))
    finally:
        pool.close()


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_gold_agreement_at_least_99_5_percent(validation, name):
    r = validation[0][name]
    assert r["n"] == sum(case_type(c) in ANSWERS for c in gold_cases(name)) > 0
    assert r["agreement"] >= 0.995, r["misses"][:10]


@pytest.mark.slow
@pytest.mark.parametrize("name", [b for b in BENCHMARKS if b != "gsm8k"])
def test_equivalent_rewrites_sample(validation, name):
    # full-run exceptions (listed in docs/grading.md) are rewrites the parser reads differently, e.g. dM/dt
    r = validation[1][name]
    assert r["n"] > 0 and r["agreement"] >= 0.95, r["misses"]


def test_cases_cover_answers_and_solutions():
    kinds = {"answer", "answer~sentence", "solution", "neighbour"}
    assert {c.what for c in gold_cases("math500")} == {f"test/{k}" for k in kinds | {"answer~form"}}
    assert {c.what for c in gold_cases("gsm8k")} == {f"{s}/{k}" for s in ("train", "test") for k in kinds}
    assert {case_type(c) for c in gold_cases("olympiadbench")} == {
        "answer", "answer~sentence", "answer+unit", "answer~form", "solution~prose", "neighbour"}


def test_a_wrong_reference_breaks_agreement():
    # the validation can fail: each gold against the next row's reference agrees only where they are equal
    from oblr.grading import grade_many

    cases = [c for c in gold_cases("amc23") if case_type(c) == "answer"]
    refs = [c.reference for c in cases[1:] + cases[:1]]
    res = grade_many([c.response for c in cases], refs, kind="math")
    assert [r.correct for r in res] == [c.reference == ref for c, ref in zip(cases, refs)]
    assert sum(r.correct for r in res) < len(cases) // 4
