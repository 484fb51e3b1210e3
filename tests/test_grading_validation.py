"""Grader validation on every built-in set: gold answers / gold solutions vs the reference, >= 99.5 %.

The full run takes about 20 s on a 2-core machine (see docs/grading.md and benchmarks/validate_grader.py),
so the suite runs it in full.
"""

from __future__ import annotations

import pytest

from oblr.grading import GraderPool
from oblr.grading.validate import gold_cases, run_validation
from oblr.tasks.loaders import BENCHMARKS


@pytest.fixture(scope="module")
def validation():
    pool = GraderPool(1)
    try:
        yield run_validation(pool=pool)
    finally:
        pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_gold_agreement_at_least_99_5_percent(validation, name):
    r = validation[name]
    assert r["n"] == len(gold_cases(name)) > 0
    assert r["agreement"] >= 0.995, r["misses"][:10]


def test_cases_cover_answers_and_solutions():
    whats = {c.what for c in gold_cases("math500")}
    assert whats == {"test/answer", "test/solution"}
    assert {c.what for c in gold_cases("gsm8k")} == {"train/answer", "train/solution", "test/answer",
                                                      "test/solution"}
    assert any(c.what == "test/answer+unit" for c in gold_cases("olympiadbench"))


def test_a_wrong_reference_breaks_agreement():
    # the validation can fail: each gold against the next row's reference agrees only where they are equal
    from oblr.grading import grade_many

    cases = gold_cases("amc23")
    refs = [c.reference for c in cases[1:] + cases[:1]]
    res = grade_many([c.response for c in cases], refs, kind="math")
    assert [r.correct for r in res] == [c.reference == ref for c, ref in zip(cases, refs)]
    assert sum(r.correct for r in res) < len(cases) // 4
