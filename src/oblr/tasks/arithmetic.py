"""Built-in task: multi-step integer arithmetic with a worked solution and an exact-match reward.

An example (``difficulty="easy"``)::

    prompt   "Q: (17+5)*3-8\\nA:"
    solution " 17+5=22 22*3=66 66-8=58 #### 58"      (meta["solution"], the SFT target)
    answer   "58"

Expressions are left-deep chains ``((a op b) op c) op d`` where, with probability 1/2, a new operand is put
on the left instead (``c*(a+b)``); parentheses are written only where precedence needs them (a compound
right operand is always parenthesised). The solution writes one ``x op y=z`` step per operator in
evaluation order, then ``#### <answer>``. All intermediate values are integers in ``[0, max_value]``;
multiplication uses a single-digit factor ``2..9`` on one side, so numbers stay short.

The format is designed for a character-level tokenizer (see :mod:`oblr.models`): every character is one
token except ``"Q:"``, ``"A:"`` and ``"####"``.

Train and eval sets are deterministic functions of ``seed`` and disjoint (no expression string is in
both). The eval set is drawn first from its own random stream, so it does not change with ``n_train``.

Prompt styles (option ``style``; not ``template``, whose values -- auto, base, chat, raw -- are the
benchmark tasks' and ``oblr eval --template``'s):

- ``"qa"`` (default): the format above, for the built-in model; reward 1.0 iff the final ``#### <int>``
  equals the answer.
- ``"chat"``: for an instruction-tuned model: one user turn :data:`CHAT_QUESTION` (``"What is (17+5)*3-8?
  Answer with the number only."``) rendered by the tokenizer's chat template
  (:func:`oblr.tasks.templates.chat_prompt`; the trainer passes the model's tokenizer). Such a model
  answers in free form (``"17 + 5 = 22, ... = 58"``), so the reward is the GSM8K grader's verdict
  (:func:`oblr.grading.grade`, ``kind="gsm8k"``: the last answer statement, else the last number, read
  as a value), the one ``oblr eval`` uses for GSM8K.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from oblr.checks import Range
from oblr.tasks.base import Example, Task, draw_distinct, register_task

_PREC = {"+": 1, "-": 1, "*": 2}

#: presets: (min_ops, max_ops, max_operand, max_value)
MAX_EXAMPLES = 10_000_000  # n_train / n_eval: beyond this, generating the set takes minutes and GBs
DIFFICULTIES: dict[str, tuple[int, int, int, int]] = {
    "easy": (2, 2, 20, 200),
    "medium": (2, 3, 50, 999),
    "hard": (3, 4, 99, 9999),
}

# the last "####", then an optionally signed integer, then nothing but whitespace
_FINAL_RE = re.compile(r"####[ \t]*([+-]?[0-9]{1,30})\s*\Z")
_MAX_RESPONSE_CHARS = 100_000


def parse_final_answer(response: object) -> int | None:
    """The integer after the last ``####`` of ``response``, or None when there is none.

    The text after the last ``####`` must be one integer (optional sign, at most 30 digits) and nothing
    but whitespace; anything else (no marker, ``#### 12.5``, ``#### 12 apples``, non-string input)
    gives None. Never raises.
    """
    if not isinstance(response, str):
        return None
    idx = response.rfind("####")
    if idx < 0:
        return None
    tail = response[idx:]
    if len(tail) > _MAX_RESPONSE_CHARS:
        return None
    m = _FINAL_RE.match(tail)
    if m is None:
        return None
    return int(m.group(1))


@dataclass(frozen=True)
class ArithmeticConfig:
    """Shape of the generated expressions.

    ``min_ops..max_ops`` operators per expression; additive operands in ``[1, max_operand]``; a
    multiplication factor in ``[2, min(9, max_operand)]``; every intermediate value in ``[0, max_value]``.
    ``ops`` is the set of operators used (a subset of ``"+-*"``).
    """

    min_ops: int
    max_ops: int
    max_operand: int
    max_value: int
    ops: str = "+-*"

    def validate(self) -> None:
        if not (1 <= self.min_ops <= self.max_ops <= 12):
            raise ValueError(f"arithmetic task: need 1 <= min_ops <= max_ops <= 12, got "
                             f"min_ops={self.min_ops}, max_ops={self.max_ops}")
        if self.max_operand < 2:
            raise ValueError(f"arithmetic task: max_operand must be >= 2, got {self.max_operand}")
        if self.max_value < self.max_operand:
            raise ValueError(f"arithmetic task: max_value ({self.max_value}) must be >= max_operand "
                             f"({self.max_operand})")
        if not self.ops or any(o not in _PREC for o in self.ops) or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"arithmetic task: ops must be distinct characters from '+-*', got {self.ops!r}")


def _wrap(text: str, op: str | None, parent: str, right: bool) -> str:
    """Parenthesise a sub-expression whose top operator is ``op`` under ``parent`` where needed."""
    if op is None:
        return text
    if right or _PREC[op] < _PREC[parent]:
        return f"({text})"
    return text


def _apply(op: str, x: int, y: int) -> int:
    return x + y if op == "+" else x - y if op == "-" else x * y


def sample_expression(rng: random.Random, cfg: ArithmeticConfig) -> tuple[str, int, list[tuple[str, int, bool]]]:
    """One expression: (text, first operand, chain). ``chain[i] = (op, other, on_left)`` applies ``op``
    between the running value and ``other``, with ``other`` on the left when ``on_left``."""
    n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
    while True:  # rejection sampling of the whole chain keeps the distribution simple
        start = value = rng.randint(1, cfg.max_operand)
        text, top = str(value), None
        chain: list[tuple[str, int, bool]] = []
        ok = True
        for _ in range(n_ops):
            op = rng.choice(cfg.ops)
            if op == "*":
                other = rng.randint(2, min(9, cfg.max_operand))
            else:
                other = rng.randint(1, cfg.max_operand)
            on_left = rng.random() < 0.5
            if on_left:
                new_text = f"{other}{op}{_wrap(text, top, op, right=True)}"
                z = _apply(op, other, value)
            else:
                new_text = f"{_wrap(text, top, op, right=False)}{op}{other}"
                z = _apply(op, value, other)
            if not (0 <= z <= cfg.max_value):
                ok = False
                break
            chain.append((op, other, on_left))
            value, text, top = z, new_text, op
        if ok:
            return text, start, chain


def solve_chain(start: int, chain: list[tuple[str, int, bool]],
                corrupt: Callable[[int], int] | None = None) -> tuple[list[str], int]:
    """Steps ``["x op y=z", ...]`` and the final value. ``corrupt`` (optional) maps each true step result
    to the value written (and carried into the next step), to make noisy demonstrations."""
    value, steps = start, []
    for op, other, on_left in chain:
        x, y = (other, value) if on_left else (value, other)
        z = _apply(op, x, y)
        if corrupt is not None:
            z = corrupt(z)
        steps.append(f"{x}{op}{y}={z}")
        value = z
    return steps, value


#: the user turn of the ``chat`` template
CHAT_QUESTION = "What is {expression}? Answer with the number only."


def format_prompt(expression: str) -> str:
    return f"Q: {expression}\nA:"


def chat_example(example: Example, tokenizer: Any) -> Example:
    """``example`` with its prompt in the ``chat`` template (same answer and meta)."""
    from oblr.tasks.templates import chat_prompt

    text = chat_prompt(CHAT_QUESTION.format(expression=example.meta["expression"]), tokenizer=tokenizer)
    return Example(prompt=text, answer=example.answer, meta=example.meta)


def format_solution(steps: list[str], answer: int) -> str:
    return " " + " ".join(steps) + f" #### {answer}"


def make_example(expression: str, start: int, chain: list[tuple[str, int, bool]]) -> Example:
    steps, value = solve_chain(start, chain)
    return Example(prompt=format_prompt(expression), answer=str(value),
                   meta={"solution": format_solution(steps, value), "expression": expression,
                         "n_ops": len(chain), "start": start, "chain": [list(c) for c in chain]})


def noisy_solution(example: Example, rng: random.Random, digit_noise: float) -> str:
    """The solution of ``example`` with each digit of each step result replaced, with probability
    ``digit_noise``, by a different random digit (never a leading zero); later steps use the value as
    written, so the demonstration stays self-consistent but may end with a wrong answer."""

    def corrupt(z: int) -> int:
        digits = list(str(abs(z)))
        for i in range(len(digits)):
            if rng.random() < digit_noise:
                choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0"
                                                                                and len(digits) > 1)]
                digits[i] = rng.choice(choices)
        return int("".join(digits)) * (-1 if z < 0 else 1)

    chain = [tuple(c) for c in example.meta["chain"]]
    steps, value = solve_chain(example.meta["start"], chain, corrupt)  # type: ignore[arg-type]
    return format_solution(steps, value)


def _draw(rng: random.Random, cfg: ArithmeticConfig, n: int, exclude: set[str], what: str) -> list[Example]:
    drawn = draw_distinct(n, exclude, lambda: sample_expression(rng, cfg), key=lambda d: d[0],
                          too_few=lambda got: f"arithmetic task: could only draw {got} distinct {what} expressions of "
                                              f"the {n} asked for; lower n_{what} or widen the difficulty")
    return [make_example(expr, start, chain) for expr, start, chain in drawn]


class ArithmeticTask(Task):
    """Generated arithmetic problems; reward 1.0 iff the final ``#### <int>`` equals the answer (style
    ``"qa"``), or iff the GSM8K grader accepts the response (style ``"chat"``)."""

    name = "arithmetic"

    def __init__(self, train: list[Example], eval: list[Example], config: ArithmeticConfig, seed: int,
                 style: str = "qa"):
        super().__init__(train, eval)
        self.config = config
        self.seed = seed
        self.style = style

    def reward(self, response: str, example: Example) -> float:
        if self.style == "chat":
            from oblr.grading import grade

            return 1.0 if grade(response, example.answer, kind="gsm8k") else 0.0
        got = parse_final_answer(response)
        if got is None:
            return 0.0
        try:
            return 1.0 if got == int(example.answer) else 0.0
        except (TypeError, ValueError):
            return 0.0

    def extract_answer(self, response: str) -> str | None:
        """The final answer of ``response`` (what ``oblr eval``'s majority vote counts), or None."""
        if self.style == "chat":
            from oblr.grading import extract_gsm8k_number

            value, _ = extract_gsm8k_number(response)
            return None if value is None else (str(value.numerator) if value.denominator == 1 else str(value))
        got = parse_final_answer(response)
        return None if got is None else str(got)


@register_task("arithmetic")
def arithmetic_task(*, seed: int = 0, n_train: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 20000,
                    n_eval: Annotated[int, Range(ge=0, le=MAX_EXAMPLES)] = 500, difficulty: str = "easy",
                    min_ops: Annotated[int | None, Range(ge=1, le=12)] = None,
                    max_ops: Annotated[int | None, Range(ge=1, le=12)] = None,
                    max_operand: Annotated[int | None, Range(ge=2, le=10**9)] = None,
                    max_value: Annotated[int | None, Range(ge=2, le=10**12)] = None, ops: str = "+-*",
                    style: Literal["qa", "chat"] = "qa", tokenizer: Any = None) -> ArithmeticTask:
    """Build the arithmetic task. Explicit ``min_ops``/``max_ops``/``max_operand``/``max_value`` override
    the ``difficulty`` preset (see :data:`DIFFICULTIES`). ``style``: ``"qa"`` or ``"chat"`` (module
    docstring; ``tokenizer`` renders the chat prompts). The annotations' ranges are checked with the config
    (``task.options``) before anything is built."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"arithmetic task: unknown difficulty {difficulty!r}; "
                         f"choose one of {', '.join(DIFFICULTIES)}")
    if style not in ("qa", "chat"):
        raise ValueError(f"arithmetic task: unknown style {style!r}; choose 'qa' or 'chat'")
    if n_train < 0 or n_eval < 0:
        raise ValueError(f"arithmetic task: n_train and n_eval must be >= 0, got {n_train}, {n_eval}")
    p = DIFFICULTIES[difficulty]
    cfg = ArithmeticConfig(
        min_ops=p[0] if min_ops is None else int(min_ops),
        max_ops=p[1] if max_ops is None else int(max_ops),
        max_operand=p[2] if max_operand is None else int(max_operand),
        max_value=p[3] if max_value is None else int(max_value),
        ops=ops,
    )
    if min_ops is not None and max_ops is None and cfg.max_ops < cfg.min_ops:
        cfg = ArithmeticConfig(cfg.min_ops, cfg.min_ops, cfg.max_operand, cfg.max_value, cfg.ops)
    cfg.validate()
    eval_set = _draw(random.Random(f"oblr-arith-eval-{seed}"), cfg, n_eval, set(), "eval")
    eval_exprs = {ex.meta["expression"] for ex in eval_set}
    train_set = _draw(random.Random(f"oblr-arith-train-{seed}"), cfg, n_train, eval_exprs, "train")
    if style == "chat":
        eval_set = [chat_example(ex, tokenizer) for ex in eval_set]
        train_set = [chat_example(ex, tokenizer) for ex in train_set]
    return ArithmeticTask(train_set, eval_set, cfg, seed, style)
