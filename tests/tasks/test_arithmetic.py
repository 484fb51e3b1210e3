"""Built-in arithmetic task: generation, disjointness, solutions, answer parser and reward."""

from __future__ import annotations

import ast
import operator
import random
import re

import pytest

from oblr.tasks import get_task
from oblr.tasks.arithmetic import (
    DIFFICULTIES,
    ArithmeticTask,
    arithmetic_task,
    noisy_solution,
    parse_final_answer,
)

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(expr: str) -> int:
    """Independent evaluator of +, -, * and parentheses over integers (Python's own precedence)."""

    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise AssertionError(f"unexpected node {ast.dump(node)} in {expr!r}")

    return ev(ast.parse(expr, mode="eval").body)


@pytest.fixture(scope="module")
def task():
    return arithmetic_task(seed=3, n_train=3000, n_eval=300, difficulty="medium")


def test_registered_and_deterministic():
    a = get_task("arithmetic", seed=1, n_train=200, n_eval=50)
    b = arithmetic_task(seed=1, n_train=200, n_eval=50)
    c = arithmetic_task(seed=2, n_train=200, n_eval=50)
    assert isinstance(a, ArithmeticTask)
    assert [e.prompt for e in a.train] == [e.prompt for e in b.train]
    assert [e.meta["solution"] for e in a.eval] == [e.meta["solution"] for e in b.eval]
    assert [e.prompt for e in a.train] != [e.prompt for e in c.train]
    # the eval set does not depend on n_train
    d = arithmetic_task(seed=1, n_train=500, n_eval=50)
    assert [e.prompt for e in d.eval] == [e.prompt for e in a.eval]


def test_train_eval_disjoint_and_unique(task):
    tr = [e.meta["expression"] for e in task.train]
    ev = [e.meta["expression"] for e in task.eval]
    assert len(set(tr)) == len(tr) and len(set(ev)) == len(ev)
    assert not set(tr) & set(ev)
    assert len(task.train) == 3000 and len(task.eval) == 300


@pytest.mark.parametrize("difficulty", list(DIFFICULTIES))
def test_answers_and_solution_steps_are_correct(difficulty):
    t = arithmetic_task(seed=0, n_train=400, n_eval=50, difficulty=difficulty)
    lo, hi, max_operand, max_value = DIFFICULTIES[difficulty]
    for ex in t.train + t.eval:
        expr = ex.meta["expression"]
        assert ex.prompt == f"Q: {expr}\nA:"
        assert int(ex.answer) == _eval(expr)
        sol = ex.meta["solution"]
        assert sol.startswith(" ") and sol.endswith(f" #### {ex.answer}")
        steps = sol[1:].split(" #### ")[0].split(" ")
        assert lo <= len(steps) == ex.meta["n_ops"] <= hi
        prev = None
        for st in steps:
            m = re.fullmatch(r"(\d+)([+\-*])(\d+)=(\d+)", st)
            assert m, st
            x, op, y, z = int(m[1]), m[2], int(m[3]), int(m[4])
            assert _eval(f"{x}{op}{y}") == z and 0 <= z <= max_value
            if prev is not None:
                assert prev in (x, y)  # each step uses the previous result
            prev = z
        assert prev == int(ex.answer)
        assert parse_final_answer(sol) == int(ex.answer)
        assert t.reward(sol, ex) == 1.0
        nums = [int(n) for n in re.findall(r"\d+", expr)]
        assert max(nums) <= max_operand


def test_explicit_shape_overrides_preset():
    t = arithmetic_task(seed=0, n_train=100, n_eval=20, min_ops=3, max_ops=3, max_operand=9, max_value=500)
    assert all(e.meta["n_ops"] == 3 for e in t.train + t.eval)
    assert all(int(n) <= 9 for e in t.train for n in re.findall(r"\d+", e.meta["expression"]))
    t2 = arithmetic_task(seed=0, n_train=50, n_eval=10, min_ops=4)  # max_ops follows min_ops
    assert all(e.meta["n_ops"] == 4 for e in t2.train)
    t3 = arithmetic_task(seed=0, n_train=50, n_eval=10, ops="+")
    assert all("-" not in e.meta["expression"] and "*" not in e.meta["expression"] for e in t3.train)


@pytest.mark.parametrize("kwargs,match", [
    ({"difficulty": "insane"}, "unknown difficulty"),
    ({"min_ops": 3, "max_ops": 2}, "min_ops"),
    ({"max_operand": 1}, "max_operand"),
    ({"ops": "+/"}, "ops"),
    ({"n_train": -1}, "n_train"),
    ({"n_train": 10_000, "min_ops": 1, "max_ops": 1, "max_operand": 3, "max_value": 9, "ops": "+"},
     "distinct train"),
])
def test_bad_options_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        arithmetic_task(**{"n_train": 10, "n_eval": 5, **kwargs})


