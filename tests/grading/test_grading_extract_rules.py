"""Where the GSM8K grader finds the answer: one test per extraction rule of
:func:`oblr.grading.extract.extract_gsm8k_number`, each with an input on which the rule decides the result
(removing or changing the rule changes the value or its source).

The inputs place the statement a rule prefers LAST in the text, so every case also holds under "the
statement that starts last is the answer" (the precedence issue 16 asks for). How a number is read (fractions,
scientific notation, thousands separators: issue 12) is not pinned here; every answer is a plain integer.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from oblr.grading import extract_gsm8k_number, grade


def _is(text: str, value: int | None, source: str) -> None:
    want = (None if value is None else Fraction(value), source)
    assert extract_gsm8k_number(text) == want, text


def test_marker_wins_over_a_box_and_an_answer_sentence():
    _is("\\boxed{4} is what I first got. The answer is 6.\n#### 5", 5, "####")


def test_the_last_marker_is_read():
    _is("#### 3\nNo, I forgot the eggs she ate.\n#### 4", 4, "####")


def test_the_first_number_after_the_marker_is_the_answer():
    _is("#### 12 eggs. 15 were sold on Monday", 12, "####")


def test_a_marker_without_a_number_falls_through():
    _is("The answer is 9.\n####\n", 9, "anchor")


def test_a_box_wins_over_an_answer_sentence():
    _is("The answer is 3. Checking once more, 1 + 3 = 4, so \\boxed{4}", 4, "boxed")


def test_the_last_box_is_read():
    _is("\\boxed{1}. Wait, that is wrong. Starting again: 2 + 0 = 2, so \\boxed{2}", 2, "boxed")


def test_latex_thousands_separator_in_a_box():
    _is("She earns \\boxed{1{,}200} dollars", 1200, "boxed")


def test_a_box_without_a_number_falls_through():
    _is("\\boxed{\\text{see below}}\nThe answer is 7.", 7, "anchor")


def test_an_answer_sentence_wins_over_later_numbers():
    _is("The answer is 7. Check: 3 + 4 = 7 after 2 days", 7, "anchor")


def test_the_last_answer_sentence_is_read():
    _is("The answer is 3. Hmm, I missed a step.\nThe final answer is 8.", 8, "anchor")


@pytest.mark.parametrize("text,value", [
    ("Final answer: 6 (from 2 and 4)", 6),
    ("ANSWER = 6 (from 2 and 4)", 6),        # case-insensitive
    ("so the answer is 6 (from 2 and 4)", 6),
    ("Q: 2 + 4?\nA: 6 (from 2 and 4)", 6),   # "A:" at the start of a line
])
def test_answer_sentence_forms(text, value):
    _is(text, value, "anchor")


def test_a_colon_after_a_mid_line_a_is_no_answer_sentence():
    _is("Plan A: 4 apples, then 5", 5, "last_number")


def test_a_number_far_after_the_answer_words_is_not_their_answer():
    _is("The answer is " + "z" * 250 + " 5, not 6", 6, "last_number")


def test_without_a_statement_the_last_number():
    _is("3 apples and 4 pears", 4, "last_number")
    _is("no digits at all", None, "none")


def test_the_reference_is_read_by_the_same_rules():
    ref = "She had 3 eggs and bought 2.\n#### 5"
    assert grade("3 + 2 = 5", ref, kind="gsm8k") and not grade("She had 3", ref, kind="gsm8k")
