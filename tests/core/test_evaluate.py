"""Evaluation: metric definitions, graded samples on disk, the table, and `oblr eval` end to end."""

from __future__ import annotations

import argparse
import io
import json
from types import SimpleNamespace

import pytest
import torch

from oblr.evaluate import evaluate, majority_correct, score, vote_key
from oblr.evaluate_cli import register_cli
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


# ------------------------------------------------------------------------------------ run folders as --model
def _fake_checkpoint(run, step, *, state=True, model=True):
    d = run / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True)
    if state:
        (d / "trainer_state.pt").write_bytes(b"x")
    if model:
        (d / "config.json").write_text("{}")
    return d


def test_model_arg_takes_a_run_folders_newest_intact_checkpoint(tmp_path, capsys):
    from oblr.evaluate_cli import resolve_model_arg

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("task: {name: arithmetic, options: {n_eval: 7}, eval_size: 5}\n")
    _fake_checkpoint(run, 10)
    _fake_checkpoint(run, 20, state=False)  # damaged (no trainer state): passed over with a warning
    path, cfg = resolve_model_arg(str(run))
    assert path == str(run / "checkpoints" / "step_000010") and cfg["task"]["options"] == {"n_eval": 7}
    assert "step_000020 is damaged" in capsys.readouterr().err
    # a model folder (a checkpoint is one), builtin, a hub id: passed on as they are
    for m in (str(run / "checkpoints" / "step_000010"), "builtin", "org/name", str(tmp_path / "missing")):
        assert resolve_model_arg(m) == (m, None)


