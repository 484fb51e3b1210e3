"""Every built-in set grades its own reference answers right and a neighbouring problem's answer wrong.

Own references: the set's worked solutions where it ships them with the answer in a box or after ``####``
(GSM8K train+test, MATH500, Minerva, AIME24: all rows), and for every set the reference answer stated
as the Minerva few-shot line ("Final Answer: The final answer is $X$. I hope it is correct.", all rows;
for AIME25 and AMC23, which ship no solution, and OlympiadBench, whose solutions are proofs that state the
answer in prose, this is the only form). Neighbours: row i+1's solution (or boxed answer) against row i's
reference, expected wrong; rows with the same reference are skipped. Neighbours are SAMPLED for the
math-kind sets (:data:`NEIGHBOURS` per set, seeded), since each needs a symbolic check in the worker;
GSM8K is graded in full (in-process, exact). ``benchmarks/validate_grader.py`` grades every neighbour.
"""

from __future__ import annotations

import random

import pytest

from oblr.grading import GraderPool
from oblr.tasks.grader_validation import SOLUTION_SETS, case_type, gold_cases, grade_cases
from oblr.tasks.loaders import BENCHMARKS

NEIGHBOURS = 100


@pytest.fixture(scope="module")
def pool():
    p = GraderPool(1)
    yield p
    p.close()


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_own_references_right_neighbours_wrong(pool, name):
    cases = gold_cases(name)
    own = [c for c in cases if case_type(c) in ("solution", "answer~sentence")]
    neighbours = [c for c in cases if case_type(c) == "neighbour"]
    if BENCHMARKS[name].kind == "math" and len(neighbours) > NEIGHBOURS:
        neighbours = random.Random(f"neighbours/{name}").sample(neighbours, NEIGHBOURS)
    assert own and neighbours and not any(c.expect for c in neighbours)
    assert (name in SOLUTION_SETS) == any(case_type(c) == "solution" for c in own)
    misgraded = [(c.what, c.line, c.response[-80:], c.reference, r.pred, r.status)
                 for c, r in grade_cases(own + neighbours, pool=pool) if r.correct != c.expect]
    assert not misgraded
