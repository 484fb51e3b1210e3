"""method="auto" keeps per-row gradients dense after the backward when they are small next to their factors
(long sequences), and accumulate_grad_with_group_norms fuses the weighted gradient with the group norms:
norms, group norms and the weighted gradient must match the loop (rtol 1e-4)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_qwen3
from gradnorm_helpers import make_batch, rel_err

from oblr.gradnorm import BookKeeper, Dense, Outer, loop_per_sequence_grads
from oblr.gradnorm.assembly import keep_dense
from oblr.gradnorm.reference import trainable_parameters
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs

TOL = 1e-4


def _record(model, ids, am, rm, method="auto"):
    book = BookKeeper(model, method=method)
    with book.record():
        book.backward(sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm))
    return book


class Loop:
    """The one-backward-per-sequence reference (``loop_per_sequence_grads``), run once per batch; the same
    formulas as ``loop_sequence_sq_norms`` / ``loop_group_sq_norms`` / ``loop_weighted_grad``."""

    def __init__(self, model, ids, am, rm):
        self.grads = loop_per_sequence_grads(model, ids, am, rm)  # [B][param]

    def sq_norms(self):
        return torch.stack([sum(g.pow(2).sum() for g in row) for row in self.grads])

    def weighted(self, coeffs, rows=None):
        rows = range(len(self.grads)) if rows is None else rows
        return [sum(coeffs[i] * self.grads[i][j] for i in rows) for j in range(len(self.grads[0]))]

    def group_sq_norms(self, coeffs, gid):
        return torch.stack([sum(w.pow(2).sum() for w in self.weighted(coeffs, (gid == k).nonzero().flatten()))
                            for k in torch.unique(gid)])


def _kinds(book, name):
    (e,) = [e for e in book._entries if e.name == name]
    return [type(c).__name__ for c in e.contribs]


def test_keep_dense_rule():
    def outer(T, R, C):
        return Outer(torch.zeros(1, T, R), torch.zeros(1, T, C), (R, C))

    assert keep_dense(outer(512, 64, 64))  # long sequence: [R, C] is smaller than [T, R + C]
    assert not keep_dense(outer(4, 512, 512))  # short sequence, wide layer: keep the factors
    assert not keep_dense(Dense(torch.zeros(2, 3)))
    ids = Outer(torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, 8, 16), (50000, 16))
    assert not keep_dense(ids)  # an embedding table is never materialised per row for short inputs


@pytest.mark.parametrize("resp", [24, 60])
def test_tied_qwen3_long_sequences_match_loop(resp):
    """resp=24: head kept dense, input-embedding ids folded into it; resp=60: both kept and summed."""
    model = tiny_qwen3()
    B = 6
    ids, am, rm = make_batch(model.config.vocab_size, [3, 5, 2, 4, 1, 3], [resp, resp - 3, resp - 1, 5, resp, 2],
                             seed=11)
    book = _record(model, ids, am, rm)
    assert _kinds(book, "model.embed_tokens.weight") == ["Dense"]  # one dense tensor for the tied weight
    assert _kinds(book, "model.layers.0.mlp.up_proj.weight") == ["Dense"]
    ref = Loop(model, ids, am, rm)
    assert rel_err(book.sq_norms(), ref.sq_norms()) < TOL

    coeffs = torch.tensor([0.5, -1.0, 2.0, 0.0, -0.3, 1.2])
    params = trainable_parameters(model)
    want = ref.weighted(coeffs)
    for gid in ([0, 0, 1, 1, 2, 2], [2, 0, 2, 1, 0, 0]):  # contiguous (batched) and interleaved groups
        g = torch.tensor(gid)
        assert rel_err(book.group_sq_norms(coeffs, g), ref.group_sq_norms(coeffs, g)) < TOL
    total = book.accumulate_grad(coeffs)
    for p, w in zip(params, want):
        assert torch.allclose(p.grad, w, rtol=TOL, atol=1e-5 * w.abs().max())
        p.grad = None
    assert rel_err(total, sum(w.pow(2).sum() for w in want)) < TOL
    assert B == len(book.sq_norms())
    _check_fused(model, ref, book, coeffs, torch.tensor([0, 0, 1, 1, 2, 2]))


def _check_fused(model, ref, book, coeffs, gid):
    gk = book.accumulate_grad_with_group_norms(coeffs, gid)
    assert rel_err(gk, ref.group_sq_norms(coeffs, gid)) < TOL
    for p, w in zip(trainable_parameters(model), ref.weighted(coeffs)):
        assert torch.allclose(p.grad, w, rtol=TOL, atol=1e-5 * w.abs().max())
        p.grad = None


@pytest.fixture(scope="module")
def short_batch():
    model = tiny_qwen3()
    ids, am, rm = make_batch(model.config.vocab_size, [3, 5, 2, 4, 1, 3], [4, 2, 5, 3, 6, 1], seed=14)
    return model, ids, am, rm, Loop(model, ids, am, rm)


@pytest.mark.parametrize("gid", [[0, 0, 1, 1, 2, 2], [2, 0, 2, 1, 0, 0], [3, 3, 3, 3, 3, 3]])
def test_fused_group_norms_and_grad_short_sequences_match_loop(gid, short_batch):
    """Short sequences: nothing kept dense (ghost/materialised factors); groups contiguous or not, or one."""
    model, ids, am, rm, ref = short_batch
    coeffs = torch.tensor([0.5, -1.0, 2.0, 0.0, -0.3, 1.2])
    for method in ("auto", "ghost", "materialize"):
        book = _record(model, ids, am, rm, method=method)
        assert "Dense" not in _kinds(book, "model.layers.0.mlp.up_proj.weight")
        _check_fused(model, ref, book, coeffs, torch.tensor(gid))


def test_untied_llama_with_biases_long_sequences_match_loop():
    model = tiny_llama()
    ids, am, rm = make_batch(model.config.vocab_size, [2, 4, 3, 1], [40, 12, 25, 6], left_pad=False, seed=12)
    book = _record(model, ids, am, rm)
    assert _kinds(book, "lm_head.weight") == ["Dense"]
    assert _kinds(book, "model.layers.1.self_attn.q_proj.bias") == ["Dense"]
    ref = Loop(model, ids, am, rm)
    assert rel_err(book.sq_norms(), ref.sq_norms()) < TOL
    coeffs = torch.tensor([1.0, -0.5, 0.25, 2.0])
    g = torch.tensor([0, 0, 1, 1])
    assert rel_err(book.group_sq_norms(coeffs, g), ref.group_sq_norms(coeffs, g)) < TOL
    want = ref.weighted(coeffs)
    for fused in (False, True):
        for p in trainable_parameters(model):  # accumulate onto an existing .grad
            p.grad = torch.ones_like(p)
        if fused:
            book.accumulate_grad_with_group_norms(coeffs, g)
        else:
            book.accumulate_grad(coeffs)
        for p, w in zip(trainable_parameters(model), want):
            assert torch.allclose(p.grad, w + 1, rtol=TOL, atol=1e-5 * (w.abs().max() + 1))


def test_forced_methods_never_keep_dense():
    model = tiny_qwen3()
    ids, am, rm = make_batch(model.config.vocab_size, [3, 2], [40, 30], seed=13)
    for method in ("ghost", "materialize"):
        book = _record(model, ids, am, rm, method=method)
        assert _kinds(book, "model.embed_tokens.weight") == ["Outer", "Outer"], method
