"""OBLRGRPOTrainer with activation checkpointing on (non-reentrant): the update core runs on the two-pass norm
engine and w_i, the advantages and the gradient still match the one-sequence-at-a-time reference, for full
fine-tuning with gradient accumulation 2, LoRA (also with the KL term), and the DeepSpeed code path (forced on CPU).
With ``oblr_checkpointed_engine="recompute"`` the core runs the recompute engine instead: the same reference, and
the two-pass run's gradients and statistics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

import oblr.update  # noqa: E402
from oblr.gradnorm import RecomputeBookKeeper, TwoPassBookKeeper  # noqa: E402
from oblr.models import load_model_and_tokenizer  # noqa: E402

from .test_trl_trainer import FULL, _check_round_against_reference, _run  # noqa: E402
from .trl_helpers import frozen_copy, make_trainer, rel_err  # noqa: E402

CKPT = dict(FULL, activation_checkpointing=True)
ENGINES = {"two_pass": TwoPassBookKeeper, "recompute": RecomputeBookKeeper}  # oblr_checkpointed_engine -> book


@pytest.fixture
def books(monkeypatch):
    """The engines the update core builds (their types), recorded through ``oblr.update.make_book``."""
    made, orig = [], oblr.update.make_book

    def spy(*a, **kw):
        book = orig(*a, **kw)
        made.append(type(book))
        return book

    monkeypatch.setattr(oblr.update, "make_book", spy)
    return made


def _checkpointed(trainer):
    return any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.model.modules())


@pytest.fixture(scope="module")
def ckpt_run(trl_model, tmp_path_factory):
    """The folded path with checkpointing on, full fine-tuning, GA 2, and a frozen copy of its initial weights."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path_factory.mktemp("ckpt"), **CKPT)
    assert trainer.args.activation_checkpointing_kwargs == {"use_reentrant": False}
    reference = frozen_copy(trainer, lambda: load_model_and_tokenizer(trl_model)[0])
    made, orig = [], oblr.update.make_book
    oblr.update.make_book = lambda *a, **kw: made.append(orig(*a, **kw)) or made[-1]
    try:
        rounds, grads = _run(trainer)
    finally:
        oblr.update.make_book = orig
    return SimpleNamespace(trainer=trainer, reference=reference, rounds=rounds, grads=grads, books=made)


def test_full_finetuning_with_checkpointing_matches_one_at_a_time_reference(ckpt_run):
    trainer = ckpt_run.trainer
    assert ckpt_run.books and all(isinstance(b, TwoPassBookKeeper) for b in ckpt_run.books)
    assert _checkpointed(trainer)  # on (Trainer.train enables it), still on after generation switched it off
    assert len(ckpt_run.rounds) == 2 and len(ckpt_run.grads) == 2
    batch, res = ckpt_run.rounds[0]
    assert batch.input_ids.shape[0] == 16 and res.per_prompt_sq_norms.shape == (4,)  # GA 2: two chunks
    _check_round_against_reference(batch, res, ckpt_run.grads[0], ckpt_run.reference, trainer.num_generations,
                                   temperature=0.7)
    for logs in trainer.state.log_history[:2]:
        assert logs["learning_rate"] == pytest.approx(logs["oblr/lr"]) and logs["oblr/V"] > 0


def _same_steps(run_a, trainer_b, rounds_b, grads_b, rtol):
    """Two runs of the same seed: the same generation batches, gradients and logged statistics."""
    for (a, _), (b, _) in zip(run_a.rounds, rounds_b, strict=True):
        assert torch.equal(a.input_ids, b.input_ids)
    for ga, gb in zip(run_a.grads, grads_b, strict=True):
        assert rel_err(gb, ga) < rtol
    for la, lb in zip(run_a.trainer.state.log_history[:2], trainer_b.state.log_history[:2]):
        for key in ("oblr/S", "oblr/V", "oblr/lr", "oblr/grad_norm"):
            assert lb[key] == pytest.approx(la[key], rel=rtol, abs=1e-12), key