@pytest.mark.parametrize("text,expected", [
    (" 1+2=3 #### 3", 3),
    ("#### 42", 42),
    ("####42\n", 42),
    (" 5-9=-4 #### -4", -4),
    ("#### 007", 7),
    ("#### 1 #### 2", 2),  # the last marker counts
    ("#### 12 apples", None),
    ("#### 12.5", None),
    ("#### ", None),
    ("#### 3 ####", None),
    ("no marker 17", None),
    ("", None),
    ("### 3", None),
    ("#### ٣", None),  # non-ASCII digits are not accepted
    ("#### " + "9" * 31, None),  # absurdly long numbers are rejected, not converted
])
def test_parse_final_answer(text, expected):
    assert parse_final_answer(text) == expected


@pytest.mark.parametrize("garbage", [None, 3, b"#### 3", ["#### 3"], "\x00" * 10, "#" * 100_000 + " 1",
                                     "#### " + "1" * 5000, "\ud800"])
def test_reward_never_raises(garbage):
    t = arithmetic_task(seed=0, n_train=5, n_eval=5)
    assert t.reward(garbage, t.eval[0]) == 0.0


def test_reward_exact_match():
    t = arithmetic_task(seed=0, n_train=5, n_eval=5)
    ex = t.eval[0]
    ans = int(ex.answer)
    assert t.reward(f"whatever #### {ans}", ex) == 1.0
    assert t.reward(f"whatever #### {ans + 1}", ex) == 0.0
    assert t.reward(f"#### {ans} then more #### {ans + 1}", ex) == 0.0


def test_noisy_solution():
    t = arithmetic_task(seed=0, n_train=2000, n_eval=10)
    rng = random.Random(0)
    assert all(noisy_solution(e, rng, 0.0) == e.meta["solution"] for e in t.train[:200])
    changed = flipped = total = 0
    for ex in t.train:
        sol = noisy_solution(ex, rng, 0.2)
        steps = sol[1:].split(" #### ")
        written = steps[0].split(" ")
        clean = ex.meta["solution"][1:].split(" #### ")[0].split(" ")
        prev = None
        for w, c in zip(written, clean):
            m = re.fullmatch(r"(-?\d+)([+\-*])(-?\d+)=(-?\d+)", w)
            assert m, sol
            x, op, y, z = int(m[1]), m[2], int(m[3]), int(m[4])
            if prev is not None:
                assert prev in (x, y)  # the noisy value is carried on
            true_z = _eval(f"({x}){op}({y})")
            zs, ts = str(abs(z)), str(abs(true_z))
            assert len(zs) == len(ts) and not (len(zs) > 1 and zs[0] == "0")
            flipped += sum(a != b for a, b in zip(zs, ts))
            total += len(ts)
            prev = z
        assert int(steps[1]) == prev
        changed += sol != ex.meta["solution"]
    assert 0.17 < flipped / total < 0.23
    assert changed > len(t.train) // 3


def _chat_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tok


def test_chat_template_prompts_and_free_form_reward():
    qa = arithmetic_task(seed=4, n_train=30, n_eval=10, min_ops=1, max_ops=1, max_operand=10, ops="+-")
    chat = get_task("arithmetic", seed=4, n_train=30, n_eval=10, min_ops=1, max_ops=1, max_operand=10, ops="+-",
                    style="chat", tokenizer=_chat_tokenizer())
    # same problems, same answers, only the prompt differs
    assert [e.answer for e in chat.train + chat.eval] == [e.answer for e in qa.train + qa.eval]
    ex = chat.eval[0]
    expr = ex.meta["expression"]
    assert ex.prompt == f"<|user|>What is {expr}? Answer with the number only.<|end|><|assistant|>"
    right, wrong = int(ex.answer), int(ex.answer) + 1
    # an instruction-tuned model answers in prose: the last number counts (GSM8K grader), no #### needed
    assert chat.reward(f"{expr} = {right}", ex) == 1.0
    assert chat.reward(f"{expr} = {right}.", ex) == 1.0 and chat.reward(str(right), ex) == 1.0
    assert chat.reward(f"{expr} = {wrong}", ex) == 0.0 and chat.reward("I don't know", ex) == 0.0
    assert chat.reward(f"#### {right}", ex) == 1.0 and chat.extract_answer(f"so it is {right}") == str(right)
    # the qa style keeps the strict "#### <int>" reward
    assert qa.reward(f"{expr} = {right}", qa.eval[0]) == 0.0 and qa.reward(f" #### {right}", qa.eval[0]) == 1.0
    assert qa.extract_answer(f"so it is {right}") is None


