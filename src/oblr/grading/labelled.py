"""Hand-labelled grading cases: responses with the verdict a person gives them.

Used by the tests and by ``benchmarks/validate_grader.py`` (agreement per set, :func:`labelled_sets`).
The responses are written by hand in the formats models produce (Minerva-style few-shot sentences,
``\\boxed{}`` answers, GSM8K ``####`` lines); they are not recorded model outputs.

- :data:`MATH_NEAR_MISSES` / :data:`GSM8K_NEAR_MISSES`: near misses, graded WRONG (off by one, wrong sign,
  swapped tuple, missing answer, wrong unit, ...);
- :data:`MATH_EQUIVALENT` / :data:`GSM8K_EQUIVALENT`: equivalent forms, graded RIGHT;
- :data:`MATH_FORMATS`: the answer formats of the math kind (issue 16), by format name;
- :data:`GSM8K_FORMATS`: the number forms of the GSM8K rule (issue 12, item 12), by class.

A format case is ``(response, reference, unit, correct)``; GSM8K cases have no unit.
"""


def B(s: str) -> str:
    return "\\boxed{" + s + "}"


# (response, reference, unit) that must be graded WRONG (kind math)
MATH_NEAR_MISSES = [
    (B("205"), "204", None), (B("-3"), "3", None), (B("\\frac{3}{4}"), "\\frac{4}{3}", None),
    (B("\\frac{14}{3}"), "\\frac{13}{3}", None), (B("2\\sqrt{3}"), "3\\sqrt{2}", None),
    (B("\\sqrt{51}"), "\\sqrt{50}", None), (B("[1/2, 8)"), "[\\frac{1}{2}, 8]", None),
    (B("(\\frac12, 8]"), "[\\frac{1}{2}, 8]", None), (B("(-\\infty, -5]"), "(-\\infty,-5)", None),
    (B("\\left( \\frac{\\pi}{2}, 3 \\right)"), "\\left( 3, \\frac{\\pi}{2} \\right)", None),
    (B("(2,1)"), "(1,2)", None), (B("(1,2,4)"), "(1,2,3)", None), (B("(2,1,3)"), "(1,2,3)", None),
    (B("1"), "1,-2", None), (B("1, -2, 3"), "1,-2", None), (B("3, 5"), "3, 5, 7", None),
    (B("(3,2),(-3,2),(3,-2)"), "(3,2),(-3,2),(3,-2),(-3,-2)", None),
    (B("\\begin{pmatrix}2\\\\1\\end{pmatrix}"), "\\begin{pmatrix}1\\\\2\\end{pmatrix}", None),
    (B("\\begin{pmatrix}1&3\\\\2&4\\end{pmatrix}"), "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", None),
    (B("6+5i"), "6 - 5i", None), (B("-2 - 7i"), "-2 + 7i", None),
    (B("x^5 - x^4 + x^3 - x^2 + x + 1"), "x^5 - x^4 + x^3 - x^2 + x - 1", None),
    (B("p + q"), "p - q", None), (B("\\frac{\\pi}{6}"), "-\\frac{\\pi}{6}", None),
    (B("0.16"), "0.15", None), (B("1.0001"), "1", None),
    (B("\\frac{n(n+1)}{2}"), "\\frac{n(n+1)(2 n+1)}{6}", None), (B("\\frac{1}{4} n(n-1)"), "\\frac{1}{4} n(n+1)", None),
    (B("x=6"), "x=5", None), (B("\\text{Alice}"), "\\text{Evelyn}", None), (B("53_8"), "52_8", None),
    (B("91^\\circ"), "90^\\circ", None), (B("4\\pi^2+1"), "4 \\pi^{2}-1", None), (B("2+\\sqrt{3}"), "2-\\sqrt{3}", None),
    (B("5\\sqrt{11}"), "5 \\sqrt{10}", None), (B("(-\\infty, 0) \\cup \\{2\\}"), "(-\\infty, 0) \\cup\\{1\\}", None),
    (B("(-\\infty, 0]"), "(-\\infty, 0) \\cup\\{1\\}", None),
    (B("(-\\sqrt{11},-2)\\cup (\\sqrt{11},9]"), "(-\\sqrt{11},-2)\\cup (\\sqrt{11},9)", None),
    (B("[-1,-\\frac{1}{2})"), "[-1,-\\frac{1}{2}]", None), (B("0.75"), "45", "minute"),
    (B("4.3\\%"), "4.2", "%"), (B("0.42"), "4.2", "%"), (B("\\$18.91"), "\\$18.90", None), (B("32,349"), "\\$32,\\!348", None),
    (B("\\sqrt{39}"), "3\\sqrt{13}", None), (B("\\frac{243}{525}"), "\\frac{243}{625}", None), (B("2221"), "2220", None),
    (B("11\\sqrt3"), "11\\sqrt2", None), (B("70\\sqrt{3}"), "70 \\sqrt{2}", None), (B("\\frac{3}{65}"), "\\frac{3}{56}", None),
    (B("x \\geq 2"), "x > 2", None), (B("\\{1,2\\}"), "\\{1,2,3\\}", None), (B("e^2"), "e^{-2}", None),
    (B("\\log 3"), "\\log 2", None), (B("\\sin x"), "\\cos x", None), (B("2x+1"), "2x-1", None),
    (B("y = 2x + 3"), "y = 2x - 3", None), (B("\\infty"), "-\\infty", None), (B("0"), "1", None),
    ("I am not sure.", "5", None), (B("5") + " wait, that is wrong: " + B("6"), "5", None),
    (B("45\\text{ hours}"), "45", "minute"), (B("71"), "70.0", None), (B("\\frac{41}{12}"), "\\frac{41}{13}", "km"),
]
# must be graded CORRECT (kind math)
MATH_EQUIVALENT = [
    (B("\\frac{1}{2}"), "0.5", None), (B("0.5"), "\\frac12", None), (B("\\dfrac{14}{3}"), "\\frac{14}{3}", None),
    (B("2\\sqrt{2}"), "\\sqrt{8}", None), (B("\\sqrt{2}/2"), "\\frac{\\sqrt2}{2}", None),
    (B("(3, \\frac{\\pi}{2})"), "\\left( 3, \\frac{\\pi}{2} \\right)", None), (B("-2, 1"), "1,-2", None),
    (B("7, 5, 3"), "3, 5, 7", None), (B("[\\tfrac12, 8]"), "[\\frac{1}{2}, 8]", None), (B("x = 5"), "5", None),
    (B("5"), "x=5", None), (B("\\frac{600}{7}\\text{ km/h}"), "$\\frac{600}{7}$", "km/h"), (B("4.2\\%"), "4.2", "%"),
    (B("90"), "90^\\circ", None), (B("90^{\\circ}"), "90^\\circ", None), (B("\\text{Evelyn}"), "\\text{Evelyn}", None), (B("70"), 70.0, None),
    (B("\\frac{n(n+1)}{4}"), "\\frac{1}{4} n(n+1)", None), (B("\\begin{pmatrix}1\\\\2\\end{pmatrix}"), "\\begin{pmatrix}1\\\\2\\end{pmatrix}", None),
    (B("(-3,2),(3,2),(3,-2),(-3,-2)"), "$(3,2),(-3,2),(3,-2),(-3,-2)$", None), (B("6-5i"), "6 - 5i", None),
    (B("\\$18.90"), "\\$18.90", None), (B("32348"), "\\$32,\\!348", None), (B("\\frac{\\sqrt{3}}{2}"), "\\frac{\\sqrt3}2", None),
    ("so \\boxed 5.", "5", None), ("\\fbox{5}", "5", None), ("The answer is $\\frac{1}{2}$.", "0.5", None),
    (B("[-1, -\\frac12]"), "$[-1,-\\frac{1}{2}]$", None), (B("(-\\infty,0)\\cup\\{1\\}"), ["$(-\\infty, 0) \\cup\\{1\\}$."], None),
    (B("2 - \\sqrt 3"), "2-\\sqrt{3}", None), (B("\\pi^2 \\cdot 4 - 1"), "4 \\pi^{2}-1", None), (B("1.25"), "\\frac54", None),
    (B("\\frac{a b}{2}"), "$\\frac{a b}{2}$", None), (B("3.0"), "3", None), (B("45 \\text{ minutes}"), "45", "minute"),
    (B("p-q"), "p - q", None), (B("\\{3, 5, 7\\}"), "3, 5, 7", None), (B("\\sqrt[3]{8}"), "2", None),
]
GSM8K_NEAR_MISSES = [
    ("#### 19", "18"), ("#### -18", "18"), ("The answer is 1,081", "1,080"), ("#### 18.5", "18"), ("She pays $18.01.", "18"),
    ("A: 180", "18"), ("She has 18 apples, so 20 in total.", "18"), ("#### 1.8", "18"), ("#### 0.18", "18"),
    ("I cannot solve it.", "18"), ("The answer is 18. #### 17", "18"), ("\\boxed{17}", "18"), ("#### 10800", "1,080"),
]
GSM8K_EQUIVALENT = [
    ("#### 1,080", "1080"), ("So she made $1,080.", "1,080"), ("A: 18", "18"), ("She makes 18 dollars a day.", "18"),
    ("The answer is \\boxed{18}.", "18"), ("16 - 3 - 4 = 9 eggs, 9 * 2 = 18", "18"), ("#### $18.00", "18"),
    ("The final answer is: 18 dollars.", "18"), ("#### -5", "-5"), ("Janet earns \\$18.", "18"),
    ("x = 3\n#### 18\n", "Janet sells 9 eggs.\n#### 18"), ("The answer is 0.5", ".5"),
]