@pytest.mark.parametrize("layout, msg", [
    ("other", "neither a saved model (no config.json) nor an oblr run folder (config.yaml + checkpoints/step_N)"),
    ("no_checkpoints", "an oblr run folder without checkpoints/"),
    ("damaged_only", "run folder with no complete checkpoint under"),
    ("neither", "holds neither a model (config.json) nor LoRA adapters (adapter_config.json)"),
])
def test_oblr_eval_refuses_a_folder_it_cannot_evaluate_in_one_line(tmp_path, capsys, layout, msg):
    from oblr.cli import main

    d = tmp_path / "x"
    d.mkdir()
    (d / "README.md").write_text("another project")
    if layout != "other":
        (d / "config.yaml").write_text("task: {name: arithmetic}\n")
    if layout == "damaged_only":
        _fake_checkpoint(d, 5, state=False)
    if layout == "neither":
        _fake_checkpoint(d, 5, model=False)
    assert main(["eval", "--model", str(d), "--device", "cpu", "--output-dir", str(tmp_path / "out")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("warning")]
    assert len(err) == 1 and msg in err[0] and str(d) in err[0], err
    if layout == "other":
        assert "checkpoints/step_N" in err[0]
    assert not (tmp_path / "out").exists()


def test_evaluate_a_registered_task_with_its_own_reward_and_answers(tmp_path):
    """A non-math task (the built-in arithmetic): correct = reward 1, votes from its extract_answer."""
    task = get_task("arithmetic", n_train=0, n_eval=4)
    fake = FakeEngine({e.prompt: e.answer for e in task.eval}, "gsm8k")  # "... #### <answer>"
    res = evaluate(None, None, "arithmetic", n=3, temperature=1.0, batch_size=6, engine=fake, show_progress=False,
                   output_dir=tmp_path, stream=io.StringIO(), task_options={"arithmetic": {"n_train": 0, "n_eval": 4}})
    r = res["arithmetic"]
    right = [k % 4 for k in range(4)]  # 0, 1, 2, 3 of 3 samples right
    assert r["problems"] == 4 and r["pass@1"] == pytest.approx(sum(right) / 12) == r["reward_mean"]
    assert r["maj@3"] == pytest.approx(2 / 4) and r["pass@3"] == pytest.approx(3 / 4)
    rows = [json.loads(x) for x in (tmp_path / "arithmetic.jsonl").read_text().splitlines()]
    assert rows[0]["extracted"] == "-987654" and rows[0]["reward"] == 0.0 and rows[0]["status"] == "ok"
    assert json.loads((tmp_path / "results.json").read_text())["config"]["task_options"] == {
        "arithmetic": {"n_train": 0, "n_eval": 4}}
    with pytest.raises(ValueError, match=r"other registered tasks: (\w+, )*arithmetic\b"):
        evaluate(None, None, "arith")


@pytest.mark.slow
def test_oblr_eval_on_a_run_folder_repeats_the_runs_greedy_accuracy(small_builtin, tmp_path, capsys):
    """`oblr eval --model RUN` with no benchmark: the run's last checkpoint on the run's own task, with its
    eval_size and max_new_tokens, so greedy pass@1 is the greedy held-out accuracy the run logged at its end."""
    from oblr.cli import main

    run = tmp_path / "run"
    assert main(["train", f"model.name_or_path={small_builtin}", "train.steps=2", "rollout.prompts_per_step=4",
                 "rollout.group_size=4", "rollout.max_new_tokens=24", "task.eval_size=8", "train.eval_samples=2",
                 "train.threads=1", "task.options={n_train: 200, n_eval: 20}", "--output-dir", str(run),
                 "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run), "--device", "cpu", "--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert "checkpoint step_000002" in err and "task arithmetic" in err
    saved = json.loads((out / "results.json").read_text())
    r = saved["results"]["arithmetic"]
    assert r["problems"] == 8 and saved["config"]["max_new_tokens"] == 24
    assert r["pass@1"] == pytest.approx(summary["eval_accuracy_greedy_final"])


# ------------------------------------------------------------------------------------------ LoRA run folders
@pytest.mark.parametrize("what", ["run", "checkpoint"])
def test_oblr_eval_on_a_lora_run_repeats_the_runs_greedy_accuracy(lora_run, tmp_path, capsys, what):
    """A LoRA run's checkpoint (adapters only), given as its run folder or as the checkpoint folder: the adapters
    on the base model the run trained, not merged, so greedy pass@1 is the greedy accuracy the run logged."""
    from oblr.cli import main

    run, summary = lora_run
    model = run if what == "run" else run / "checkpoints" / "step_000002"
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(model), "--device", "cpu", "--output-dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert "on the base model builtin" in err and "task arithmetic" in err
    r = json.loads((out / "results.json").read_text())["results"]["arithmetic"]
    assert r["problems"] == 8 and r["pass@1"] == pytest.approx(summary["eval_accuracy_greedy_final"])


def test_lora_base_is_refused_when_the_runs_start_weights_are_not_the_bases(lora_run, tmp_path, capsys):
    """Adapters on another base would be evaluated wrong: a base whose weights differ from the fingerprint the run
    recorded is refused in one line before any model loads; --base-model only for adapters; no base: named."""
    import shutil

    from oblr.cli import main

    run, _ = lora_run
    other = tmp_path / "run"
    shutil.copytree(run, other)
    code = json.loads((other / "code.json").read_text())
    code["start_model"]["fingerprint"] = "0" * 64
    (other / "code.json").write_text(json.dumps(code))
    assert main(["eval", "--model", str(other), "--device", "cpu", "--output-dir", str(tmp_path / "o1")]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("oblr: error")]
    assert len(err) == 1 and "started from other weights (fingerprint 000000000000)" in err[0], err
    assert not (tmp_path / "o1").exists()

    assert main(["eval", "--model", "builtin", "--base-model", "x", "--device", "cpu"]) == 2
    assert "only adapters take a base model" in capsys.readouterr().err

    alone = tmp_path / "adapters"  # adapters outside a run, their config naming no base
    shutil.copytree(run / "checkpoints" / "step_000002", alone)
    cfg = json.loads((alone / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = None
    (alone / "adapter_config.json").write_text(json.dumps(cfg))
    assert main(["eval", "--model", str(alone), "--device", "cpu", "--output-dir", str(tmp_path / "o2")]) == 2
    assert "pass --base-model PATH_OR_ID" in capsys.readouterr().err


def test_load_lora_checkpoint_is_the_trained_model_not_its_base(lora_run):
    """The loaded adapters give the logits of the model training resumes from (base + wrap_lora + the saved
    adapter weights), and not the base's: the adapters are there and attach where training put them."""
    import torch

    from oblr.models import load_lora_checkpoint, load_model_and_tokenizer, wrap_lora
    from oblr.train.checkpoint import load_weights_into

    run, _ = lora_run
    ckpt = run / "checkpoints" / "step_000002"
    model, tok = load_lora_checkpoint(ckpt, "builtin")
    base, _ = load_model_and_tokenizer("builtin")
    ids = tok(["12+7*3=", "4*(5-2)="], return_tensors="pt", padding=True)
    with torch.no_grad():
        got = model(**ids).logits
        plain = base(**ids).logits
        ref = wrap_lora(base, rank=4, alpha=16.0, targets=["q_proj", "k_proj", "v_proj", "o_proj"])
        load_weights_into(ref, ckpt)
        ref.eval()
        want = ref(**ids).logits
    assert torch.equal(got, want)
    assert (got - plain).abs().max() > 1e-4
