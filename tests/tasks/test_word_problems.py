"""The word_problems task: generation, GSM8K-format references, and rewards through the GSM8K grader that
``oblr eval`` uses."""

import re

from oblr.cli import main
from oblr.grading import grade
from oblr.tasks import get_task
from oblr.tasks.math import MathTask
from oblr.tasks.word_problems import MAX_SOLUTION_CHARS, MAX_VALUE, TEMPLATES


def test_generation_gsm8k_format_and_self_consistent():
    task = get_task("word_problems", n_train=2000, n_eval=300)
    assert isinstance(task, MathTask) and task.kind == "gsm8k"
    assert len(task.train) == 2000 and len(task.eval) == 300
    for ex in task.train + task.eval:
        assert re.fullmatch(r"(\d+[-+*/]\d+=\d+\n){2,3}#### \d+", ex.answer), ex.answer
        value = ex.meta["value"]
        assert 0 <= value <= MAX_VALUE and ex.answer.endswith(f"#### {value}")
        for step in ex.meta["steps"]:  # every written step is true
            lhs, z = step.split("=")
            x, op, y = re.fullmatch(r"(\d+)([-+*/])(\d+)", lhs).groups()
            x, y = int(x), int(y)
            assert {"+": x + y, "-": x - y, "*": x * y, "/": x / y}[op] == int(z)
        assert ex.prompt == f"Q: {ex.meta['question']}\nA:"
        assert task.reward(ex.meta["solution"], ex) == 1.0  # the SFT target passes the grader
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.eval}
    assert [e.prompt for e in get_task("word_problems", n_train=5, n_eval=300).eval] == [e.prompt for e in task.eval]
    # every template and 2- and 3-step problems occur
    assert {len(e.meta["steps"]) for e in task.train} == {2, 3}
    ops = {step.split("=")[0].strip("0123456789") for e in task.train for step in e.meta["steps"]}
    assert ops == {"+", "-", "*", "/"} and len(TEMPLATES) == 6


def test_no_solution_is_cut_off_by_the_default_generation_limit():
    """Every solution fits in the default ``rollout.max_new_tokens`` (the built-in model's tokens are
    characters), also in the templates' longest corner (3 steps with two-digit values: such problems are drawn,
    at most 32 characters long), so that no correct answer is truncated into a wrong one."""
    from oblr.config import RolloutConfig
    from oblr.models.task_builtins import TASK_MODELS

    assert MAX_SOLUTION_CHARS == RolloutConfig().max_new_tokens <= TASK_MODELS["word_problems"].max_new_tokens
    task = get_task("word_problems", n_train=20000, n_eval=500)
    lengths = [len(e.meta["solution"]) for e in task.train + task.eval]
    assert max(lengths) == MAX_SOLUTION_CHARS  # the bound is reached, and never exceeded
    long_three = [e for e in task.train if len(e.meta["steps"]) == 3 and e.meta["value"] >= 10]
    assert len(long_three) > 500


def test_reward_is_the_gsm8k_grader():
    task = get_task("word_problems", n_train=1, n_eval=50)
    for ex in task.eval:
        n = ex.meta["value"]
        for response in (f" 1+1=2 #### {n}", f" #### {n}.0", f"The answer is {n}", f" #### {n + 1}", " 3+4=7",
                         "", f" #### {n} apples", f" #### ${n}"):
            expected = 1.0 if grade(response, ex.answer, kind="gsm8k") else 0.0
            assert task.reward(response, ex) == expected, response
        assert task.reward(f" 2*3=6 #### {n}", ex) == 1.0
        assert task.reward(f" 2*3=6 #### {n + 1}", ex) == 0.0
        assert task.reward(f" #### {n}/1", ex) == 1.0  # read as a value, as the GSM8K grader does


def test_listed_by_oblr_tasks(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("task.name"))
    assert "countdown" in line and "word_problems" in line


def test_reward_goes_through_the_graders_gsm8k_path(monkeypatch):
    """The training reward is the verdict of the grader ``oblr eval`` uses for GSM8K (``evaluate._grader``):
    comma-grouped, dollar-signed and decimal final answers are graded alike, and the reward calls
    ``oblr.grading.grade`` with ``kind="gsm8k"``."""
    import oblr.tasks.math as math_mod
    from oblr.evaluate import _grader
    from oblr.tasks.word_problems import make_example

    task = get_task("word_problems", n_train=1, n_eval=1)
    ex = make_example("Q?", ["1000+234=1234"], 1234)
    small = make_example("Q?", ["3*4=12"], 12)
    eval_grade = _grader("gsm8k", 5.0)
    cases = [(ex, " 1000+234=1234 #### 1,234", 1.0), (ex, " #### 1234.00", 1.0), (ex, " #### 1,235", 0.0),
             (small, " #### $12", 1.0), (small, " 3*4=12 #### 12 ", 1.0), (small, " #### 13", 0.0)]
    for example, response, want in cases:
        assert task.reward(response, example) == want, response
        assert eval_grade([response], [example])[0].correct == (want == 1.0), response
    seen = []
    real = math_mod.grade
    monkeypatch.setattr(math_mod, "grade", lambda *a, **k: seen.append(k["kind"]) or real(*a, **k))
    assert task.reward(" #### $12", small) == 1.0 and seen == ["gsm8k"]


