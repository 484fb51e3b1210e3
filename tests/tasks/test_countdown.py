"""The countdown task: the expression checker (hand cases, every refusal, adversarial input), generation and
answer extraction."""

import itertools
import random
import re
from fractions import Fraction

import pytest

from oblr.tasks import available_tasks, get_task
from oblr.tasks.countdown import (
    MAX_ABS,
    MAX_CHARS,
    MAX_DEPTH,
    Refused,
    check_expression,
    evaluate_expression,
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
    assert check_expression("7/(5-3)", NUMS, 3) == (False, "wrong value 7/2")


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


def test_adversarial_sizes_are_refused():
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
    with pytest.raises(ValueError, match="max_target"):
        get_task("countdown", max_target=0)
    with pytest.raises(ValueError, match="could only draw 5 distinct eval instances"):  # a space too small
        get_task("countdown", n_numbers=2, max_number=2)


def test_listed():
    assert "countdown" in available_tasks() and "word_problems" in available_tasks()


def _full_expressions(items: list[tuple[str, Fraction]]):
    """Every fully parenthesised expression over all of ``items`` (in every order), with its exact value; an
    enumeration independent of the checker (division by zero skipped)."""
    if len(items) == 1:
        yield items[0]
        return
    for k in range(1, len(items)):
        for left_idx in itertools.combinations(range(len(items)), k):
            left = [items[i] for i in left_idx]
            right = [items[i] for i in range(len(items)) if i not in left_idx]
            for lt, lv in _full_expressions(left):
                for rt, rv in _full_expressions(right):
                    yield f"({lt}+{rt})", lv + rv
                    yield f"({lt}-{rt})", lv - rv
                    yield f"({lt}*{rt})", lv * rv
                    if rv != 0:
                        yield f"({lt}/{rt})", lv / rv


def _all_over_subsets(numbers: list[int]):
    for k in range(1, len(numbers) + 1):
        for idx in itertools.combinations(range(len(numbers)), k):
            yield from _full_expressions([(str(numbers[i]), Fraction(numbers[i])) for i in idx])


@pytest.mark.parametrize("numbers", [[1, 2, 3], [2, 2, 5], [3, 4, 6], [1, 5, 5, 7]])
def test_checker_agrees_with_brute_force_enumeration(numbers):
    """Every fully parenthesised expression over a subset of the numbers (each at most once, every order, every
    tree shape and operator), enumerated independently with Fraction, is accepted with exactly that value and
    refused for any other target."""
    reachable: set[Fraction] = set()
    n = 0
    for text, value in _all_over_subsets(numbers):
        n += 1
        reachable.add(value)
        assert check_expression(text, numbers, value) == (True, "ok"), text
        wrong = value + 1
        assert check_expression(text, numbers, wrong) == (False, f"wrong value {value}"), text
    assert n > 100 and any(v.denominator > 1 for v in reachable)  # non-integer values occur and are exact
    # using one number more often than given is refused whatever the value
    extra = next(x for x in range(1, 10) if numbers.count(x) == 0 or x == numbers[0])
    over = "+".join([str(extra)] * (numbers.count(extra) + 1))
    assert check_expression(over, numbers, (numbers.count(extra) + 1) * extra)[0] is False


def _oracle(text: str) -> Fraction | None:
    """The value of a generated digits/operators/parentheses string by Python's own parser over Fractions (a
    test-only oracle for precedence and associativity: the strings here are made by the test itself)."""
    try:
        return eval(re.sub(r"\d+", lambda m: f"F({m.group()})", text), {"F": Fraction, "__builtins__": {}})  # noqa: S307
    except ZeroDivisionError:
        return None


def test_precedence_and_associativity_match_an_oracle():
    rng = random.Random(0)
    for _ in range(3000):
        nums = [rng.randint(1, 12) for _ in range(rng.randint(2, 5))]
        order = rng.sample(nums, len(nums))
        text = str(order[0])
        for x in order[1:]:
            op = rng.choice("+-*/")
            if rng.random() < 0.3:
                text = f"({text}){op}{x}"
            elif rng.random() < 0.2:
                text = f"{x}{op}({text})"
            else:
                text = f"{text}{op}{x}"
        want = _oracle(text)
        ok, why = check_expression(text, nums, 0 if want is None else want)
        if want is None:
            assert (ok, why) == (False, "division by zero"), text
        else:
            assert ok, (text, why)


_ALPHABET = list("0123456789+-*/() ") * 4 + list("xe._^=,\n\t#$") + ["**", "٣", "３", "²", "\u00a0", "0x1f", "1e9",
                                                                      "999999", "1000000", "(" * 20, ")" * 20]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        kind = rng.random()
        if kind < 0.4:
            text = text[:i] + rng.choice(_ALPHABET) + text[i:]
        elif kind < 0.7 and text:
            text = text[:i] + text[i + 1:]
        elif text:
            j = min(len(text), i + rng.randint(1, 3))
            text = text[:i] + rng.choice(_ALPHABET) + text[j:]
    return text


def _check_bounded(text, numbers, target):
    ok, why = check_expression(text, numbers, target)
    assert isinstance(ok, bool) and isinstance(why, str)
    if ok:  # an accepted expression is within every bound
        assert isinstance(text, str) and len(text) <= MAX_CHARS and text.count("(") <= MAX_CHARS
        assert all(ch in "0123456789+-*/() " for ch in text)
        value = evaluate_expression(text, numbers)
        assert value == target and abs(value.numerator) <= MAX_ABS and value.denominator <= MAX_ABS
    else:
        try:
            evaluate_expression(text, numbers)
        except Refused:
            pass  # refused: the only exception evaluate_expression may raise
    return ok


def test_fuzz_never_raises_and_stays_in_bounds():
    """Random strings, random mutations of valid expressions, deep nesting and huge literals: a verdict and
    a reason every time, no other exception, and every accepted expression within the bounds."""
    task = get_task("countdown", n_train=0, n_eval=200, n_numbers=4, max_number=30)
    rng = random.Random(1)
    accepted = 0
    for i in range(4000):
        ex = task.eval[i % len(task.eval)]
        nums, target = ex.meta["numbers"], ex.meta["target"]
        r = rng.random()
        if r < 0.45:
            text = _mutate(rng, ex.meta["expression"])
        elif r < 0.8:
            text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 40)))
        elif r < 0.9:
            d = rng.randint(0, 3 * MAX_DEPTH)
            text = "(" * d + ex.meta["expression"] + ")" * rng.randint(d - 1, d + 1)
        else:
            text = "*".join(str(rng.choice([999999, 10**rng.randint(0, 9), *nums])) for _ in range(rng.randint(1, 30)))
            nums = nums + [999999] * 30 + [10**k for k in range(7)] * 30
        accepted += _check_bounded(text, nums, target)
        _check_bounded(text, nums, Fraction(rng.randint(-5, 200), rng.randint(1, 3)))
    assert accepted > 0  # the mutations sometimes keep an expression valid (e.g. an added space)
    # the extreme sizes: refused with their reasons, not evaluated
    assert check_expression("(" * 10**5 + "3" + ")" * 10**5, NUMS, 3) == (False, f"expression longer than {MAX_CHARS} characters")
    assert not check_expression("9" * 10**6, [9], 9)[0]
    assert check_expression("*".join(["999999"] * 3), [999999] * 3, 999999**3)[0] is False  # beyond MAX_ABS


