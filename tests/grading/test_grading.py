"""Grader: answer extraction, equivalent forms graded right, near misses graded wrong, API errors."""

from __future__ import annotations

from fractions import Fraction

import pytest

from oblr.grading import GraderPool, grade, grade_detailed, grade_many
from oblr.grading.extract import extract_gsm8k_number, last_boxed
from oblr.grading.labelled import GSM8K_EQUIVALENT, GSM8K_NEAR_MISSES, MATH_EQUIVALENT, MATH_NEAR_MISSES
from oblr.grading.normalize import canonical_unit, normalize_reference, unit_conflict
from oblr.grading.numbers import plain_number


@pytest.mark.parametrize("text,expected", [
    ("x \\boxed{5} y", "5"),
    ("\\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}}.", "\\frac{\\sqrt{3}}{2}"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),              # escaped braces do not count
    ("\\boxed{3} and \\boxed{1+{2}", "3"),              # unbalanced last box: the previous one
    ("\\fbox{7}", "7"),
    ("so \\boxed 12.", "12"),
    ("\\boxed {  4 }", "4"),
    ("no box here", None),
    ("\\boxedfoo{3}", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("text,value,source", [
    ("a 3 b\n#### 1,080", Fraction(1080), "####"),
    ("#### $18.", Fraction(18), "####"),
    ("total \\boxed{\\$1{,}200}", Fraction(1200), "boxed"),
    ("The answer is: -4 apples; 7 left", Fraction(-4), "anchor"),
    ("Q: x\nA: 18 dollars", Fraction(18), "anchor"),
    ("3-5 leaves 2. Then 2.5 hours.", Fraction(5, 2), "last_number"),
    ("nothing", None, "none"),
])
def test_extract_gsm8k_number(text, value, source):
    assert extract_gsm8k_number(text) == (value, source)


def test_numbers_too_long_are_not_converted():
    assert extract_gsm8k_number("#### " + "9" * 5000) == (None, "####")  # found, not converted
    assert plain_number("1" * 500) is None
    assert plain_number("70.0") == 70 and plain_number("-.5") == Fraction(-1, 2) and plain_number("1,2") is None


def test_normalize_reference():
    assert normalize_reference(["$(-\\infty, 0) \\cup\\{1\\}$."]) == "(-\\infty, 0) \\cup\\{1\\}"
    assert normalize_reference(["$1$", "$2$"]) == "1, 2"
    assert normalize_reference("\\$18.90") == "18.90"
    assert normalize_reference(70.0) == "70.0"


def test_units():
    assert canonical_unit("minutes") == canonical_unit("min") == "minute"
    assert canonical_unit("$cm^2$") == "cm^2" and canonical_unit("^{\\circ}") == "degree"
    assert unit_conflict("45\\text{ hours}", "minute") and not unit_conflict("45\\text{ min}", "minute")
    assert not unit_conflict("45\\text{ hours}", None) and not unit_conflict("45\\text{ widgets}", "minute")
    assert not unit_conflict("166 \\text{ cm}^2", "$cm^2$") and unit_conflict("166 \\text{ cm}", "$cm^2$")


def test_at_least_50_near_misses():
    assert len(MATH_NEAR_MISSES) + len(GSM8K_NEAR_MISSES) >= 50


@pytest.mark.parametrize("response,reference,unit", MATH_NEAR_MISSES)
def test_math_near_miss_is_wrong(response, reference, unit):
    r = grade_detailed(response, reference, kind="math", unit=unit)
    assert not r.correct and r.status in ("ok", "no_answer"), r


@pytest.mark.parametrize("response,reference,unit", MATH_EQUIVALENT)
def test_math_equivalent_is_right(response, reference, unit):
    r = grade_detailed(response, reference, kind="math", unit=unit)
    assert r.correct, r


@pytest.mark.parametrize("response,reference", GSM8K_NEAR_MISSES)
def test_gsm8k_near_miss_is_wrong(response, reference):
    assert not grade(response, reference, kind="gsm8k")


@pytest.mark.parametrize("response,reference", GSM8K_EQUIVALENT)
def test_gsm8k_equivalent_is_right(response, reference):
    assert grade(response, reference, kind="gsm8k")


def test_grade_errors():
    with pytest.raises(ValueError, match="unknown grading kind 'mcq'.*gsm8k, math"):
        grade("1", "1", kind="mcq")
    with pytest.raises(TypeError, match="response must be a str"):
        grade(None, "1")
    with pytest.raises(ValueError, match="holds no number"):
        grade("#### 1", "n/a", kind="gsm8k")
    with pytest.raises(ValueError, match="empty"):
        grade("\\boxed{1}", "$ $")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        grade("\\boxed{x+1}", "1+x", timeout=0)


def test_grade_many_keeps_order_with_two_workers():
    pool = GraderPool(2)
    try:
        refs = ["\\frac{1}{2}", "\\sqrt{8}", "(1,2]", "3"] * 3
        resps = ["\\boxed{0.5}", "\\boxed{2\\sqrt2}", "\\boxed{(1,2)}", "\\boxed{4}"] * 3
        res = grade_many(resps, refs, kind="math", pool=pool)
        assert [r.correct for r in res] == [True, True, False, False] * 3
        with pytest.raises(ValueError, match="3 responses but 2 references"):
            grade_many(["a"] * 3, ["1"] * 2)
    finally:
        pool.close()
