"""Evaluation: metric definitions, graded samples on disk, the table, and `oblr eval` end to end."""

from __future__ import annotations

import argparse
import io
import json
from types import SimpleNamespace

import pytest
import torch

from oblr.evaluate import evaluate, majority_correct, register_cli, score, vote_key
from oblr.tasks import get_task


def test_score_by_hand():
    correct = [[True, False, False], [False, False, False], [True, True, False], [False, True, False]]
    keys = [["1", "2", "2"], [None, None, None], ["5", "5", "4"], ["7", "8", "9"]]
    s = score(correct, keys)
    assert s["pass@1"] == pytest.approx((1 / 3 + 0 + 2 / 3 + 1 / 3) / 4)
    assert s["avg@3"] == s["pass@1"]
    # majority: "2" (wrong), no votes (wrong), "5" (right), tie 7/8/9 -> first seen "7" (wrong)
    assert s["maj@3"] == pytest.approx(1 / 4)
    assert s["pass@3"] == pytest.approx(3 / 4)
    assert score([[True]], [["1"]]) == {"pass@1": 1.0}
    with pytest.raises(ValueError, match="same number"):
        score([[True], [True, False]], [["1"], ["1", "2"]])


def test_majority_and_vote_key():
    assert vote_key(" \\frac{1}{2} ") == "\\frac{1}{2}" and vote_key("  ") is None and vote_key(None) is None
    assert majority_correct([None, "3", "4", "4"], [False, True, False, False]) is False
    assert majority_correct(["3", "4", "4", "3"], [True, False, False, True]) is True  # tie: first seen
    assert majority_correct([None, None], [False, False]) is False


class FakeEngine:
    """A rollout engine that answers problem k correctly in samples j < k % (n + 1): a known pattern."""

    def __init__(self, answers: dict[str, str], kind: str):
        self.answers, self.kind, self.calls = answers, kind, []

    def generate(self, prompts, *, num_samples, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, seed=None,
                 progress=None):
        self.calls.append(dict(n=len(prompts), greedy=greedy, temperature=temperature, seed=seed))
        out = []
        for p in prompts:
            k = list(self.answers).index(p)
            for j in range(num_samples):
                ans = self.answers[p] if j < k % (num_samples + 1) else "-987654"
                out.append(f"work... #### {ans}" if self.kind == "gsm8k" else f"so \\boxed{{{ans}}}")
        b = len(out)
        return SimpleNamespace(responses=out, response_lengths=torch.full((b,), 5), finished=torch.ones(b, dtype=torch.bool),
                               group_ids=torch.arange(len(prompts)).repeat_interleave(num_samples))


@pytest.mark.parametrize("name", ["gsm8k", "math500"])
def test_evaluate_with_fake_generation(tmp_path, name):
    limit, n = 5, 3
    task = get_task(name, template="base", limit=limit, train_limit=0)
    fake = FakeEngine({e.prompt: e.answer for e in task.eval}, task.kind)
    buf = io.StringIO()
    res = evaluate(None, None, [name], n=n, temperature=0.7, limit=limit, batch_size=6, template="base",
                   output_dir=tmp_path, engine=fake, show_progress=False, stream=buf)[name]
    right = [k % (n + 1) for k in range(limit)]  # correct samples per problem: 0,1,2,3,0
    assert res["problems"] == limit and res["n"] == n
    assert res["pass@1"] == pytest.approx(sum(right) / (n * limit))
    assert res["pass@3"] == pytest.approx(3 / 5)
    assert res["maj@3"] == pytest.approx(2 / 5)  # 2 or 3 right of 3
    assert [c["n"] for c in fake.calls] == [2, 2, 1] and not fake.calls[0]["greedy"]
    rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert len(rows) == limit * n
    assert [(r["problem"], r["sample"]) for r in rows] == [(k, j) for k in range(limit) for j in range(n)]
    assert [r["correct"] for r in rows] == [j < right[k] for k in range(limit) for j in range(n)]
    assert {"question", "prompt", "reference", "response", "extracted", "status", "length", "finished"} <= set(rows[0])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["results"][name]["pass@1"] == res["pass@1"] and saved["config"]["n"] == n
    table = buf.getvalue()
    assert name in table and "maj@3" in table and "pass@1" in table


def test_evaluate_argument_errors():
    with pytest.raises(ValueError, match="identical greedy samples"):
        evaluate(None, None, "gsm8k", n=4, temperature=0.0)
    with pytest.raises(ValueError, match="unknown benchmark.*math5\\b.*known: gsm8k"):
        evaluate(None, None, "gsm8k,math5")
    with pytest.raises(ValueError, match="unknown template"):
        evaluate(None, None, "gsm8k", template="x")


def _eval_args(argv):
    parser = argparse.ArgumentParser(prog="oblr")
    register_cli(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_parses_all_options():
    args = _eval_args(["eval", "--model", "m", "--benchmarks", "gsm8k,aime25", "--n", "4", "--temperature", "0.6",
                       "--max-new-tokens", "64", "--limit", "3", "--batch-size", "8", "--output-dir", "o",
                       "--template", "chat", "--dtype", "float32", "--device", "cpu", "--top-p", "0.95"])
    assert (args.model, args.benchmarks, args.n, args.temperature, args.max_new_tokens, args.limit,
            args.batch_size, args.output_dir, args.template, args.dtype, args.device, args.top_p) == (
        "m", "gsm8k,aime25", 4, 0.6, 64, 3, 8, "o", "chat", "float32", "cpu", 0.95)
    assert callable(args.func)


@pytest.mark.slow
def test_oblr_eval_end_to_end_on_builtin_model(small_builtin, tmp_path, capsys):
    out = tmp_path / "eval"
    args = _eval_args(["eval", "--model", str(small_builtin), "--benchmarks", "gsm8k,math500,olympiadbench",
                       "--limit", "2", "--n", "2", "--temperature", "1.0", "--max-new-tokens", "8",
                       "--batch-size", "4", "--output-dir", str(out), "--device", "cpu"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())["results"]
    for name in ("gsm8k", "math500", "olympiadbench"):
        assert name in printed
        r = saved[name]
        assert r["problems"] == 2 and 0.0 <= r["pass@1"] <= 1.0 and 0.0 <= r["maj@2"] <= r["pass@2"] <= 1.0
        rows = [json.loads(x) for x in (out / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and all(1 <= r["length"] <= 8 for r in rows)


def test_evaluate_greedy_on_builtin_model(small_builtin):
    from oblr.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(small_builtin))
    res = evaluate(model, tok, "aime25", limit=2, max_new_tokens=4, show_progress=False, stream=io.StringIO())
    assert set(res["aime25"]) >= {"pass@1", "response_length_mean", "truncated_share"}
    assert "maj@1" not in res["aime25"]