def test_recompute_engine_matches_the_reference_and_the_two_pass_run(ckpt_run, trl_model, tmp_path, books):
    """oblr_checkpointed_engine='recompute', full fine-tuning, GA 2: the first round against the
    one-sequence-at-a-time reference, and both optimizer steps' gradients, S, V, lr and ||gbar|| equal to the
    two-pass run's (same seed, same completions)."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, **CKPT, oblr_checkpointed_engine="recompute")
    reference = frozen_copy(trainer, lambda: load_model_and_tokenizer(trl_model)[0])
    rounds, grads = _run(trainer)
    assert books and all(b is RecomputeBookKeeper for b in books) and _checkpointed(trainer)
    assert len(rounds) == 2 and len(grads) == 2
    _check_round_against_reference(*rounds[0], grads[0], reference, trainer.num_generations, temperature=0.7)
    _same_steps(ckpt_run, trainer, rounds, grads, rtol=1e-5)


def test_lora_with_checkpointing_matches_one_at_a_time_reference(trl_model, tmp_path, books):
    peft = pytest.importorskip("peft")
    model, tok = load_model_and_tokenizer(trl_model)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(model, tok, tmp_path, peft_config=cfg, gradient_checkpointing=True)  # the old name
    assert trainer.args.activation_checkpointing
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    reference = frozen_copy(trainer, lambda: peft.get_peft_model(load_model_and_tokenizer(trl_model)[0], cfg))
    rounds, grads = _run(trainer)
    assert books and all(b is TwoPassBookKeeper for b in books) and _checkpointed(trainer)
    _check_round_against_reference(*rounds[0], grads[0], reference, trainer.num_generations, temperature=1.0)


@pytest.mark.parametrize("engine", ["two_pass", "recompute"])
def test_deepspeed_path_with_checkpointing_matches_the_folded_path(ckpt_run, trl_model, tmp_path, books, engine):
    """Under DeepSpeed the core only runs the norm pass (group norms, no gradient pass; the recompute engine: its
    one backward) and TRL's own loss and backward make the gradient, recomputing the checkpointed layers with no
    Tap left on them; the folded two-pass run is the reference."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, **CKPT, oblr_checkpointed_engine=engine)
    trainer._oblr_fold = False
    rounds, grads = _run(trainer)
    assert books and all(b is ENGINES[engine] for b in books)
    taps = [h for m in trainer.model.modules() for h in m._forward_hooks.values() if "_tap_hook" in h.__qualname__]
    assert not taps  # the Taps' hooks are gone before TRL's own forward and backward
    _same_steps(ckpt_run, trainer, rounds, grads, rtol=1e-4)


@pytest.mark.parametrize("engine", ["two_pass", "recompute"])
def test_kl_lora_with_checkpointing_matches_the_reference(trl_model, tmp_path, books, engine):
    """beta > 0 with a peft model: the reference is the same checkpointed model with its adapters off, and the
    core runs two norm passes (s_i, then obj_i with its KL term) before the gradient pass (the recompute engine:
    two backwards on the retained graph, the gradient from the second one's contributions)."""
    from .test_trl_kl_top_p import BETA, _check, _token_logprobs

    peft = pytest.importorskip("peft")
    model, tok = load_model_and_tokenizer(trl_model)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(model, tok, tmp_path, beta=BETA, peft_config=cfg, activation_checkpointing=True,
                           oblr_checkpointed_engine=engine)
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    policy = frozen_copy(trainer, lambda: peft.get_peft_model(load_model_and_tokenizer(trl_model)[0], cfg))
    base = load_model_and_tokenizer(trl_model)[0].eval()
    _check(trainer, policy, lambda ids, t, p: _token_logprobs(base, ids, t, p), 1.0, 1.0, BETA)
    assert books and all(b is ENGINES[engine] for b in books) and _checkpointed(trainer)


