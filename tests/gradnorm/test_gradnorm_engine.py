"""BookKeeper and sequence_grad_sq_norms against the one-backward-per-sequence loop (float32, rtol 1e-4)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import make_batch, rel_err

from oblr.gradnorm import (
    BookKeeper,
    loop_group_sq_norms,
    loop_per_sequence_grads,
    loop_sequence_sq_norms,
    loop_weighted_grad,
    sequence_grad_sq_norms,
)
from oblr.gradnorm.reference import trainable_parameters
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs

TOL = 1e-4
PROMPTS, RESPS = [3, 5, 2, 4, 1], [4, 2, 5, 3, 6]


def _record(model, ids, am, rm, method="auto"):
    book = BookKeeper(model, method=method)
    with book.record():
        seq_lp = sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm)
        book.backward(seq_lp)
    return book


@pytest.mark.parametrize("which", ["qwen3", "llama"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_sequence_norms_match_loop_all_methods(which, left_pad, qwen3_model, llama_model):
    model = qwen3_model if which == "qwen3" else llama_model
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, left_pad=left_pad, seed=3)
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    assert (ref > 0).all()
    for method in ("ghost", "materialize", "auto"):
        w = sequence_grad_sq_norms(model, ids, am, rm, method=method)
        assert w.dtype == torch.float32 and w.shape == (len(PROMPTS),)
        assert rel_err(w, ref) < TOL, method
    assert rel_err(sequence_grad_sq_norms(model, ids, am, rm, method="loop"), ref) < TOL  # via BookKeeper


def test_tied_parameters_deduplicated_and_cross_term_needed(qwen3_model):
    model = qwen3_model
    book = BookKeeper(model)
    names = book.parameter_names()
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert len(names) == len(trainable_parameters(model))
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=4)
    book = _record(model, ids, am, rm, method="ghost")
    (entry,) = [e for e in book._entries if e.name == "model.embed_tokens.weight"]
    assert len(entry.contribs) == 2  # embedding and head contributions to the same tensor
    # dropping the cross term would give a different (wrong) number
    from oblr.gradnorm.assembly import sq_norm
    from oblr.gradnorm.contrib import Grouping

    rows = Grouping.rows(len(PROMPTS))
    both = sq_norm([c.regroup(rows) for c in entry.contribs], "ghost")
    separate = sum(sq_norm([c.regroup(rows)], "ghost") for c in entry.contribs)
    ref = torch.stack([g[0].pow(2).sum() for g in loop_per_sequence_grads(model, ids, am, rm)])
    assert rel_err(both, ref) < TOL and rel_err(separate, ref) > 1e-3


def test_partly_frozen_model(llama_model):
    model = llama_model
    for p in model.model.embed_tokens.parameters():
        p.requires_grad_(False)
    for p in model.model.layers[0].parameters():
        p.requires_grad_(False)
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=5)
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    for method in ("ghost", "materialize", "auto"):
        assert rel_err(sequence_grad_sq_norms(model, ids, am, rm, method=method), ref) < TOL
    assert not model.model.embed_tokens.weight.requires_grad and model.lm_head.weight.requires_grad


def test_frozen_tied_embedding_and_first_layer(qwen3_model):
    model = qwen3_model
    model.model.embed_tokens.weight.requires_grad_(False)  # also freezes lm_head (tied)
    for p in model.model.layers[0].parameters():
        p.requires_grad_(False)
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=6)
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    assert rel_err(sequence_grad_sq_norms(model, ids, am, rm, method="auto"), ref) < TOL


def test_peft_lora_adapters_only():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_qwen3(), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    names = BookKeeper(model).parameter_names()
    assert names and all("lora_" in n for n in names)
    ids, am, rm = make_batch(61, PROMPTS, RESPS, seed=7)
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    assert (ref > 0).all()
    for method in ("ghost", "materialize", "auto"):
        assert rel_err(sequence_grad_sq_norms(model, ids, am, rm, method=method), ref) < TOL


@pytest.mark.parametrize("group_ids", [[0, 0, 1, 1, 2, 2], [2, 0, 2, 1, 0, 0], [5, 5, 5, 5, 5, 5]])
def test_group_norms_and_weighted_grad_match_loop(qwen3_model, group_ids):
    model = qwen3_model
    ids, am, rm = make_batch(model.config.vocab_size, [3, 5, 2, 4, 1, 3], [4, 2, 5, 3, 6, 1], seed=8)
    coeffs = torch.tensor([0.5, -1.0, 2.0, 0.0, -0.3, 1.2])
    gid = torch.tensor(group_ids)
    ref = loop_group_sq_norms(model, ids, am, rm, coeffs, gid)
    want = loop_weighted_grad(model, ids, am, rm, coeffs)
    params = trainable_parameters(model)
    for method in ("ghost", "materialize", "auto", "loop"):
        book = _record(model, ids, am, rm, method=method)
        gk = book.group_sq_norms(coeffs, gid)
        assert gk.shape == ref.shape and rel_err(gk, ref) < TOL, method
        assert all(p.grad is None for p in params)  # backward() left .grad untouched
        total = book.accumulate_grad(coeffs)
        for p, w in zip(params, want):
            assert torch.allclose(p.grad, w, rtol=TOL, atol=1e-5 * w.abs().max()), method
            p.grad = None
        assert rel_err(total, sum(w.pow(2).sum() for w in want)) < TOL


def test_accumulate_grad_equals_autograd_of_weighted_objective(llama_model):
    model = llama_model
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=9)
    coeffs = torch.tensor([1.0, -0.5, 0.25, 2.0, -1.5])
    params = trainable_parameters(model)
    seq_lp = sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm)
    auto = torch.autograd.grad((coeffs * seq_lp).sum(), params)
    book = _record(model, ids, am, rm)
    for p, a in zip(params, auto):  # accumulate onto an existing .grad
        p.grad = 0.5 * a.detach().clone()
    book.accumulate_grad(coeffs)
    for p, a in zip(params, auto):
        assert torch.allclose(p.grad, 1.5 * a, rtol=TOL, atol=1e-5 * a.abs().max())
    book.clear()
    with pytest.raises(RuntimeError, match="backward"):
        book.sq_norms()


def test_record_restores_state_after_exception(qwen3_model):
    model = qwen3_model
    model.model.layers[1].mlp.up_proj.weight.requires_grad_(False)
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    book = BookKeeper(model)
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=10)
    with pytest.raises(RuntimeError, match="boom"), book.record():
        assert not model.lm_head.weight.requires_grad  # weight grads switched off while recording
        forward_logits(model, ids, am)
        raise RuntimeError("boom")
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    assert all(not m._forward_hooks for m in model.modules())
    # and the keeper still works afterwards
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    assert rel_err(_record(model, ids, am, rm).sq_norms(), ref) < TOL


def test_backward_misuse_raises(qwen3_model):
    model = qwen3_model
    book = BookKeeper(model)
    ids, am, rm = make_batch(model.config.vocab_size, PROMPTS, RESPS, seed=11)
    with book.record():
        seq_lp = sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm)
        with pytest.raises(ValueError, match=r"\[B\]"):
            book.backward(seq_lp[None])
        book.backward(seq_lp)
        with pytest.raises(RuntimeError, match="already called"):
            book.backward(seq_lp)
    with pytest.raises(ValueError, match="coeffs must be"):
        book.accumulate_grad(torch.ones(3))
    with pytest.raises(ValueError, match="unknown gradient-norm method 'nope'; registered: auto, ghost, loop"):
        BookKeeper(model, method="nope")
    with book.record(), torch.no_grad(), pytest.raises(RuntimeError, match="embed_tokens.*gradients disabled"):
        forward_logits(model, ids, am)
    model.gradient_checkpointing_enable()
    with pytest.raises(ValueError, match="gradient checkpointing"):
        BookKeeper(model)
