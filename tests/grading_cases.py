"""Hand-made grading cases: near misses that must be graded wrong, equivalent forms that must be right."""


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