# --- legal but unusual expressions, and answer keys recomputed from the prompt text ---

@pytest.mark.parametrize("expr,numbers,value", [
    ("((((3))+((5))))*(7)", [3, 5, 7], 56),            # redundant nesting around literals and sums
    ("(3*(5+(7-(2))))", [2, 3, 5, 7], 30),             # right-nested chain
    (" 3 *  ( 5+7 )   ", [3, 5, 7], 36),               # spaces anywhere
    ("12/4+5", [12, 4, 5], 8),                         # a division giving an integer
    ("(7+5)/4*3", [3, 4, 5, 7], 9),                    # an integer quotient inside a product
    ("3-7+12", [3, 7, 12], 8),                         # a negative intermediate value
    ("8/(3-1/3)", [8, 3, 1, 3], 3),                    # a fraction inside, an integer at the end: 8/(8/3)
    ("5+5+5", [5, 5, 5, 2], 15),                       # a number given three times, used three times
    ("2-3-4", [2, 3, 4], -5),                          # left-associative minus (2-(3-4) would be 3)
    ("24/4/2", [24, 4, 2], 3),                         # left-associative division (24/(4/2) would be 12)
])
def test_unusual_but_legal_expressions_are_accepted_with_their_value(expr, numbers, value):
    """Values worked out by hand in the comments; each number used at most as often as given."""
    assert check_expression(expr, numbers, value) == (True, "ok")
    assert check_expression(expr, numbers, value + 1) == (False, f"wrong value {Fraction(value)}")