# ------------------------------------------------------------------ answer formats, math kind (issue 16)
MATH_FORMATS: dict[str, list[tuple[str, object, str | None, bool]]] = {
    "minerva_sentence": [  # the Minerva few-shot answer line (Qwen3-4B-Base and friends)
        ("Final Answer: The final answer is 12,000,023. I hope it is correct.", "12000023", None, True),
        ("Final Answer: The final answer is $120$. I hope it is correct.", "120", None, True),
        ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "0.75", None, True),
        ("Final Answer: The final answer is $x^2+1$. I hope it is correct.", "x^{2} + 1", None, True),
        ("Final Answer: The final answer is 12,000,024. I hope it is correct.", "12000023", None, False),
    ],
    "answer_sentence": [  # "the answer is ...", "Answer: ..." without a box
        ("The final answer is 7.78.", "7.78", None, True),
        ("So the answer is 2/3.", "\\frac{2}{3}", None, True),
        ("Answer: 42", "42", None, True),
        ("The answer is: **18**.", "18", None, True),
        ("The answer is $\\sqrt{2}$, which is irrational.", "\\sqrt2", None, True),
        ("The answer is 7.79.", "7.78", None, False),
        ("So the answer is 3/2.", "\\frac{2}{3}", None, False),
        ("Final Answer: The largest $n$ is 34.", "34", None, True),  # a named quantity, then its value
        ("The answer is $x = 5$.", "5", None, True),
        ("Final Answer: The largest $n$ is 34, not 35.", "35", None, False),
        ("Final Answer: The largest $n$ is 34.", "35", None, False),
    ],
    "trailing_period": [  # a decimal that ends the sentence
        ("The final answer is 0.5.", "\\frac12", None, True),
        ("\\boxed{7.78.}", "7.78", None, True),
        ("The answer is 3.5.", "3.4", None, False),
    ],
    "several_boxes": [  # each answer of a multiple-answer problem in its own box
        ("\\boxed{(1, 2)}, \\boxed{(2, 1)}", ["(1,2)", "(2,1)"], None, True),
        ("\\boxed{(2, 1)} and \\boxed{(1, 2)}", "$(1,2),(2,1)$", None, True),
        ("x = \\boxed{1} or x = \\boxed{-2}", "1,-2", None, True),
        ("$\\boxed{84}$, $\\boxed{69}$", ["$69$,$84$"], None, True),
        ("First \\boxed{7}.\n\nSo the solutions are \\boxed{3} and \\boxed{5}.", "3, 5", None, True),
        ("\\boxed{1},\\boxed{2},\\boxed{3}", "\\{1,2,3\\}", None, True),
        ("\\boxed{1}, \\boxed{2}, and \\boxed{3}", "1, 2, 3", None, True),
        ("\\boxed{3}, \\boxed{1}, \\boxed{2}", "\\{1,2,3\\}", None, True),
        ("\\boxed{1},\\boxed{2},\\boxed{4}", "\\{1,2,3\\}", None, False),
        ("\\boxed{1},\\boxed{2}", "\\{1,2,3\\}", None, False),
        ("\\boxed{(1, 2)}", ["(1,2)", "(2,1)"], None, False),
        ("\\boxed{(1, 2)}, \\boxed{(2, 1)}, \\boxed{(3, 3)}", ["(1,2)", "(2,1)"], None, False),
        ("\\boxed{(1, 2)}, \\boxed{(1, 2)}", ["(1,2)", "(2,1)"], None, False),
    ],
    "thousands": [  # a comma is a thousands separator only in its valid shape, never with a space
        ("\\boxed{32, 349}", "32349", None, False),
        ("\\boxed{32,349}", "32349", None, True),
        ("The final answer is 12,000,023.", "12000023", None, True),
        ("\\boxed{10,\\!080}", "10080", None, True),
        ("\\boxed{(2, 251, 252)}", "(2,251,252)", None, True),
        ("\\boxed{1,2345}", "12345", None, False),
    ],
    "percent_words": [
        ("The answer is 28 percent.", "28\\%", None, True),
        ("\\boxed{28 pct}", "28\\%", None, True),
        ("\\boxed{28 per cent}", "28\\%", None, True),
        ("\\boxed{28\\%}", "28\\%", None, True),
        ("\\boxed{29 percent}", "28\\%", None, False),
        ("28 percent", "28\\%", None, True),  # a bare answer, no box or sentence
        ("28 pct", "28\\%", None, True),
        ("28 %", "28\\%", None, True),
        ("28 percent", "28", None, True),  # as \\boxed{28\\%} against 28
        ("29 percent", "28", None, False),
    ],
    "fraction_slash": [
        ("\\boxed{2/3}", "\\frac{2}{3}", None, True),
        ("The answer is -5/4.", "-\\frac54", None, True),
        ("\\boxed{3/2}", "\\frac{2}{3}", None, False),
    ],
    "mixed_numbers": [
        ("\\boxed{1 1/2}", "\\frac{3}{2}", None, True),
        ("The answer is 2 1/4.", "\\frac{9}{4}", None, True),
        ("\\boxed{1\\frac{1}{2}}", "1.5", None, True),
        ("\\boxed{1 1/2}", "\\frac{11}{2}", None, False),
        ("\\boxed{3 1/2}", "3", None, False),
    ],
    "scientific": [
        ("\\boxed{1e9}", "10^9", None, True),
        ("The answer is $3 \\times 10^{5}$.", "300000", None, True),
        ("\\boxed{2e3}", "200", None, False),
    ],
    "sets_tuples": [  # sets in any order, tuples in their order, "12, 345" a list and not 12345
        ("\\boxed{12, 345}", "\\{12, 345\\}", None, True),
        ("\\boxed{12, 345}", "345, 12", None, True),
        ("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}", None, True),
        ("The answers are $x=1$ and $x=-2$.", "1,-2", None, True),
        ("\\boxed{(2, 1)}", "(1, 2)", None, False),
        ("The answers are $x=1$ and $x=2$.", "1,-2", None, False),
        ("x = -5, p = 14/3", "-5, 14/3", None, True),  # labels stripped per element
        ("\\boxed{x = -5, p = 14/3}", "-5, \\frac{14}{3}", None, True),
        ("\\boxed{x = -5, p = 13/3}", "-5, 14/3", None, False),
        ("2 or 3", "2, 3", None, True),  # alternatives: an unordered set of solutions
        ("The answer is 2 or 3.", "\\{2,3\\}", None, True),
        ("The answer is x = 2 or x = 3.", "2, 3", None, True),
        ("\\boxed{3 or 2}", "\\{2,3\\}", None, True),
        ("The answer is 2 or 4.", "2, 3", None, False),
        ("The answer is 2 or 3.", "2", None, False),
    ],
    "precedence": [  # the statement that starts last wins; a correction counts, a remark does not
        ("\\boxed{5}. Wait, that is wrong: the answer is 6.", "6", None, True),
        ("\\boxed{5}. Wait, that is wrong: the answer is 6.", "5", None, False),
        ("The answer is 5. Actually, the answer is 6.", "6", None, True),
        ("The answer is 6. Let me double-check: yes. \\boxed{6}", "6", None, True),
        ("\\boxed{6}. So our answer is correct.", "6", None, True),
        ("\\boxed{6}. But what if the answer is 5? It is not.", "6", None, True),
        ("\\boxed{6}. If the answer were 5, then x = 3, a contradiction.", "6", None, True),
        ("The final answer is $\\boxed{6}$. I hope it is correct.", "6", None, True),
        (B("5") + " wait, that is wrong: " + B("6"), "5", None, False),
    ],
}

