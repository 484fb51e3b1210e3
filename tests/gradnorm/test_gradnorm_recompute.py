"""RecomputeBookKeeper (one-pass book-keeping under activation checkpointing): w_i, group norms and .grad
against the loop with checkpointing on, on tiny Qwen3 (tied) / Llama (untied, biases), chunked logits and peft
LoRA; each layer is recomputed once and no gradient pass runs; a KL-style second objective; misuse."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_qwen3
from gradnorm_helpers import assert_matches_loop, ragged_batch, rel_err
from gradnorm_helpers import checkpointed as _ckpt
from gradnorm_helpers import grad_err as _grad_err

from oblr.gradnorm import (
    RecomputeBookKeeper,
    loop_group_sq_norms,
    loop_weighted_grad,
    make_book,
)
from oblr.logprobs import chunked_response_logprobs, sequence_logprobs, token_logprobs

RTOL = 1e-5


def _recompute(model, ids, am, rm, coeffs, gid, method, seq_fn=None):
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    book = RecomputeBookKeeper(model, method=method)
    with book.record():
        seq = (seq_fn or (lambda: sequence_logprobs(token_logprobs(model, ids, am), rm)))()
        book.backward(seq, group_ids=gid)
    w = book.sq_norms()
    gk = book.group_sq_norms(coeffs, gid)
    gk2 = book.accumulate_grad_with_group_norms(coeffs, gid)
    assert torch.allclose(gk, gk2, rtol=1e-5)
    book.clear()
    return w, gk, [p.grad.clone() for p in params]


@pytest.mark.parametrize("arch", ["qwen3_tied", "llama"])
@pytest.mark.parametrize("method", ["auto", "ghost", "materialize"])
def test_recompute_engine_matches_the_loop_with_checkpointing_on(arch, method):
    model = _ckpt(tiny_qwen3(seed=3) if arch == "qwen3_tied" else tiny_llama())
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(1))
    gid = torch.tensor([2, 0, 2, 1, 0, 2, 5])  # interleaved, unequal groups, ids not contiguous
    w, gk, g = _recompute(model, ids, am, rm, coeffs, gid, method)
    assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, g, RTOL)


def test_recompute_engine_with_the_output_layer_in_chunks():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(4))
    gid = torch.arange(ids.shape[0]) // 3

    def chunked():
        return sequence_logprobs(chunked_response_logprobs(model, ids, am, rm, chunk=2)[0], rm)

    w, gk, g = _recompute(model, ids, am, rm, coeffs, gid, "auto", seq_fn=chunked)
    assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, g, RTOL)


def test_recompute_engine_with_peft_lora():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_qwen3(seed=5), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    _ckpt(model)
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(3))
    gid = torch.arange(ids.shape[0]) // 3
    w, gk, g = _recompute(model, ids, am, rm, coeffs, gid, "auto")
    assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, g, RTOL)
    assert all("lora_" in n for n in RecomputeBookKeeper(model).parameter_names())


def test_each_block_is_recomputed_once_and_no_gradient_pass_runs():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    calls = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: calls.append(1))
    assert isinstance(make_book(model, engine="recompute"), RecomputeBookKeeper)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    coeffs = torch.linspace(-1, 1, ids.shape[0])
    book = make_book(model, engine="recompute")
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        assert len(calls) == 1
        book.backward(seq)
    assert len(calls) == 2  # the one backward recomputed the block
    assert not book._handles  # and the hooks are gone with the graph
    sq = book.accumulate_grad(coeffs)
    assert len(calls) == 2  # no gradient pass
    assert all(p.requires_grad for p in params)
    ref = loop_weighted_grad(model, ids, am, rm, coeffs)
    assert _grad_err([p.grad - 1 for p in params], ref) < RTOL
    assert rel_err(sq, sum(r.pow(2).sum() for r in ref)) < RTOL
    book.clear()


def test_kl_style_second_objective_replaces_the_first():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    a = torch.linspace(0.5, 2.0, ids.shape[0])
    gid = torch.arange(ids.shape[0]) // 2
    book = RecomputeBookKeeper(model)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq, retain_graph=True)
    w1 = book.sq_norms()
    book.backward(a * seq)  # a second per-row objective of the same forward
    assert rel_err(book.sq_norms(), w1 * a * a) < RTOL
    ones = torch.ones_like(a)
    assert rel_err(book.group_sq_norms(ones, gid), loop_group_sq_norms(model, ids, am, rm, a, gid)) < RTOL
    with pytest.raises(RuntimeError, match="already called"):
        book.backward(seq)
    book.clear()


def test_a_failed_backward_answers_nothing_and_misuse_is_refused():
    model = _ckpt(tiny_qwen3(seed=3))
    with pytest.raises(ValueError, match="loop"):
        RecomputeBookKeeper(model, method="loop")
    ids, am, rm = ragged_batch(model.config.vocab_size)
    book = RecomputeBookKeeper(model)
    with pytest.raises(RuntimeError, match="nothing recorded"):
        book.backward(torch.zeros(3, requires_grad=True))
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
    boom = book._take

    def fail_late(h, x, g):
        if h.path.endswith("layers.0.mlp.down_proj"):
            raise RuntimeError("boom")
        boom(h, x, g)

    book._take = fail_late
    with pytest.raises(RuntimeError, match="boom"):
        book.backward(seq)
    with pytest.raises(RuntimeError, match="backward"):
        book.sq_norms()
    assert all(not e.contribs for e in book._entries)
    book.clear()
    reentrant = _ckpt(tiny_qwen3(seed=3), reentrant=True)
    book = RecomputeBookKeeper(reentrant)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        with book.record():
            token_logprobs(reentrant, ids, am)
    assert not book._handles


def test_a_sharded_model_without_a_grad_sink_is_refused(monkeypatch):
    """On an FSDP2-sharded model the increments must go to the sharded .grad (a grad_sink); written as whole
    tensors into DTensor parameters they would be wrong, so the engine refuses before any forward."""
    import oblr.gradnorm.recompute as recompute

    model = _ckpt(tiny_qwen3(seed=3))
    monkeypatch.setattr(recompute, "fsdp_sharded", lambda m: True)
    with pytest.raises(ValueError, match="FSDP2-sharded model needs a grad_sink"):
        RecomputeBookKeeper(model)
    RecomputeBookKeeper(model, grad_sink=lambda p, inc: None)  # with a sink: accepted


def test_grad_sink_receives_every_increment():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    got = {}
    book = RecomputeBookKeeper(model, grad_sink=lambda p, inc: got.__setitem__(id(p), inc.clone()))
    with book.record():
        book.backward(sequence_logprobs(token_logprobs(model, ids, am), rm))
    coeffs = torch.linspace(-1, 1, ids.shape[0])
    book.accumulate_grad(coeffs)
    book.clear()
    params = [p for p in model.parameters() if p.requires_grad]
    assert all(p.grad is None for p in params)
    ref = loop_weighted_grad(model, ids, am, rm, coeffs)
    assert _grad_err([got[id(p)].reshape(p.shape) for p in params], ref) < RTOL
