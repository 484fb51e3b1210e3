"""Built-in task ``countdown``: reach a target with the given numbers, + - * / and parentheses.

An example (defaults: 3 numbers in 1..12, targets up to 99)::

    prompt   "Q: 3 5 7 = 22\\nA:"
    solution " 3*5+7"                         (meta["solution"], the SFT target: the expression it was made from)
    answer   "22"

Rules (what :func:`check_expression` accepts): an expression over non-negative integer literals, the binary
operators ``+ - * /`` and parentheses, spaces allowed. Each given number may be used **at most once**
(a multiset: a number given twice may be used twice); not every number has to be used. Arithmetic is
exact (:class:`fractions.Fraction`, so ``7/2*2`` is 7). Reward 1.0 iff the expression is valid and its
value equals the target, else 0.0. Refused (reward 0, never an exception): names or any other character
(``**``, ``^``, ``x``, ``.``, non-ASCII digits such as ``"٣"``), unary signs (``-3``, ``+3``), a literal with a
leading zero or not among the given numbers (or used more often than given), division by zero, more than
:data:`MAX_CHARS` characters, parentheses nested deeper than :data:`MAX_DEPTH`, a literal of more than
:data:`MAX_DIGITS` digits, an intermediate value whose numerator or denominator exceeds :data:`MAX_ABS`.
The parser is a small tokenizer plus recursive descent; nothing is ``eval``'d, and length and depth bounds
keep every check short.

Answer extraction (:func:`extract_expression`): the text after the last ``####`` when the response has
one, else the last non-empty line of the response (the prompt ends with ``A:``, so a bare expression is
the whole answer). Instances are generated solvable: the target is the value of a random expression over
the numbers (every intermediate value a positive integer, at least two numbers used, the target not itself
one of the numbers), so ``meta["solution"]`` always scores 1. Train and eval sets are deterministic in
``seed`` and disjoint (no (numbers, target) pair in both); the eval set is drawn first from its own stream.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction
from typing import Annotated

from oblr.config import Range
from oblr.tasks.base import Example, Task, draw_distinct, register_task

MAX_CHARS = 200  # longest expression considered
MAX_DEPTH = 16  # deepest parenthesis nesting
MAX_DIGITS = 6  # longest integer literal
MAX_ABS = 10**12  # bound on |numerator| and denominator of every intermediate value
MAX_EXAMPLES = 1_000_000
_OPS = "+-*/"


class Refused(ValueError):
    """Why an expression is not valid (internal: :func:`check_expression` turns it into a result)."""


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == " ":
            i += 1
        elif c in "0123456789":  # ASCII digits only: str.isdigit would accept other scripts' digits
            j = i
            while j < n and text[j] in "0123456789":
                j += 1
            lit = text[i:j]
            if j - i > MAX_DIGITS:
                raise Refused(f"number of more than {MAX_DIGITS} digits at {i}")
            if len(lit) > 1 and lit[0] == "0":
                raise Refused(f"number with a leading zero at {i}")
            out.append(lit)
            i = j
        elif c in _OPS or c in "()":
            out.append(c)
            i += 1
        else:
            raise Refused(f"character {c!r} at {i} is not allowed")
    return out


class _Parser:
    """Recursive descent: ``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/') factor)*``,
    ``factor := NUMBER | '(' expr ')'``. Each literal is taken from the multiset ``available``."""

    def __init__(self, tokens: list[str], available: Counter):
        self.toks, self.pos, self.depth, self.available = tokens, 0, 0, available

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = _bounded(value + self.term() if op == "+" else value - self.term())
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            other = self.factor()
            if op == "/":
                if other == 0:
                    raise Refused("division by zero")
                value = _bounded(value / other)
            else:
                value = _bounded(value * other)
        return value

    def factor(self) -> Fraction:
        tok = self.peek()
        if tok is None:
            raise Refused("expression ends early")
        if tok == "(":
            self.take()
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Refused(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr()
            if self.peek() != ")":
                raise Refused("unbalanced parenthesis")
            self.take()
            self.depth -= 1
            return value
        if tok.isdigit():
            self.take()
            n = int(tok)
            if self.available[n] <= 0:
                raise Refused(f"{n} is not among the given numbers (or is used more often than given)")
            self.available[n] -= 1
            return Fraction(n)
        raise Refused(f"unexpected {tok!r}" + (" (unary signs are not allowed)" if tok in "+-" else ""))


def _bounded(x: Fraction) -> Fraction:
    if abs(x.numerator) > MAX_ABS or x.denominator > MAX_ABS:
        raise Refused(f"intermediate value beyond {MAX_ABS}")
    return x


def evaluate_expression(text: object, numbers: list[int]) -> Fraction:
    """The exact value of ``text`` under the rules above, or :class:`Refused` saying why not."""
    if not isinstance(text, str):
        raise Refused(f"expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise Refused(f"expression longer than {MAX_CHARS} characters")
    tokens = _tokens(text)
    if not tokens:
        raise Refused("empty expression")
    parser = _Parser(tokens, Counter(int(n) for n in numbers))
    value = parser.expr()
    if parser.pos != len(tokens):
        raise Refused(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return value


def check_expression(text: object, numbers: list[int], target: int) -> tuple[bool, str]:
    """``(correct, why)``: correct when ``text`` is a valid expression over ``numbers`` equal to ``target``;
    ``why`` is ``"ok"``, ``"wrong value <v>"`` or the reason it was refused. Never raises."""
    try:
        value = evaluate_expression(text, numbers)
    except Refused as e:
        return False, str(e)
    except RecursionError:  # pragma: no cover - MAX_DEPTH and MAX_CHARS keep recursion far below the limit
        return False, "too deep"
    return (True, "ok") if value == target else (False, f"wrong value {value}")


def extract_expression(response: object) -> str | None:
    """The answer part of ``response``: after the last ``####`` if any, else its last non-empty line; None
    when there is none (or ``response`` is not a string)."""
    if not isinstance(response, str):
        return None
    idx = response.rfind("####")
    text = response[idx + 4:] if idx >= 0 else response
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def format_prompt(numbers: list[int], target: int) -> str:
    return f"Q: {' '.join(map(str, numbers))} = {target}\nA:"


def _combine(rng: random.Random, items: list[tuple[str, int, int]]) -> tuple[str, int] | None:
    """Join the (text, value, precedence) items by random binary operations into one expression; None when
    a step would leave the positive integers."""
    items = list(items)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (ta, va, pa), (tb, vb, pb) = items[i], items[j]
        op = rng.choice(_OPS)
        if op == "+":
            v, prec = va + vb, 1
        elif op == "-":
            v, prec = va - vb, 1
        elif op == "*":
            v, prec = va * vb, 2
        else:
            if vb == 0 or va % vb:
                return None
            v, prec = va // vb, 2
        if v <= 0:
            return None
        left = ta if pa >= prec else f"({ta})"
        # a right operand of - or / (and any lower-precedence one) needs parentheses unless it is atomic
        right = tb if (pb > prec or (pb == prec and op in "+*")) else f"({tb})"
        items = [it for k, it in enumerate(items) if k not in (i, j)] + [(f"{left}{op}{right}", v, prec)]
    return items[0][0], items[0][1]


def sample_instance(rng: random.Random, n_numbers: int, max_number: int, max_target: int) -> tuple[list[int], int, str]:
    """``(numbers, target, expression)``: ``n_numbers`` numbers in ``[1, max_number]``, and a target in
    ``[1, max_target]`` made by an expression over 2..n of them (not one of the numbers itself)."""
    for _ in range(100_000):
        numbers = [rng.randint(1, max_number) for _ in range(n_numbers)]
        k = rng.randint(2, n_numbers)
        used = rng.sample(numbers, k)
        made = _combine(rng, [(str(x), x, 3) for x in used])
        if made is None:
            continue
        expr, target = made
        if target > max_target or target in numbers:
            continue
        return numbers, target, expr
    raise ValueError(f"countdown task: no instance with {n_numbers} numbers in [1, {max_number}] and a target "
                     f"in [1, {max_target}] found in 100000 tries; raise max_number or max_target")


def make_example(numbers: list[int], target: int, expr: str) -> Example:
    return Example(prompt=format_prompt(numbers, target), answer=str(target),
                   meta={"numbers": list(numbers), "target": target, "solution": f" {expr}", "expression": expr})


def _draw(rng: random.Random, n: int, exclude: set, what: str, n_numbers: int, max_number: int,
          max_target: int) -> list[Example]:
    drawn = draw_distinct(n, exclude, lambda: sample_instance(rng, n_numbers, max_number, max_target),
                          key=lambda d: (tuple(d[0]), d[1]),
                          too_few=lambda got: f"countdown task: could only draw {got} distinct {what} instances of the "
                                              f"{n} asked for; lower n_{what} or raise max_number / max_target")
    return [make_example(numbers, target, expr) for numbers, target, expr in drawn]


class CountdownTask(Task):
    """Generated countdown instances; reward 1.0 iff the extracted expression is valid and hits the target."""

    name = "countdown"

    def reward(self, response: str, example: Example) -> float:
        expr = extract_expression(response)
        if expr is None:
            return 0.0
        ok, _ = check_expression(expr, example.meta["numbers"], example.meta["target"])
        return 1.0 if ok else 0.0

    def extract_answer(self, response: str) -> str | None:
        """The extracted expression (``oblr eval``'s majority vote counts identical expressions)."""
        return extract_expression(response)


@register_task("countdown")
def countdown_task(*, seed: int = 0, n_train: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 10000,
                   n_eval: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 500,
                   n_numbers: Annotated[int, Range(ge=2, le=6)] = 3,
                   max_number: Annotated[int, Range(ge=2, le=1000)] = 12,
                   max_target: Annotated[int, Range(ge=1, le=100000)] = 99) -> CountdownTask:
    """Build the countdown task (options checked with the config before anything is built)."""
    eval_set = _draw(random.Random(f"oblr-countdown-eval-{seed}"), n_eval, set(), "eval", n_numbers, max_number,
                     max_target)
    keys = {(tuple(ex.meta["numbers"]), ex.meta["target"]) for ex in eval_set}
    train_set = _draw(random.Random(f"oblr-countdown-train-{seed}"), n_train, keys, "train", n_numbers,
                      max_number, max_target)
    return CountdownTask(train_set, eval_set)
