"""The countdown task: the expression checker (hand cases, every refusal, adversarial input), generation and
answer extraction."""

import time

import pytest

from oblr.tasks import available_tasks, get_task
from oblr.tasks.countdown import (
    MAX_CHARS,
    MAX_DEPTH,
    check_expression,
    extract_expression,
    format_prompt,
)

NUMS = [3, 5, 7]


@pytest.mark.parametrize("expr,target", [
    ("3*5+7", 22), ("7+3*5", 22), ("(7+3)*5", 50), (" ( 7 + 3 ) * 5 ", 50), ("7-5", 2), ("3", 3),
    ("((3+5))", 8), ("5-7", -2), ("7*(5-3)", 14),
])
def test_valid_expressions(expr, target):
    assert check_expression(expr, NUMS, target) == (True, "ok")
    assert check_expression(expr, NUMS, target + 1)[0] is False


def test_exact_rationals():
    # 10/4*2 = 5 exactly (integer division would give 4); 1/3+1/3+1/3 is 1
    assert check_expression("10/4*2", [10, 4, 2], 5)[0]
    assert check_expression("1/3+2/6", [1, 3, 2, 6], 1)[0] is False  # 2/3
    assert check_expression("(1+2)/3", [1, 2, 3], 1)[0]
    assert check_expression("7/(5-3)*3", NUMS, 21) == (False, "wrong value 21/2")


def test_each_number_at_most_once_as_a_multiset():
    assert check_expression("3+3", NUMS, 6) == (False, "3 is not among the given numbers (or is used more "
                                                       "often than given)")
    assert check_expression("3+3", [3, 3, 5], 6)[0]  # given twice: usable twice
    assert check_expression("3+5", NUMS, 8)[0]  # not every number has to be used
    assert not check_expression("4+4", NUMS, 8)[0]  # 4 not given


@pytest.mark.parametrize("expr,why", [
    ("3**5", "unexpected '*'"), ("3^5", "character '^'"), ("x+3", "character 'x'"), ("abs(3)", "character 'a'"),
    ("3.0+5", "character '.'"), ("-3+5", "unary signs are not allowed"), ("+3", "unary"),
    ("3*-5", "unary"), ("07+3", "leading zero"), ("7/(5-5)", "division by zero"), ("(3+5", "unbalanced"),
    ("3+5)", "after a complete expression"), ("3 5", "after a complete expression"), ("", "empty"),
    ("   ", "empty"), ("3+", "ends early"), ("()", "unexpected ')'"), ("3+5=8", "character '='"),
    ("__import__('os')", "character '_'"), ("3\n+5", "character '\\n'"),
])
def test_refusals(expr, why):
    ok, reason = check_expression(expr, [3, 5, 7, 5], 8)
    assert not ok and why in reason, reason


def test_unicode_digits_are_refused():
    for expr in ("٣+5", "３+5", "3+５", "²"):  # Arabic-Indic 3, fullwidth digits, superscript two
        ok, reason = check_expression(expr, NUMS, 8)
        assert not ok and "is not allowed" in reason


def test_adversarial_sizes_are_refused_fast():
    t0 = time.perf_counter()
    cases = [
        ("3+" * 10**6 + "5", "longer than"),  # very long string
        ("(" * (MAX_DEPTH + 1) + "3" + ")" * (MAX_DEPTH + 1), "nested deeper"),
        ("(" * 90 + "3" + ")" * 90, "nested deeper"),  # within MAX_CHARS, beyond MAX_DEPTH
        ("1000000000", "more than 6 digits"),  # a 10**9 literal
        ("9" * 150, "more than 6 digits"),
        ("999999*999999", "not among the given numbers"),
    ]
    for expr, why in cases:
        ok, reason = check_expression(expr, NUMS, 8)
        assert not ok and why in reason, (expr[:20], reason)
    # huge intermediate values built from allowed literals are refused, never computed without bound
    big = [999999] * 25
    expr = "*".join(["999999"] * 25)
    assert len(expr) <= MAX_CHARS
    assert check_expression(expr, big, 1) == (False, "intermediate value beyond 1000000000000")
    assert check_expression("(" * MAX_DEPTH + "3" + ")" * MAX_DEPTH, NUMS, 3)[0]  # exactly the limit is fine
    assert time.perf_counter() - t0 < 2.0


@pytest.mark.parametrize("bad", [None, 3, b"3+5", ["3+5"]])
def test_non_strings_never_raise(bad):
    assert check_expression(bad, NUMS, 8)[0] is False
    assert extract_expression(bad) is None


def test_extraction():
    assert extract_expression(" 3*5+7") == "3*5+7"
    assert extract_expression("some thought\n 3*5+7 \n\n") == "3*5+7"
    assert extract_expression("try 3+5\n#### (7+3)*5") == "(7+3)*5"
    assert extract_expression("#### 3+5 #### 7") == "7"
    assert extract_expression("") is None and extract_expression(" \n ") is None and extract_expression("####") is None


def test_generation_solvable_deterministic_disjoint():
    task = get_task("countdown", n_train=2000, n_eval=300)
    assert len(task.train) == 2000 and len(task.eval) == 300
    for ex in task.train + task.eval:
        nums, target = ex.meta["numbers"], ex.meta["target"]
        assert len(nums) == 3 and all(1 <= n <= 12 for n in nums) and 1 <= target <= 99
        assert target not in nums
        assert ex.prompt == format_prompt(nums, target) and ex.answer == str(target)
        assert task.reward(ex.meta["solution"], ex) == 1.0  # its own reference scores 1
        assert task.extract_answer(ex.meta["solution"]) == ex.meta["expression"]
    keys = lambda s: {(tuple(e.meta["numbers"]), e.meta["target"]) for e in s}  # noqa: E731
    assert not keys(task.train) & keys(task.eval)
    again = get_task("countdown", n_train=50, n_eval=300)
    assert [e.prompt for e in again.eval] == [e.prompt for e in task.eval]  # eval set independent of n_train
    assert [e.prompt for e in again.train] != [e.prompt for e in get_task("countdown", seed=1, n_train=50).train]
    four = get_task("countdown", n_numbers=4, max_number=25, n_train=300, n_eval=50)
    assert all(len(e.meta["numbers"]) == 4 and four.reward(e.meta["solution"], e) == 1.0
               for e in four.train + four.eval)


def test_reward_on_responses():
    task = get_task("countdown", n_train=10, n_eval=10)
    ex = task.eval[0]
    assert task.reward(ex.meta["solution"] + "\n", ex) == 1.0
    assert task.reward("nonsense", ex) == 0.0
    assert task.reward(" " + "+".join(map(str, ex.meta["numbers"])) + "+1", ex) == 0.0


def test_option_ranges_checked():
    with pytest.raises(ValueError, match="n_numbers"):
        get_task("countdown", n_numbers=9)


def test_listed():
    assert "countdown" in available_tasks() and "word_problems" in available_tasks()