def test_chat_template_option_is_checked():
    with pytest.raises(ValueError, match="style"):
        get_task("arithmetic", n_train=5, n_eval=5, style="fancy")


# --- answers in legal but unusual forms, and answer keys recomputed from the prompt text ---

@pytest.mark.parametrize("text,expected", [
    pytest.param("#### +58", 58, id="plus-sign"),
    pytest.param("#### -0", 0, id="minus-zero"),
    pytest.param("#### 0058", 58, id="leading-zeros"),
    pytest.param("#### +007", 7, id="plus-and-leading-zeros"),
    pytest.param("####58", 58, id="no-space"),
    pytest.param("####   58", 58, id="several-spaces"),
    pytest.param("####\t58", 58, id="tab"),
    pytest.param("#### \t 58", 58, id="space-tab-space"),
    pytest.param("#### 58   ", 58, id="trailing-spaces"),
    pytest.param("#### 58\n\n \t\n", 58, id="trailing-blank-lines"),
    pytest.param("work 1+2=3\n#### 58\n", 58, id="after-work"),
    pytest.param("#### + 58", None, id="detached-sign"),
    pytest.param("#### 5 8", None, id="split-digits"),
    pytest.param("####\n58", None, id="number-on-next-line"),
    pytest.param("#### 58 #", None, id="trailing-hash"),
])
def test_parse_final_answer_unusual_forms(text, expected):
    assert parse_final_answer(text) == expected


def test_reward_accepts_signs_zeros_and_whitespace_of_the_right_value():
    t = arithmetic_task(seed=0, n_train=0, n_eval=40)
    for ex in t.eval:
        v = int(ex.answer)
        for response in (f" #### +{v}", f" ####0{v}", f"####\t{v}  \n", f" 1+1=2 ####   {v}\n\n"):
            assert t.reward(response, ex) == 1.0, response
        for response in (f" #### +{v + 1}", f" #### 0{v + 1}", f"####\t{v}1", f" #### -{v + 1}"):
            assert t.reward(response, ex) == 0.0, response


def _eval_prompt_expression(text: str) -> int:
    """A second evaluator (precedence climbing over the characters, written for this test; no ast): integers,
    + - * and parentheses, * binding tighter, left-associative."""
    pos = 0

    def peek():
        return text[pos] if pos < len(text) else ""

    def atom() -> int:
        nonlocal pos
        if peek() == "(":
            pos += 1
            v = expr(0)
            assert peek() == ")", text
            pos += 1
            return v
        start = pos
        while peek().isdigit():
            pos += 1
        assert pos > start, (text, pos)
        return int(text[start:pos])

    def expr(min_prec: int) -> int:
        nonlocal pos
        lhs = atom()
        while peek() in ("+", "-", "*") and peek() != "" and {"+": 1, "-": 1, "*": 2}[peek()] >= min_prec:
            op = peek()
            pos += 1
            rhs = expr({"+": 1, "-": 1, "*": 2}[op] + 1)
            lhs = lhs + rhs if op == "+" else lhs - rhs if op == "-" else lhs * rhs
        return lhs

    v = expr(0)
    assert pos == len(text), text
    return v


@pytest.mark.parametrize("difficulty", list(DIFFICULTIES))
def test_answer_keys_recomputed_from_the_prompt_text(difficulty):
    """The prompt's expression (read back from the prompt, not from meta) evaluated by a second evaluator
    equals the stored answer, for a few hundred examples of each difficulty; the reward accepts exactly it."""
    t = arithmetic_task(seed=5, n_train=200, n_eval=100, difficulty=difficulty)
    for ex in t.train + t.eval:
        m = re.fullmatch(r"Q: ([0-9+\-*()]+)\nA:", ex.prompt)
        assert m, ex.prompt
        v = _eval_prompt_expression(m[1])
        assert ex.answer == str(v)
        assert t.reward(f" #### {v}", ex) == 1.0 and t.reward(f" #### {v - 1}", ex) == 0.0
    assert _eval_prompt_expression("2-3-4") == -5 and _eval_prompt_expression("2+3*4") == 14  # the evaluator itself
    assert _eval_prompt_expression("(2+3)*4-(1-2)") == 21