def test_option_ranges_checked():
    import pytest

    with pytest.raises(ValueError, match="n_eval"):
        get_task("word_problems", n_eval=-1)
    with pytest.raises(ValueError, match="unknown option|difficulty"):
        get_task("word_problems", difficulty="hard")


# --- answer keys recomputed from the question text, and the answer formats the grader accepts ---

#: each template's question, read back, and the answer worked out from its numbers (written for this test)
_QUESTIONS = [
    (r"(\w+) has (\d+) (\w+), buys (\d+), gives (\d+) away\. How many now\?",
     lambda a, item, b, c: a + b - c),
    (r"(\w+) has (\d+) boxes of (\d+) (\w+), gives (\d+) away\. How many left\?",
     lambda a, b, item, c: a * b - c),
    (r"(\w+) has (\d+) (\w+), (\w+) (\d+) times as many\. How many in all\?",
     lambda a, item, other, b: a + a * b),
    (r"(\w+) buys (\d+) (\w+) at \$(\d+) each, pays \$(\d+)\. What change\?",
     lambda b, item, a, c: c - a * b),
    (r"(\w+) has (\d+) (\w+), finds (\d+), shares among (\d+)\. How many each\?",
     lambda a, item, b, d: (a + b) // d if (a + b) % d == 0 else None),
    (r"(\w+) has (\d+) bags of (\d+) (\w+), buys (\d+), loses (\d+)\. How many now\?",
     lambda a, b, item, c, d: a * b + c - d),
]


def _answer_from_question(question: str) -> int:
    hits = []
    for pattern, solve in _QUESTIONS:
        m = re.fullmatch(pattern, question)
        if m:
            args = [int(x) if x.isdigit() else x for x in m.groups()[1:]]  # the name is not needed
            hits.append(solve(*args))
    assert len(hits) == 1 and hits[0] is not None, (question, hits)
    return hits[0]


def test_answer_keys_recomputed_from_the_question_text():
    """For a few hundred problems of every template: the answer worked out from the question's own numbers
    equals the stored value, the reference's ``#### `` line and what the grader accepts."""
    task = get_task("word_problems", n_train=300, n_eval=100)
    seen = set()
    for ex in task.train + task.eval:
        m = re.fullmatch(r"Q: (.+)\nA:", ex.prompt)
        assert m, ex.prompt
        v = _answer_from_question(m[1])
        seen.add(next(i for i, (p, _) in enumerate(_QUESTIONS) if re.fullmatch(p, m[1])))
        assert ex.meta["value"] == v and ex.answer.endswith(f"\n#### {v}")
        assert task.reward(f" #### {v}", ex) == 1.0 and task.reward(f" #### {v + 1}", ex) == 0.0
    assert seen == set(range(len(_QUESTIONS)))  # every template was checked


def test_answer_formats_the_grader_accepts():
    """The answer statements the GSM8K grader reads (oblr.grading.extract: ``####``, "The answer is", "Answer:", a box,
    the last number as the fallback), with signs, leading zeros, decimals, a currency sign and trailing words:
    reward 1 for the value worked out from the question, 0 for the value + 1 in the same form."""
    task = get_task("word_problems", n_train=0, n_eval=60)
    forms = ["#### {}", "####{}", "####   {}  \n", "#### +{}", "#### 0{}", "#### {}.0", "#### {}.00", "#### ${}",
             "#### {} apples", "The answer is {}.", "So the answer is {}", "Answer: {}", "\\boxed{{{}}}",
             "The final answer is $\\boxed{{{}}}$.", "1+1=2 2+2=4 then {}", "3*4=12 #### 7\nWait, the answer is {}."]
    for ex in task.eval:
        v = _answer_from_question(ex.meta["question"])
        for form in forms:
            assert task.reward(" " + form.format(v), ex) == 1.0, form.format(v)
            assert task.reward(" " + form.format(v + 1), ex) == 0.0, form.format(v + 1)
