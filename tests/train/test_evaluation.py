"""oblr.train.evaluation and oblr.rollout.heldout: the one held-out evaluation every trainer uses (a known engine,
by value); the TRL integration's accuracy and the built-in models' measurement are the same function's on the
same model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from oblr.tasks import get_task, reward_scorer
from oblr.train.evaluation import heldout_eval, sample_rows, write_samples


class PatternEngine:
    """Problem k: sampled answer j is right when j < k % (n + 1); greedy is right on even k."""

    def __init__(self, examples):
        self.index = {e.prompt: (k, e.answer) for k, e in enumerate(examples)}
        self.calls = []

    def generate(self, prompts, *, num_samples, max_new_tokens, temperature=1.0, top_p=1.0, greedy=False, seed=None,
                 progress=None):
        self.calls.append(dict(greedy=greedy, temperature=temperature, top_p=top_p, seed=seed))
        out = []
        for p in prompts:
            k, ans = self.index[p]
            for j in range(num_samples):
                right = (k % 2 == 0) if greedy else j < k % (num_samples + 1)
                out.append(f" #### {ans}" if right else " #### -1")
        return SimpleNamespace(responses=out, response_lengths=torch.tensor([len(r) for r in out]))


def test_heldout_eval_scores_every_row_with_the_run_sampling_settings(tmp_path):
    task = get_task("arithmetic", n_train=0, n_eval=5)
    exs = task.eval
    eng = PatternEngine(exs)
    h = heldout_eval(eng, exs, reward_scorer(task), samples=3, max_new_tokens=8, temperature=0.7, top_p=0.9,
                     seed=11, greedy=True)
    right = [k % 4 for k in range(5)]  # right samples per problem: 0, 1, 2, 3, 0
    assert h.scores == [1.0 if j < r else 0.0 for r in right for j in range(3)]
    assert h.accuracy_sampled() == pytest.approx(sum(right) / 15)
    assert h.greedy_scores == [1.0, 0.0, 1.0, 0.0, 1.0] and h.accuracy_greedy() == pytest.approx(3 / 5)
    assert h.lengths == [len(r) for r in h.responses]
    assert eng.calls[0] == dict(greedy=False, temperature=0.7, top_p=0.9, seed=11) and eng.calls[1]["greedy"]
    rows = sample_rows(h)
    assert [r["reward"] for r in rows] == h.greedy_scores and rows[0]["prompt"] == exs[0].prompt
    write_samples(tmp_path, 7, rows)
    assert len((tmp_path / "samples" / "eval_step_000007.jsonl").read_text().splitlines()) == 5
    no_greedy = heldout_eval(PatternEngine(exs), exs, reward_scorer(task), samples=3, max_new_tokens=8, seed=11,
                             greedy=False)
    assert no_greedy.greedy_scores is None and len(sample_rows(no_greedy)) == 15
    empty = heldout_eval(eng, [], reward_scorer(task), samples=3, max_new_tokens=8, seed=1)
    assert empty.scores == [] and empty.greedy_scores == []


def test_trl_heldout_accuracy_is_heldout_eval_on_the_hf_engine(small_builtin):
    pytest.importorskip("trl")
    from oblr.integrations.trl.tasks import heldout_accuracy
    from oblr.models import load_model_and_tokenizer
    from oblr.rollout import make_engine

    model, tok = load_model_and_tokenizer(small_builtin)
    task = get_task("arithmetic", n_train=0, n_eval=6)
    acc = heldout_accuracy(model, tok, task, n_problems=6, samples=2, max_new_tokens=12, seed=5)
    h = heldout_eval(make_engine("hf", model, tok), task.eval, reward_scorer(task), samples=2, max_new_tokens=12,
                     seed=5, greedy=False)
    assert acc == h.accuracy_sampled()


def test_heldout_eval_with_no_samples_draws_only_the_greedy_answers():
    task = get_task("arithmetic", n_train=0, n_eval=5)
    eng = PatternEngine(task.eval)
    h = heldout_eval(eng, task.eval, reward_scorer(task), samples=0, max_new_tokens=8, seed=3)
    assert [c["greedy"] for c in eng.calls] == [True]
    assert h.scores == [] and h.accuracy_sampled() is None and h.accuracy_greedy() == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match="samples must be a non-negative integer"):
        heldout_eval(eng, task.eval, reward_scorer(task), samples=-1, max_new_tokens=8, seed=3)


def test_the_builtin_models_measurement_is_the_heldout_evaluation(small_builtin):
    """measure_accuracy (the built-in models' start accuracy) equals heldout_eval on the hf engine, and the mean
    reward of generate_and_score's rows computed here by hand (its formula before it went through heldout_eval)."""
    from oblr.models import load_model_and_tokenizer
    from oblr.models.builtin import measure_accuracy
    from oblr.rollout import generate_and_score, make_engine

    model, tok = load_model_and_tokenizer(small_builtin)
    task = get_task("arithmetic", n_train=0, n_eval=6)
    sampled = measure_accuracy(model, tok, task, task.eval, greedy=False, num_samples=3, max_new_tokens=12, seed=4)
    greedy = measure_accuracy(model, tok, task, task.eval, greedy=True, max_new_tokens=12)
    eng = make_engine("hf", model, tok, batch_size=256)
    h = heldout_eval(eng, task.eval, reward_scorer(task), samples=3, max_new_tokens=12, seed=4)
    assert (sampled, greedy) == (h.accuracy_sampled(), h.accuracy_greedy())
    for kw, got in ((dict(num_samples=3, seed=4), sampled), (dict(num_samples=1, greedy=True), greedy)):
        _, rewards = generate_and_score(eng, task.eval, reward_scorer(task), max_new_tokens=12, **kw)
        assert got == float(rewards.sum()) / rewards.numel()
