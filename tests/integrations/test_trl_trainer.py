"""OBLRGRPOTrainer on one process: exact w_i and gradient against a one-sequence-at-a-time reference (full
fine-tuning and LoRA); the DeepSpeed code path (TRL's own backward) gives the same gradient and lr."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from oblr.estimators import compute_advantages  # noqa: E402
from oblr.models import load_model_and_tokenizer  # noqa: E402

from .trl_helpers import (  # noqa: E402
    GradSnapshot,
    KeepRounds,
    frozen_copy,
    make_trainer,
    one_at_a_time_grads,
    rel_err,
)

# the full fine-tuning run: 2 optimizer steps, each one generation batch of 4 prompts x 4 completions folded in
# 2 chunks (gradient accumulation 2), sampled at temperature 0.7
FULL = dict(temperature=0.7, gradient_accumulation_steps=2, max_steps=2)


def _run(trainer):
    """Train, keeping every generation batch and the gradient before every optimizer step."""
    keep, snap = KeepRounds(trainer), GradSnapshot(lambda: trainer.model)
    trainer.add_callback(snap)
    trainer.train()
    return keep.rounds, snap.grads


@pytest.fixture(scope="module")
def full_run(trl_model, tmp_path_factory):
    """The folded path (no DeepSpeed), full fine-tuning, and a frozen copy of its initial weights."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path_factory.mktemp("full"), **FULL)
    reference = frozen_copy(trainer, lambda: load_model_and_tokenizer(trl_model)[0])
    rounds, grads = _run(trainer)
    return SimpleNamespace(trainer=trainer, reference=reference, rounds=rounds, grads=grads)


def _check_round_against_reference(batch, res, grad, reference_model, G, temperature):
    s = one_at_a_time_grads(reference_model, batch.input_ids, batch.attention_mask, batch.response_mask, temperature)
    c = batch.seq_scale.double()
    w_ref = s.pow(2).sum(-1) * c * c
    w = res.estimate.weights.reshape(-1)  # the w_i the core's estimator used
    assert rel_err(w, w_ref) < 1e-4
    assert (w.double() - w_ref).abs().max() / w_ref.abs().max() < 1e-4
    adv = compute_advantages("oblr", batch.rewards.double(), weights=w_ref.view(-1, G))
    assert adv.abs().max() > 0  # the varied reward differs within groups: a non-trivial comparison
    assert rel_err(res.advantages, adv) < 1e-4
    grad_ref = (-adv.reshape(-1, 1) * c[:, None] * s).sum(0)  # the folded gradient sum_i -A_i c_i s_i
    assert rel_err(grad, grad_ref) < 1e-4
    return s, c, adv


def test_full_finetuning_weights_and_gradient_match_one_at_a_time_reference(full_run):
    trainer = full_run.trainer
    assert len(full_run.rounds) == 2 and len(full_run.grads) == 2
    batch, res = full_run.rounds[0]  # the first generation batch, scored by the initial weights
    assert batch.input_ids.shape[0] == 16 and res.per_prompt_sq_norms.shape == (4,)  # GA 2: two chunks of 2 groups
    s, c, adv = _check_round_against_reference(batch, res, full_run.grads[0], full_run.reference,
                                               trainer.num_generations, temperature=0.7)
    # S, V, N and the lr of the first step by value, from the reference's per-prompt gradients: N is the
    # generation batch's 4 prompts, not a chunk's (per-device batch's) 2, and S/(S + V/N) is written out here
    G = trainer.num_generations
    N = batch.input_ids.shape[0] // G
    contrib = -adv.reshape(-1, 1) * c[:, None] * s
    gbar = contrib.sum(0)
    g_k = N * contrib.view(N, G, -1).sum(1)  # per-prompt estimates, mean_k g_k = gbar
    gk_sq, gbar_sq = g_k.pow(2).sum(-1), gbar.pow(2).sum()
    V = float((gk_sq.sum() - N * gbar_sq) / (N - 1))
    signal = float(gbar_sq) - V / N
    logs = trainer.state.log_history[0]
    assert logs["oblr/n"] == N == 4 and signal > 0 and V > 0
    assert logs["oblr/V"] == pytest.approx(V, rel=1e-4)
    assert logs["oblr/signal"] == pytest.approx(signal, rel=1e-4)
    # step 1: the bias-corrected EMA of one value is that value
    assert logs["oblr/lr"] == pytest.approx(1e-3 * signal / (signal + V / N), rel=1e-4)
    assert abs(signal / (signal + V / (N // 2)) / (signal / (signal + V / N)) - 1) > 1e-2  # N matters here
    for logs in trainer.state.log_history[:2]:
        for key in ("oblr/S", "oblr/V", "oblr/snr", "oblr/lr", "oblr/w_mean", "oblr/fallback_count"):
            assert key in logs
        assert logs["learning_rate"] == pytest.approx(logs["oblr/lr"])


def test_lora_weights_are_over_the_adapter_only(trl_model, tmp_path):
    peft = pytest.importorskip("peft")
    model, tok = load_model_and_tokenizer(trl_model)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(model, tok, tmp_path, peft_config=cfg)
    with torch.no_grad():  # B = 0 at init would make the A gradients vanish: a weaker test
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    reference = frozen_copy(trainer, lambda: peft.get_peft_model(load_model_and_tokenizer(trl_model)[0], cfg))
    rounds, grads = _run(trainer)
    _check_round_against_reference(*rounds[0], grads[0], reference, trainer.num_generations, temperature=1.0)


def test_deepspeed_path_matches_the_folded_path(full_run, trl_model, tmp_path):
    """With DeepSpeed the gradient comes from TRL's own loss/backward (over the 2 accumulation chunks) and the lr
    is set from the synchronised gradient's norm at the optimizer step; run that path on CPU (forced) with the
    settings of the folded full fine-tuning run and compare step by step."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, **FULL)
    trainer._oblr_fold = False
    rounds, grads = _run(trainer)
    assert len(grads) == len(full_run.grads) == 2
    for (a, _), (b, _) in zip(full_run.rounds, rounds):
        assert torch.equal(a.input_ids, b.input_ids)  # same completions
    for ga, gb in zip(full_run.grads, grads):
        assert rel_err(gb, ga) < 1e-4
    for la, lb in zip(full_run.trainer.state.log_history[:2], trainer.state.log_history[:2]):
        for key in ("oblr/S", "oblr/V", "oblr/lr", "oblr/grad_norm"):
            assert lb[key] == pytest.approx(la[key], rel=1e-4, abs=1e-12), key
