"""TwoPassBookKeeper with activation checkpointing on (non-reentrant): w_i, group norms and .grad against the
loop, on tiny Qwen3 (tied) / Llama (untied, biases) and peft LoRA; checkpointing really recomputes; misuse."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_qwen3
from gradnorm_helpers import assert_matches_loop, ragged_batch, rel_err
from gradnorm_helpers import checkpointed as _ckpt
from gradnorm_helpers import grad_err as _grad_err

from oblr.gradnorm import (
    BookKeeper,
    TwoPassBookKeeper,
    loop_group_sq_norms,
    loop_sequence_sq_norms,
    loop_weighted_grad,
    make_book,
)
from oblr.logprobs import sequence_logprobs, token_logprobs

RTOL = 1e-5


def _two_pass(model, ids, am, rm, coeffs, gid, method):
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    book = TwoPassBookKeeper(model, method=method)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq, group_ids=gid)
    w = book.sq_norms()
    gk = book.accumulate_grad_with_group_norms(coeffs, gid)
    book.clear()
    return w, gk, [p.grad.clone() for p in params]


@pytest.mark.parametrize("arch", ["qwen3_tied", "llama"])
@pytest.mark.parametrize("method", ["auto", "ghost", "materialize"])
def test_two_pass_matches_the_loop_with_checkpointing_on(arch, method):
    model = _ckpt(tiny_qwen3(seed=3) if arch == "qwen3_tied" else tiny_llama())
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(1))
    gid = torch.tensor([2, 0, 2, 1, 0, 2, 5])  # interleaved, unequal groups, ids not contiguous
    w_ref = loop_sequence_sq_norms(model, ids, am, rm)
    gk_ref = loop_group_sq_norms(model, ids, am, rm, coeffs, gid)
    g_ref = loop_weighted_grad(model, ids, am, rm, coeffs)
    w, gk, g = _two_pass(model, ids, am, rm, coeffs, gid, method)
    assert rel_err(w, w_ref) < RTOL
    assert rel_err(gk, gk_ref) < RTOL
    assert _grad_err(g, g_ref) < RTOL


@pytest.mark.parametrize("method,alone", [("auto", False), ("materialize", False), ("materialize", True)])
def test_two_pass_with_sliced_row_grams_matches_the_loop(monkeypatch, method, alone):
    """The Gram of materialised per-row gradients in slices (``gram.rows_gram``, CUDA's default) on CPU, with
    slices short enough that every layer is cut, a remainder included."""
    from oblr.gradnorm import gram

    calls = []
    real = gram.rows_gram
    monkeypatch.setattr(gram, "GRAM_SLICE", 7)
    monkeypatch.setattr(gram, "SPLIT_DEVICES", ("cpu",))
    monkeypatch.setattr(gram, "rows_gram", lambda z, split=None: calls.append(z.shape) or real(z, split))
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(1))
    gid = torch.arange(7) if alone else torch.tensor([2, 0, 2, 1, 0, 2, 5])  # alone: groups of one row
    w, gk, g = _two_pass(model, ids, am, rm, coeffs, gid, method)
    assert calls and any(n % 7 and n >= 14 for _, _, n in calls)  # sliced, with a remainder
    assert all((M == 1) == alone for _, M, _ in calls)
    assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, g, RTOL)


def test_rows_gram_slices_equal_one_product():
    from oblr.gradnorm.gram import GRAM_SLICE, rows_gram

    gen = torch.Generator().manual_seed(0)
    for n in (GRAM_SLICE - 1, 2 * GRAM_SLICE, 3 * GRAM_SLICE + 17):
        for M in (4, 1):
            z = torch.randn(3, M, n, generator=gen, dtype=torch.float64)
            ref = torch.bmm(z, z.transpose(1, 2))
            assert rows_gram(z, split=True).shape == (3, M, M)
            assert torch.allclose(rows_gram(z, split=True), ref, rtol=1e-12, atol=1e-9)
            assert torch.equal(rows_gram(z, split=False), ref)


def test_tf32_only_for_a_half_precision_models_factors_on_cuda():
    from oblr.gradnorm import precision
    from oblr.gradnorm.contrib import Dense, Outer
    from oblr.gradnorm.precision import half_factors, tf32_eligible, tf32_products

    assert tf32_eligible("cuda", [torch.bfloat16, torch.float16])
    assert not tf32_eligible("cuda", [torch.bfloat16, torch.float32])  # a float32 model: full precision
    assert not tf32_eligible("cpu", [torch.bfloat16])
    assert not tf32_eligible("cuda", [])
    x = torch.zeros(2, 3, 4, dtype=torch.bfloat16)
    assert not half_factors([Outer(x, x, (4, 4)), Dense(torch.zeros(2, 4))])  # on CPU
    assert not half_factors([Dense(torch.zeros(2, 4))])
    m = torch.backends.cuda.matmul

    def state():
        return (torch.backends.fp32_precision, m.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)

    before = state()
    with tf32_products(True):
        assert m.fp32_precision == "tf32"
    assert state() == before  # the default ("none": follow the global setting) comes back, nothing else moved
    with tf32_products(False):
        assert state() == before
    with pytest.raises(RuntimeError), tf32_products(True):
        raise RuntimeError("inside")
    assert state() == before
    m.fp32_precision = "ieee"  # a caller on torch's newer switches: no error, and its setting comes back
    try:
        with tf32_products(True):
            assert m.fp32_precision == "tf32"
        assert m.fp32_precision == "ieee"
    finally:
        m.fp32_precision = before[1]
    precision.TF32_HALF_PRODUCTS = False
    try:
        assert not tf32_eligible("cuda", [torch.bfloat16])
    finally:
        precision.TF32_HALF_PRODUCTS = True


def test_a_norm_pass_that_fails_leaves_no_stale_answers():
    """A second norm pass that raises half-way (here: in one layer's reduction) must not leave the first pass's
    grouping and batch in place next to half-filled Grams: the queries refuse instead of answering."""
    from oblr.gradnorm import twopass

    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    book = TwoPassBookKeeper(model)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq)
        assert book.sq_norms().shape == (ids.shape[0],)
        real, calls = twopass.TwoPassBookKeeper._take, []

        def fail_late(self, h, x, g):
            calls.append(h.path)
            if len(calls) == 3:
                raise RuntimeError("a layer failed")
            return real(self, h, x, g)

        twopass.TwoPassBookKeeper._take = fail_late
        try:
            with pytest.raises(RuntimeError, match="a layer failed"):
                book.backward(seq)
        finally:
            twopass.TwoPassBookKeeper._take = real
    with pytest.raises(RuntimeError, match="backward"):
        book.sq_norms()
    book.clear()


def test_two_pass_with_peft_lora_and_checkpointing():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        tiny_qwen3(seed=5), peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    _ckpt(model)
    ids, am, rm = ragged_batch(model.config.vocab_size)
    coeffs = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(3))
    gid = torch.arange(ids.shape[0]) // 3
    w, gk, g = _two_pass(model, ids, am, rm, coeffs, gid, "auto")
    assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, g, RTOL)
    assert all("lora_" in n for n in book_names(model))


def book_names(model):
    return TwoPassBookKeeper(model).parameter_names()


def test_checkpointed_blocks_are_recomputed_in_each_pass_and_grad_accumulates():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    calls = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *a: calls.append(1))
    assert isinstance(make_book(model), TwoPassBookKeeper) and type(make_book(model, method="loop")) is BookKeeper
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    coeffs = torch.linspace(-1, 1, ids.shape[0])
    book = make_book(model)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        assert len(calls) == 1
        book.backward(seq)
    assert len(calls) == 2  # the norm pass recomputed the block
    assert book.accumulate_grad(coeffs) is None
    assert len(calls) == 3  # and the gradient pass again
    assert all(p.requires_grad for p in params)
    ref = loop_weighted_grad(model, ids, am, rm, coeffs)
    assert _grad_err([p.grad - 1 for p in params], ref) < RTOL
    with pytest.raises(RuntimeError, match="gradient pass already ran"):
        book.accumulate_grad(coeffs)
    book.clear()
    assert not book._handles  # hooks are gone after clear()


def test_kl_style_second_norm_pass_replaces_the_first():
    model = _ckpt(tiny_qwen3(seed=3))
    ids, am, rm = ragged_batch(model.config.vocab_size)
    a = torch.linspace(0.5, 2.0, ids.shape[0])
    gid = torch.arange(ids.shape[0]) // 2
    book = TwoPassBookKeeper(model)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq, group_ids=gid)
    w1 = book.sq_norms()
    book.backward(a * seq, group_ids=gid)  # a second per-row objective of the same forward
    assert rel_err(book.sq_norms(), w1 * a * a) < RTOL
    ones = torch.ones_like(a)
    assert rel_err(book.group_sq_norms(ones, gid), loop_group_sq_norms(model, ids, am, rm, a, gid)) < RTOL
    book.clear()


def test_misuse_is_refused_in_one_line():
    model = _ckpt(tiny_qwen3(seed=3))
    with pytest.raises(ValueError, match="TwoPassBookKeeper"):
        BookKeeper(model)
    with pytest.raises(ValueError, match="grad_sink"):
        TwoPassBookKeeper(model, grad_sink=lambda p, inc: None)
    with pytest.raises(ValueError, match="loop"):
        TwoPassBookKeeper(model, method="loop")
    ids, am, rm = ragged_batch(model.config.vocab_size)
    gid = torch.arange(ids.shape[0]) // 2
    book = TwoPassBookKeeper(model)
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq, group_ids=gid)
    with pytest.raises(ValueError, match="group_ids differ"):
        book.group_sq_norms(torch.ones(ids.shape[0]), torch.arange(ids.shape[0]))
    book.clear()
    reentrant = _ckpt(tiny_qwen3(seed=3), reentrant=True)
    book = TwoPassBookKeeper(reentrant)
    with pytest.raises(RuntimeError, match="use_reentrant=False"):
        with book.record():
            token_logprobs(reentrant, ids, am)
    assert not book._handles
