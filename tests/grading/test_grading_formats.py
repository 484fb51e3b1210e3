"""Answer formats (issue 16) and the GSM8K number rule (issue 12, item 12): one test per format.

Each format test grades the hand-labelled cases of that format (:mod:`oblr.grading.labelled`) and expects
the human verdict; each has at least one case the grader before this change got wrong (checked by running
this file against it), except the GSM8K ``trailing_period`` and ``percent`` forms, which were already read
right and are kept as regression guards. The other tests pin the extraction and number-reading rules.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from oblr.grading import grade_detailed
from oblr.grading.extract import final_answer
from oblr.grading.labelled import GSM8K_FORMATS, MATH_FORMATS
from oblr.grading.normalize import answer_parts, canonical_latex, normalize_answer
from oblr.grading.numbers import last_value, plain_number, read_value


def _misgraded(cases, kind):
    out = []
    for response, reference, unit, correct in cases:
        r = grade_detailed(response, reference, kind=kind, unit=unit)
        if r.correct != correct:
            out.append((response, reference, f"expected {'right' if correct else 'wrong'}", r))
    return out


@pytest.mark.parametrize("fmt", list(MATH_FORMATS))
def test_math_format(fmt):
    assert not _misgraded(MATH_FORMATS[fmt], "math")


@pytest.mark.parametrize("fmt", list(GSM8K_FORMATS))
def test_gsm8k_number_form(fmt):
    assert not _misgraded(GSM8K_FORMATS[fmt], "gsm8k")


def test_issue_examples():
    assert grade_detailed("Final Answer: The final answer is 12,000,023. I hope it is correct.", "12000023").correct
    assert grade_detailed("The final answer is 7.78.", "7.78").correct
    assert grade_detailed("So the answer is 2/3.", "\\frac{2}{3}").correct
    assert grade_detailed("\\boxed{(1, 2)}, \\boxed{(2, 1)}", ["(1,2)", "(2,1)"]).correct
    assert not grade_detailed("\\boxed{32, 349}", "32349").correct
    for response, reference in [("#### 2/3", "2"), ("#### 1 1/2", "1"), ("#### 3 x 10^5", "3"), ("#### 12:30", "12")]:
        assert not grade_detailed(response, reference, kind="gsm8k").correct
    assert grade_detailed("#### 1e9", "1000000000", kind="gsm8k").correct


@pytest.mark.parametrize("text,answer,source", [
    ("\\boxed{5}. Actually, the answer is 6.", "6", "sentence"),         # a correction after the box
    ("The answer is 6. Checking again: \\boxed{5}", "5", "boxed"),        # ... and the other way round
    ("The final answer is $\\boxed{5}$. I hope it is correct.", "5", "boxed"),  # the box inside the sentence
    ("Final Answer: The final answer is $x^2$. I hope it is correct.", "$x^2$", "sentence"),
    ("The answer is 7, since 3 + 4 = 7.", "7", "sentence"),              # a remark is cut
    ("#### 18\nThe answer is correct.", "18", "####"),                    # not answer-like: no statement
    ("\\boxed{6}. But what if the answer is 5?", "6", "boxed"),           # a question states nothing
    ("\\boxed{6}. If the answer is 5, then x < 0.", "6", "boxed"),        # nor does a supposition
    ("We check our answer: $6 \\cdot 7 = 42$. \\boxed{42}", "42", "boxed"),
    ("**Final Answer**\n\n\\[\n\\boxed{\\frac{1}{2}}\n\\]", "\\frac{1}{2}", "boxed"),
    ("Answer:\n$$\n\\frac{1}{2}\n$$", "$$\n\\frac{1}{2}\n$$", "sentence"),
])
def test_final_answer_precedence(text, answer, source):
    a = final_answer(text)
    assert (a.text, a.source) == (answer, source)


def test_box_run_only_for_several_answers():
    text = "Intermediate: \\boxed{7}.\n\nSo x = \\boxed{1} or x = \\boxed{-2}"
    assert final_answer(text).text == "-2"
    assert final_answer(text, several=True).text == "1, -2"  # the blank line ends the run
    nested = "\\boxed{x = \\boxed{3}}"
    assert final_answer(nested, several=True).text == "3"


@pytest.mark.parametrize("span,value,note", [
    ("2/3", Fraction(2, 3), ""), ("1 1/2 cups", Fraction(3, 2), ""), ("\\frac{3}{2}", Fraction(3, 2), ""),
    ("3 \\times 10^{5}", Fraction(300000), ""), ("1.5E-3", Fraction(3, 2000), ""), ("2^10", Fraction(1024), ""),
    ("1010_2", Fraction(10), ""), ("0x1F", Fraction(31), ""), ("$2.5 million", Fraction(2500000), ""),
    ("20 - 2 = 18", Fraction(18), ""), ("−5", Fraction(-5), ""), ("-$5", Fraction(-5), ""), ("18.", Fraction(18), ""),
    ("\\$1{,}200", Fraction(1200), ""), ("25%", Fraction(25), ""),
    ("12:30", None, "time or ratio"), ("1,00", None, "malformed number"), ("1.2.3", None, "malformed number"),
    ("12, 13", None, "several numbers"), ("1 000", None, "several numbers"), ("5 + 3", None, "unevaluated expression"),
    ("129_2", None, "digits invalid in base 2"), ("2^99999", None, "exponent too large"),
    ("9" * 100, None, "number too long"),
])
def test_read_value(span, value, note):
    r = read_value(span)
    assert (r.value, r.note) == (value, note)


def test_last_value_reads_the_last_expression_whole():
    assert last_value("16 - 3 - 4 = 9 eggs, 9 * 2 = 18 dollars").value == 18
    assert last_value("3-5 leaves 2. Then 2.5 hours.").value == Fraction(5, 2)
    assert last_value("It is 3 x 10^5 in all").value == 300000
    assert last_value("We meet at 12:30.").note == "time or ratio"
    assert last_value("no digits") is None


def test_number_helpers():
    assert plain_number("2.88e-19") == Fraction(288, 10**21) and plain_number("3 \\times 10^{5}") == 300000
    assert plain_number("12,000,023") == 12000023 and plain_number("32, 349") is None and plain_number("7.78.") == Fraction(778, 100)
    assert answer_parts("(1,2), (2,1)") == ["(1,2)", "(2,1)"] and answer_parts("12,000") == ["12,000"]
    assert answer_parts("1,3,5") == ["1", "3", "5"] and answer_parts("[1, 2)") == ["[1, 2)"]
    assert normalize_answer("$28$ percent.") == "28\\%" and normalize_answer("1 1/2") == "\\frac{3}{2}"
    assert normalize_answer("-2 3/4") == "\\frac{-11}{4}" and normalize_answer("1e9") == "1\\times10^{9}"
    assert normalize_answer("x=1 and x=-2") == "x=1, x=-2" and normalize_answer("\\textbf{(B)}") == "(B)"
    assert canonical_latex("32, 349") == "32, 349" and canonical_latex("\\frac {1} {2} , x") == "\\frac{1}{2},x"


def test_tiny_numbers_compare_exactly():
    # math-verify's tolerance is absolute: 1.325e-27 would "equal" 2.88e-19; numbers are compared exactly
    assert not grade_detailed("\\boxed{1.325e-27}", "2.88e-19").correct
    assert not grade_detailed("\\boxed{1.3 \\times 10^{-27}}", "2.88 \\times 10^{-19}").correct
    assert grade_detailed("\\boxed{2.88 \\times 10^{-19}}", "2.88e-19").correct


def test_unit_word_after_a_number():
    assert not grade_detailed("The answer is 45 hours.", "45", unit="minute").correct
    assert grade_detailed("The answer is 45 minutes.", "45", unit="minute").correct


@pytest.mark.parametrize("response,wrong_reference", [
    ("Final Answer: The largest $n$ is 34, not 35.", "35"),
    ("Final Answer: The largest $n$ is 34 and not 35.", "35"),
    ("Final Answer: The largest $n$ is 34; 35 fails.", "35"),
    ("Answer: The sum is 5 and the product is 6.", "6"),
])
def test_a_named_quantity_sentence_with_two_numbers_is_not_the_second(response, wrong_reference):
    assert not grade_detailed(response, wrong_reference).correct


def test_named_quantity_and_bare_answers_are_read():
    assert final_answer("Final Answer: The largest $n$ is 34.").text == "34"
    assert final_answer("So the answer is correct.") is None  # no value after it: still no statement
    assert grade_detailed("28 percent", "28\\%").pred == "28\\%"  # short, one line: read whole
    long_text = "I think that it might be 28 percent but I am not sure at all."
    assert grade_detailed(long_text, "28\\%").pred is None  # longer than a bare answer: math-verify's fallback
