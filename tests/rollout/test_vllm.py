"""The vLLM engine against the HF engine and the trainer's own log-probs.

Tests marked ``needs_vllm`` run where vLLM is installed: ``make setup-vllm`` builds ``.venv-vllm`` and
``make test`` runs this file there with ``OBLR_REQUIRE_VLLM=1``, which turns a missing vLLM into failures
instead of skips. The rest (pure helpers, the one-line refusal) runs in the main environment.

Tolerances (CPU, float32): vLLM's log-probs of the sampled tokens and of fixed sequences are within 1e-4
of the trainer's (measured: a few 1e-6); greedy decoding gives the HF engine's tokens exactly.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from oblr.logprobs import forward_logits, logprob_gap, sampling_token_logprobs, token_logprobs
from oblr.models import load_model_and_tokenizer
from oblr.rollout import make_engine
from oblr.rollout.hf import generate
from oblr.rollout.vllm import (
    INSTALL_HINT,
    VLLMUnavailable,
    cpu_kv_cache_bytes,
    kv_bytes_per_token,
    row_seeds,
    vllm_available,
)

PROMPTS = ["Q: 1+2\nA:", "Q: (17+5)*3-8\nA:", "Q: 9*4-6\nA:"]
TOL = 1e-4
needs_vllm = pytest.mark.skipif(not vllm_available() and not os.environ.get("OBLR_REQUIRE_VLLM"),
                                reason="vLLM is not installed here (make setup-vllm)")


@pytest.mark.skipif(vllm_available(), reason="vLLM is installed here")
def test_refuses_with_one_line_naming_the_package(qwen3_model):
    with pytest.raises(VLLMUnavailable) as e:
        make_engine("vllm", qwen3_model, None)
    assert str(e.value) == INSTALL_HINT and "\n" not in INSTALL_HINT and "vllm" in INSTALL_HINT


def test_kv_cache_size_on_cpu(qwen3_model):
    cfg = qwen3_model.config  # 2 layers, 2 KV heads of 8
    assert kv_bytes_per_token(cfg, torch.float32) == 2 * 2 * 2 * 8 * 4
    assert kv_bytes_per_token(cfg, torch.bfloat16) == 2 * 2 * 2 * 8 * 2
    assert cpu_kv_cache_bytes(0.3, 10_000, 1, 10, 5) == 50  # capped by what 5 sequences of 10 tokens use
    assert cpu_kv_cache_bytes(0.3, 10_000, 100, 10, 5) == 3000  # a share of the available memory


def test_row_seeds():
    torch.manual_seed(5)
    g = row_seeds(None, 3)  # from the global RNG: reproducible through its (checkpointed) state
    torch.manual_seed(5)
    assert g == row_seeds(None, 3) and g != row_seeds(None, 3)
    a = row_seeds(7, 64)
    assert a == row_seeds(7, 64) and a != row_seeds(8, 64) and len(set(a)) == 64


@pytest.fixture(scope="module")
def model_tok(small_builtin):
    return load_model_and_tokenizer(small_builtin)


@pytest.fixture(scope="module")
def engine(model_tok):
    eng = make_engine("vllm", *model_tok)
    yield eng
    eng.close()


def _trainer_gap(model, batch, temperature, top_p) -> dict:
    with torch.no_grad():
        lp = sampling_token_logprobs(forward_logits(model, batch.input_ids, batch.attention_mask), batch.input_ids,
                                     temperature=temperature, top_p=top_p)
    return {k: float(v) for k, v in logprob_gap(batch.sampler_logprobs, lp, batch.response_mask).items()}


def _score_gap(engine, model, batch) -> float:
    """max |vLLM - trainer| over the response tokens of ``batch``, scored as fixed sequences."""
    seqs = [row[m.bool()].tolist() for row, m in zip(batch.input_ids, batch.attention_mask)]
    got = engine.prompt_logprobs(seqs)
    with torch.no_grad():
        ref = token_logprobs(model, batch.input_ids, batch.attention_mask)
    gaps = [(g - r[m.bool()])[resp[m.bool()].bool()].abs().max()
            for g, r, m, resp in zip(got, ref, batch.attention_mask, batch.response_mask)]
    return float(torch.stack(gaps).max())


@needs_vllm
def test_greedy_batch_equals_hf_engine(engine, model_tok):
    """Same tokens, same layout (left-padded prompts, right-padded responses, EOS kept, masks, texts)."""
    model, tok = model_tok
    v = engine.generate(PROMPTS, num_samples=2, max_new_tokens=24, greedy=True)
    h = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=24, greedy=True)
    for name in ("input_ids", "attention_mask", "response_mask", "group_ids", "response_lengths", "finished"):
        assert torch.equal(getattr(v, name), getattr(h, name)), name
    assert v.responses == h.responses and v.prompt_length == h.prompt_length
    assert v.sampler_logprobs is None


@needs_vllm
def test_sampling_layout_seeds_and_progress(engine, model_tok):
    _, tok = model_tok
    calls = []
    a = engine.generate(PROMPTS, num_samples=4, max_new_tokens=16, seed=3,
                        progress=lambda done, total: calls.append((done, total)))
    b = engine.generate(PROMPTS, num_samples=4, max_new_tokens=16, seed=3)
    c = engine.generate(PROMPTS, num_samples=4, max_new_tokens=16, seed=4)
    assert torch.equal(a.input_ids, b.input_ids) and a.responses == b.responses
    assert not torch.equal(a.input_ids, c.input_ids)
    assert calls[-1] == (12, 12) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    P, T = a.prompt_length, a.input_ids.shape[1]
    assert torch.equal(a.group_ids, torch.arange(12) // 4)
    for i in range(12):
        n = int(a.response_lengths[i])
        assert a.response_mask[i].tolist() == [0] * P + [1] * n + [0] * (T - P - n)
        ids = a.input_ids[i, P:P + n].tolist()
        assert (ids[-1] == tok.eos_token_id) == bool(a.finished[i]) and tok.eos_token_id not in ids[:-1]
        assert a.responses[i] == tok.decode(ids, skip_special_tokens=True)
        assert (a.sampler_logprobs[i, :P] == 0).all() and (a.sampler_logprobs[i, P + n:] == 0).all()
        assert (a.sampler_logprobs[i, P:P + n] < 0).all()


@needs_vllm
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampler_logprobs_equal_trainer_logprobs(engine, model_tok, temperature, top_p):
    """The on-policy check: vLLM's processed log-probs of its samples vs the trainer's forward pass."""
    model, _ = model_tok
    batch = engine.generate(PROMPTS, num_samples=8, max_new_tokens=24, temperature=temperature, top_p=top_p,
                            seed=0)
    gap = _trainer_gap(model, batch, temperature, top_p)
    assert gap["rollout/logprob_gap_max"] < TOL and gap["rollout/outside_nucleus"] == 0
    # a trainer at another temperature is off-policy, and the gap shows it
    assert _trainer_gap(model, batch, temperature * 1.5, top_p)["rollout/logprob_gap_max"] > 100 * TOL


def _one_optimizer_step(model, batch) -> None:
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    (-(lp * batch.response_mask).sum() / batch.response_mask.sum()).backward()
    opt.step()
    model.eval()


@needs_vllm
def test_weight_sync_after_an_optimizer_step(engine, model_tok):
    model, tok = model_tok
    trained = copy.deepcopy(model)
    batch = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=16, generator_seed=0)
    assert _score_gap(engine, model, batch) < TOL
    _one_optimizer_step(trained, batch)
    try:
        assert _score_gap(engine, trained, batch) > 1e-2  # stale engine: the check can fail
        engine.sync_weights(trained)
        assert _score_gap(engine, trained, batch) < TOL
        sampled = engine.generate(PROMPTS, num_samples=4, max_new_tokens=16, seed=1)
        assert _trainer_gap(trained, sampled, 1.0, 1.0)["rollout/logprob_gap_max"] < TOL
    finally:
        engine.sync_weights(model)
    assert _score_gap(engine, model, batch) < TOL


@needs_vllm
def test_lora_weight_sync_pushes_merged_weights(engine, model_tok):
    peft = pytest.importorskip("peft")
    model, tok = model_tok
    lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"], lora_dropout=0.0))
    batch = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=16, generator_seed=0)
    _one_optimizer_step(lora, batch)  # B was 0: one step makes the adapters matter
    try:
        assert _score_gap(engine, lora, batch) > 1e-3
        engine.sync_weights(lora)
        assert _score_gap(engine, lora, batch) < TOL
    finally:
        engine.sync_weights(model)


@needs_vllm
def test_oblr_train_with_the_vllm_engine(small_builtin, tmp_path):
    """A short run end to end: vLLM rollouts at T = 0.9, top-p 0.95, weights synced every step, the gap
    between vLLM's log-probs and the update's logged every step and small."""
    from oblr.cli import main
    from oblr.tracking import read_metrics

    out = tmp_path / "run"
    assert main(["train", f"model.name_or_path={small_builtin}", "train.steps=3", "rollout.engine=vllm",
                 "rollout.engine_options={memory_fraction: 0.2}", "rollout.prompts_per_step=4",
                 "rollout.group_size=4", "rollout.max_new_tokens=24", "rollout.temperature=0.9", "rollout.top_p=0.95",
                 "task.eval_size=8", "train.eval_samples=2", "train.threads=1", "train.plots=false",
                 "task.options={n_train: 200, n_eval: 20}", "--output-dir", str(out), "--quiet"]) == 0
    rows = [r for r in read_metrics(out) if "train/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/logprob_gap_max"] < TOL and r["rollout/outside_nucleus"] == 0 and r["time/sync"] >= 0
        assert r["optim/skipped"] == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 3


@needs_vllm
def test_oblr_eval_with_the_vllm_engine(small_builtin, tmp_path, monkeypatch):
    """oblr eval through vLLM. The built-in model is character-level with 128 positions and GSM8K prompts
    are longer: vLLM is told to allow a longer context (rotary positions extend; the hf engine does the same)."""
    from oblr.cli import main

    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(small_builtin), "--engine", "vllm", "--engine-options",
                 "{memory_fraction: 0.2, max_model_len: 1024}", "--benchmarks", "gsm8k", "--limit", "2", "--n", "2", "--temperature", "1.0",
                 "--max-new-tokens", "8", "--device", "cpu", "--output-dir", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())["results"]["gsm8k"]
    assert res["problems"] == 2 and 0 <= res["pass@1"] <= 1