def test_parentheses_counted_per_nesting_not_per_pair():
    """Sibling groups do not add up to a depth: 20 parenthesised ones in a row, and two groups each nested
    exactly MAX_DEPTH deep, are legal; one level more in either group is refused."""
    ones = "+".join(["(1)"] * 20)
    assert check_expression(ones, [1] * 20, 20) == (True, "ok")
    deep = "(" * MAX_DEPTH + "3" + ")" * MAX_DEPTH
    assert check_expression(f"{deep}+{deep}", [3, 3], 6) == (True, "ok")
    deeper = "(" * (MAX_DEPTH + 1) + "3" + ")" * (MAX_DEPTH + 1)
    ok, why = check_expression(f"{deep}+{deeper}", [3, 3], 6)
    assert not ok and "nested deeper" in why


def test_reward_reads_the_unusual_forms_through_extraction():
    from oblr.tasks.countdown import make_example

    task = get_task("countdown", n_train=0, n_eval=1)
    ex = make_example([12, 4, 5], 8, "12/4+5")
    assert ex.answer == "8"
    for response in (" (12/4)+5", "let me try\n 12 / 4 + 5 \t\n", "#### ((12)/(4))+(5)", "12*4\n#### 5+12/4"):
        assert task.reward(response, ex) == 1.0, response
    for response in (" 12/4+5+4", " -4+12", " 12/4*5", " 5+12/4\n#### 12/4"):
        assert task.reward(response, ex) == 0.0, response


def _eval_own(text: str, numbers: list[int]) -> Fraction:
    """A second evaluator (shunting-yard over Fractions, written for this test): the value of an expression
    with + - * / and parentheses, and a check that its literals are a sub-multiset of ``numbers``."""
    toks = re.findall(r"\d+|[-+*/()]", text)
    assert "".join(toks) == text.replace(" ", ""), text
    prec = {"+": 1, "-": 1, "*": 2, "/": 2}
    out, ops = [], []

    def apply():
        op, b, a = ops.pop(), out.pop(), out.pop()
        out.append(a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b)

    left = list(numbers)
    for t in toks:
        if t.isdigit():
            left.remove(int(t))  # ValueError: a literal not given (or used too often)
            out.append(Fraction(int(t)))
        elif t == "(":
            ops.append(t)
        elif t == ")":
            while ops[-1] != "(":
                apply()
            ops.pop()
        else:
            while ops and ops[-1] != "(" and prec[ops[-1]] >= prec[t]:
                apply()
            ops.append(t)
    while ops:
        apply()
    assert len(out) == 1
    return out[0]


def test_answer_keys_recomputed_from_the_prompt_text():
    """Every example's prompt parsed back into numbers and target: the stored answer is that target, the stored
    solution evaluates to it under a second evaluator with the prompt's numbers (each at most once), and the
    target is reachable by the independent brute-force enumeration of all expressions over the numbers."""
    task = get_task("countdown", n_train=250, n_eval=100)
    reach_cache: dict = {}
    for ex in task.train + task.eval:
        m = re.fullmatch(r"Q: ((?:\d+ )+)= (\d+)\nA:", ex.prompt)
        assert m, ex.prompt
        numbers, target = [int(x) for x in m[1].split()], int(m[2])
        assert ex.answer == str(target) and ex.meta["numbers"] == numbers and ex.meta["target"] == target
        assert _eval_own(ex.meta["expression"], numbers) == target, ex.meta["expression"]
        key = tuple(sorted(numbers))
        if key not in reach_cache:
            reach_cache[key] = {v for _, v in _all_over_subsets(list(key))}
        assert Fraction(target) in reach_cache[key]
        assert task.reward(ex.meta["solution"], ex) == 1.0