@pytest.mark.parametrize("engine", ["two_pass", "recompute"])
def test_chunked_output_layer_matches_one_at_a_time_reference(trl_model, tmp_path, monkeypatch, books, engine):
    """oblr_logit_chunk_tokens=4 (several chunks per row) on either checkpointed engine: the same check against
    the one-sequence-at-a-time reference (whole logits) as without chunks."""
    calls, orig = [], oblr.update.chunked_response_logprobs
    monkeypatch.setattr(oblr.update, "chunked_response_logprobs",
                        lambda *a, **kw: calls.append(kw["chunk"]) or orig(*a, **kw))
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, **CKPT, oblr_logit_chunk_tokens=4, oblr_checkpointed_engine=engine)
    reference = frozen_copy(trainer, lambda: load_model_and_tokenizer(trl_model)[0])
    rounds, grads = _run(trainer)
    assert books and all(b is ENGINES[engine] for b in books)
    batch, res = rounds[0]
    assert batch.input_ids.shape[1] > 8 and calls and set(calls) == {4}  # the chunked path, rows of 3+ chunks
    _check_round_against_reference(batch, res, grads[0], reference, trainer.num_generations, temperature=0.7)


def test_chunked_output_layer_refusals():
    from oblr.integrations.trl import OBLRGRPOConfig

    base = dict(output_dir="unused", per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                use_cpu=True, bf16=False, report_to=[])
    with pytest.raises(ValueError, match="oblr_logit_chunk_tokens=8 is not supported: with exact norms the "
                                         "chunked output layer needs a checkpointed engine"):
        OBLRGRPOConfig(**base, oblr_logit_chunk_tokens=8)
    with pytest.raises(ValueError, match="oblr_logit_chunk_tokens=-1 is not supported"):
        OBLRGRPOConfig(**base, oblr_logit_chunk_tokens=-1)
    with pytest.raises(ValueError, match="weighs outputs by their whole logits"):
        OBLRGRPOConfig(**base, oblr_logit_chunk_tokens=8, oblr_baseline="otb_proxy", oblr_snr_lr=False)
    cfg = OBLRGRPOConfig(**base, oblr_logit_chunk_tokens=8, activation_checkpointing=True)
    assert cfg.oblr_logit_chunk_tokens == 8
    # GRPO-style (no exact norms): chunks without checkpointing
    assert OBLRGRPOConfig(**base, oblr_logit_chunk_tokens=8, oblr_baseline="grpo", oblr_snr_lr=False)


def test_checkpointed_engine_option():
    """oblr_checkpointed_engine: two_pass by default, recompute with activation checkpointing; an unknown engine,
    or recompute without checkpointing, is refused in one line."""
    from oblr.integrations.trl import OBLRGRPOConfig

    base = dict(output_dir="unused", per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                use_cpu=True, bf16=False, report_to=[], learning_rate=1e-3)
    assert OBLRGRPOConfig(**base).oblr_checkpointed_engine == "two_pass"
    ok = OBLRGRPOConfig(**base, activation_checkpointing=True, oblr_checkpointed_engine="recompute")
    assert ok.oblr_checkpointed_engine == "recompute"
    with pytest.raises(ValueError, match=r"^OBLRGRPOConfig: oblr_checkpointed_engine='one_pass' is not supported: "
                                         r"it is not a checkpointed exact-norm engine; use one of recompute, two_pass$"):
        OBLRGRPOConfig(**base, activation_checkpointing=True, oblr_checkpointed_engine="one_pass")
    with pytest.raises(ValueError, match=r"^OBLRGRPOConfig: oblr_checkpointed_engine='recompute' is not supported: "
                                         r".*activation checkpointing, which is off; use activation_checkpointing=True"):
        OBLRGRPOConfig(**base, oblr_checkpointed_engine="recompute")