# ------------------------------------------------------------------ number forms, gsm8k kind (issue 12.12)
GSM8K_FORMATS: dict[str, list[tuple[str, str, None, bool]]] = {
    "fractions": [
        ("#### 2/3", "2", None, False), ("#### 10/2", "5", None, True), ("#### \\frac{3}{2}", "3", None, False),
    ],
    "mixed_numbers": [
        ("#### 1 1/2", "1", None, False), ("#### 2 1/2", "2.5", None, True),
        ("He walks 3 1/2 miles.", "2", None, False), ("He walks 3 1/2 miles.", "3.5", None, True),
    ],
    "scientific": [
        ("#### 3 x 10^5", "3", None, False), ("#### 1e9", "1000000000", None, True),
        ("#### 3 \\times 10^{5}", "300000", None, True), ("#### 2.5E3", "2500", None, True),
    ],
    "bases": [
        ("#### 1010_2", "1010", None, False), ("#### 1010_2", "10", None, True), ("#### 0x1F", "31", None, True),
        ("#### 129_2", "129", None, False),
    ],
    "times": [
        ("#### 12:30", "12", None, False), ("The train leaves at 3:45.", "45", None, False),
        ("#### 4:1", "4", None, False),
    ],
    "malformed": [
        ("#### 1.2.3", "1.2", None, False), ("#### 1,00", "1", None, False), ("#### 12,34", "12", None, False),
        ("#### 1 000", "1", None, False),
    ],
    "thousands": [
        ("#### 1,2345", "1", None, False), ("#### 1,2345", "12345", None, False), ("#### 12,345,67", "12", None, False),
        ("#### 1,234,567", "1234567", None, True), ("#### \\$1{,}200", "1200", None, True),
    ],
    "lists": [
        ("#### 12, 13", "12", None, False), ("#### 12 or 13", "12", None, False),
        ("The answer is: -4 apples; 7 left", "-4", None, True),
    ],
    "expressions": [
        ("The answer is 20 - 2 = 18.", "18", None, True), ("The answer is 20 - 2 = 18.", "20", None, False),
        ("#### 5 + 3", "5", None, False), ("#### 4 * 3 = 12", "12", None, True),
    ],
    "units_currency": [
        ("#### $2.5 million", "2500000", None, True), ("#### €18", "18", None, True),
        ("Janet earns \\$18.50 per day.", "18.5", None, True), ("#### 18 dollars", "18", None, True),
        ("#### 5 km/h", "5", None, True),
    ],
    "negative": [
        ("#### −5", "-5", None, True), ("#### −5", "5", None, False), ("#### -$5", "-5", None, True),
    ],
    "trailing_period": [
        ("#### 18.", "18", None, True), ("The answer is 2.5.", "2.5", None, True),
        ("The answer is 1,080.", "1080", None, True), ("#### 18.5.", "18", None, False),
    ],
    "percent": [  # "%" is a unit: the value is the number of percent, as GSM8K references write it
        ("#### 25%", "25", None, True), ("#### 12.5 %", "12.5", None, True), ("#### 25 percent", "25", None, True),
        ("#### 25%", "0.25", None, False),
    ],
}


def labelled_sets() -> dict[str, tuple[str, list[tuple[str, object, str | None, bool]]]]:
    """Every hand-labelled set: ``{name: (kind, [(response, reference, unit, correct), ...])}``."""
    return {
        "math_near_misses": ("math", [(r, g, u, False) for r, g, u in MATH_NEAR_MISSES]),
        "math_equivalent": ("math", [(r, g, u, True) for r, g, u in MATH_EQUIVALENT]),
        "math_formats": ("math", [c for cases in MATH_FORMATS.values() for c in cases]),
        "gsm8k_near_misses": ("gsm8k", [(r, g, None, False) for r, g in GSM8K_NEAR_MISSES]),
        "gsm8k_equivalent": ("gsm8k", [(r, g, None, True) for r, g in GSM8K_EQUIVALENT]),
        "gsm8k_formats": ("gsm8k", [c for cases in GSM8K_FORMATS.values() for c in cases]),
    }
