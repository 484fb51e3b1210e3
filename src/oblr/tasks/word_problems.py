"""Built-in task ``word_problems``: templated 2-3 step word problems answered in GSM8K's format.

An example::

    prompt   "Q: Mia has 4 boxes of 6 pens, gives 5 away. How many left?\\nA:"
    solution " 4*6=24 24-5=19 #### 19"        (meta["solution"], the SFT target)
    answer   "4*6=24\\n24-5=19\\n#### 19"       (the reference, as GSM8K's answer field writes it)

Each template (:data:`TEMPLATES`) fills names, items and small integers, and is solved by 2 or 3 integer
steps (every intermediate value a non-negative integer of at most :data:`MAX_VALUE`). The reward is the
GSM8K grader's verdict (:func:`oblr.grading.grade` with ``kind="gsm8k"``, exactly what ``oblr eval`` uses
for GSM8K: the final ``####`` answer, read as a value): this is a :class:`oblr.tasks.math.MathTask` of kind
``gsm8k``. Train and eval sets are deterministic in ``seed`` and disjoint (no prompt in both); the eval
set is drawn first from its own stream. The prompt is the short base-model form ``"Q: <question>\\nA:"``
(the built-in model reads characters; the long GSM8K instruction would triple its length).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Annotated

from oblr.config import Range
from oblr.tasks.base import Example, draw_distinct, register_task
from oblr.tasks.math import MathTask

MAX_VALUE = 200
#: the longest solution text (``meta["solution"]``, characters = tokens of the built-in model): the default
#: ``rollout.max_new_tokens`` (32), so that no correct solution is cut off by the default generation limit
MAX_SOLUTION_CHARS = 32
MAX_EXAMPLES = 1_000_000
NAMES = [("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Ben", "He"), ("Zoe", "She"), ("Sam", "He"),
         ("Eva", "She"), ("Leo", "He")]
ITEMS = ["apples", "pens", "cards", "books", "eggs", "coins", "shells", "cups"]

Step = tuple[int, str, int]  # (x, op, y)


def _t_buy_give(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    a, b = r.randint(2, 30), r.randint(2, 30)
    c = r.randint(1, a + b)
    return (f"{name} has {a} {item}, buys {b}, gives {c} away. How many now?",
            [(a, "+", b), (a + b, "-", c)])


def _t_boxes(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.randint(1, a * b)
    return (f"{name} has {a} boxes of {b} {item}, gives {c} away. How many left?",
            [(a, "*", b), (a * b, "-", c)])


def _t_times(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    other = r.choice([n for n, _ in NAMES if n != name])
    a, b = r.randint(2, 20), r.randint(2, 5)
    return (f"{name} has {a} {item}, {other} {b} times as many. How many in all?",
            [(a, "*", b), (a, "+", a * b)])


def _t_change(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.choice([x for x in (20, 50, 100) if x >= a * b])
    return (f"{name} buys {b} {item} at ${a} each, pays ${c}. What change?", [(a, "*", b), (c, "-", a * b)])


def _t_share(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    d = r.randint(2, 6)
    each = r.randint(2, 9)
    total = d * each
    b = r.randint(1, total - 1)
    a = total - b
    return (f"{name} has {a} {item}, finds {b}, shares among {d}. How many each?", [(a, "+", b), (total, "/", d)])


def _t_three(r: random.Random, name, pron, item) -> tuple[str, list[Step]]:
    a, b = r.randint(2, 6), r.randint(2, 9)
    c = r.randint(1, 20)
    d = r.randint(1, a * b + c)
    return (f"{name} has {a} bags of {b} {item}, buys {c}, loses {d}. How many now?",
            [(a, "*", b), (a * b, "+", c), (a * b + c, "-", d)])


#: the question templates: ``f(rng, name, pronoun, item) -> (question, steps)``
TEMPLATES: list[Callable[..., tuple[str, list[Step]]]] = [_t_buy_give, _t_boxes, _t_times, _t_change, _t_share,
                                                           _t_three]


def _apply(x: int, op: str, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y if op == "*" else x // y


def format_prompt(question: str) -> str:
    return f"Q: {question}\nA:"


def sample_problem(rng: random.Random) -> tuple[str, list[str], int]:
    """``(question, steps ["x op y=z", ...], answer)`` from a random template (rejection keeps every value
    in ``[0, MAX_VALUE]``, every division exact and the solution text at most :data:`MAX_SOLUTION_CHARS`)."""
    while True:
        name, pron = rng.choice(NAMES)
        question, steps = rng.choice(TEMPLATES)(rng, name, pron, rng.choice(ITEMS))
        texts, ok, z = [], True, 0
        for x, op, y in steps:
            if op == "/" and x % y:
                ok = False
                break
            z = _apply(x, op, y)
            if not 0 <= z <= MAX_VALUE:
                ok = False
                break
            texts.append(f"{x}{op}{y}={z}")
        if ok and len(solution_text(texts, z)) <= MAX_SOLUTION_CHARS:
            return question, texts, z


def solution_text(steps: list[str], answer: int) -> str:
    """The SFT target: ``" 4*6=24 24-5=19 #### 19"``."""
    return " " + " ".join(steps) + f" #### {answer}"


def make_example(question: str, steps: list[str], answer: int) -> Example:
    return Example(prompt=format_prompt(question), answer="\n".join(steps) + f"\n#### {answer}",
                   meta={"question": question, "solution": solution_text(steps, answer),
                         "steps": steps, "value": answer, "kind": "gsm8k", "benchmark": "word_problems",
                         "unit": None})


def _draw(rng: random.Random, n: int, exclude: set[str], what: str) -> list[Example]:
    drawn = draw_distinct(n, exclude, lambda: sample_problem(rng), key=lambda d: d[0],
                          too_few=lambda got: f"word_problems task: could only draw {got} distinct {what} problems of "
                                              f"the {n} asked for; lower n_{what}")
    return [make_example(question, steps, answer) for question, steps, answer in drawn]


@register_task("word_problems")
def word_problems_task(*, seed: int = 0, n_train: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 20000,
                       n_eval: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 500) -> MathTask:
    """Build the word-problem task: a GSM8K-graded :class:`MathTask` over generated problems."""
    eval_set = _draw(random.Random(f"oblr-words-eval-{seed}"), n_eval, set(), "eval")
    train_set = _draw(random.Random(f"oblr-words-train-{seed}"), n_train,
                      {ex.meta["question"] for ex in eval_set}, "train")
    return MathTask("word_problems", train_set, eval_set, kind="gsm8k")
