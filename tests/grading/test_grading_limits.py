"""Grader safety: pathological inputs return within the time limit, from any thread; model text is never run."""

from __future__ import annotations

import threading
import time

import pytest

from oblr.grading import GraderPool, grade, grade_detailed

LIMIT = 1.5
SLACK = 20.0  # generous: a real hang would never return; this only bounds how long the test waits


@pytest.fixture(scope="module")
def pool():
    p = GraderPool(1)
    grade("\\boxed{1}", "x+1", pool=p)  # start the worker outside the timed calls
    yield p
    p.close()


PATHOLOGICAL = [
    ("\\boxed{2^{99999999999}}", "1"),
    ("\\boxed{10^{10^{10^{10}}}}", "1"),
    ("\\boxed{9^{9^{9^{9}}} - 9^{9^{9^{9}}}}", "0"),
    ("\\boxed{" + "x+" * 5000 + "1}", "1"),                       # 10k-character LaTeX
    ("\\boxed{" + "\\frac{1}{" * 1500 + "2" + "}" * 1500 + "}", "2"),
    ("\\boxed{" + "{" * 5000 + "1", "1"),                            # unbalanced braces
    ("\\boxed{1" + "}" * 5000, "1"),
    ("$" + "\\sqrt{" * 2000 + "2" + "}" * 2000 + "$ " * 10, "2"),
    ("(" * 5000 + "1" + ")" * 5000, "1"),
    ("\\boxed{" + "9" * 10000 + "}", "1"),
    (" ".join(["\\left(1,2\\right]"] * 2000), "(1,2]"),
]


@pytest.mark.parametrize("response,reference", PATHOLOGICAL)
def test_pathological_inputs_return_within_limit(pool, response, reference):
    t0 = time.perf_counter()
    r = grade_detailed(response, reference, kind="math", timeout=LIMIT, pool=pool)
    assert time.perf_counter() - t0 < LIMIT + SLACK
    assert r.status in ("ok", "timeout", "no_answer", "error")
    if r.status != "ok":
        assert not r.correct


def test_gsm8k_pathological_is_fast():
    for text in ["9" * 20000, "1," * 10000 + "1", "#### " + "-" * 10000, "A:" * 10000, "\\boxed{" * 5000]:
        assert grade(text, "18", kind="gsm8k") is False


def test_timeout_works_off_the_main_thread(pool):
    out = {}

    def run():
        out["r"] = grade_detailed("\\boxed{2^{99999999999}}", "1", timeout=LIMIT, pool=pool)

    th = threading.Thread(target=run)
    th.start()
    th.join(LIMIT + SLACK)
    assert not th.is_alive()
    assert out["r"].status == "timeout" and not out["r"].correct


def test_hard_kill_when_the_worker_does_not_stop_itself():
    p = GraderPool(1, soft_share=100.0)  # the child's own limit far away: only the parent's kill can stop it
    try:
        assert grade("\\boxed{1}", "1.0+0", pool=p)
        r = grade_detailed("\\boxed{2^{99999999999}}", "1", timeout=LIMIT, pool=p)
        assert r.status in ("timeout", "error") and not r.correct
        assert p.restarts == 1
        assert grade("\\boxed{\\frac{1}{2}}", "0.5", pool=p)  # a fresh worker answers the next check
    finally:
        p.close()


@pytest.mark.parametrize("payload", [
    "\\boxed{__import__('os').system('touch {f}')}",
    "The answer is __import__('os').system('touch {f}')",
    "Final answer: exec(\"open('{f}', 'w').write('x')\")",
    "\\boxed{\\text{eval(compile('open(\"{f}\",\"w\")','a','exec'))}}",
])
def test_model_text_is_never_executed(pool, tmp_path, payload):
    f = tmp_path / "pwned"
    response = payload.replace("{f}", str(f))
    assert grade(response, "0", pool=pool) is False
    assert not f.exists()
