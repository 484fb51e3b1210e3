"""Per-row gradients reduced into the two-pass Grams together (oblr.gradnorm.gram.row_gradients, GramSum): the
Grams of stacked same-shaped pieces, summed in order, are each piece's ``group_gram`` added one by one (bitwise on
CPU) and the Gram of per-row gradients formed by hand; what waits stays within ``slabs.SLAB_ELEMS``; the ghost path
and token ids are left to ``group_gram``; a two-pass norm pass reduces the linears and norm weights of every layer
with one batched Gram per shape, and its norms are bitwise those of reducing each contribution alone; the Tap
hooks detach a shared input once."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from oblr.gradnorm import gram, slabs
from oblr.gradnorm.contrib import Dense, Grouping, Outer
from oblr.gradnorm.gram import GramSum, group_gram, row_gradients

B = 6
GROUPINGS = {
    "contiguous": lambda: Grouping.from_groups(torch.ones(B), torch.arange(B) // 2),
    "interleaved": lambda: Grouping.from_groups(torch.ones(B), torch.tensor([2, 0, 2, 1, 0, 5])),
}


def _pieces(gen, shapes=((3, 4), (2, 7))):
    """Linears' factors (one per shape in ``shapes``) and a norm weight's per-row gradients."""
    outers = [Outer(torch.randn(B, 5, r, generator=gen), torch.randn(B, 5, c, generator=gen), (r, c)) for r, c in shapes]
    return outers + [Dense(torch.randn(B, 9, generator=gen))]


def _by_hand(c) -> torch.Tensor:
    """[B, n] float64 per-row gradients: row i's ``sum_t left[i, t] right[i, t]^T`` by a loop, or a Dense's rows."""
    if isinstance(c, Dense):
        return c.z.double()
    return torch.stack([sum(torch.outer(c.left[i, t].double(), c.right[i, t].double()) for t in range(c.T)).flatten()
                        for i in range(B)])


def _gram_by_hand(zs, grp) -> torch.Tensor:
    """[K, M, M] float64: <sum over pieces> of the rows' inner products within each group (padding slots zero)."""
    K, M = grp.index.shape
    out = torch.zeros(K, M, M, dtype=torch.float64)
    for k in range(K):
        for a in range(M):
            for b in range(M):
                if grp.scale[k, a] != 0 and grp.scale[k, b] != 0:
                    i, j = int(grp.index[k, a]), int(grp.index[k, b])
                    out[k, a, b] = sum(float(z[i] @ z[j]) for z in zs)
    return out


@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_stacked_grams_are_the_sum_of_each_pieces(grouping, monkeypatch):
    """Three linears of two shapes and a norm weight: one batched Gram per shape (the two (3, 4) linears stacked)."""
    grp = GROUPINGS[grouping]()
    pieces = _pieces(torch.Generator().manual_seed(0), shapes=((3, 4), (2, 7), (3, 4)))
    K, M = grp.index.shape
    calls = []
    real = gram.rows_gram
    monkeypatch.setattr(gram, "rows_gram", lambda z, split=None: calls.append(tuple(z.shape)) or real(z, split))
    sums = GramSum(grp)
    sums.add(group_gram([pieces[1]], grp, "ghost", mask=False))  # a Gram formed elsewhere, in its place
    for c in pieces:
        z = row_gradients(c, grp, "materialize")
        assert z.shape == (B, *c.shape) and z.dtype == torch.float32
        sums.add_rows(z)
    assert len(sums.waiting) == 3 and not calls  # nothing reduced before the flush
    total = sums.total()
    assert sorted(calls) == sorted([(2 * K, M, 12), (K, M, 14), (K, M, 9)])
    assert not sums.waiting and sums.elems == 0
    ref = _gram_by_hand([_by_hand(c) for c in [pieces[1]] + pieces], grp)
    assert torch.allclose(gram.mask_padding(total, grp).double(), ref, rtol=1e-5, atol=1e-5)
    one_by_one = torch.zeros(K, M, M)  # the engine's earlier way: each Gram added as it came
    one_by_one += group_gram([pieces[1]], grp, "ghost", mask=False)
    for c in pieces:
        one_by_one += group_gram([c], grp, "materialize", mask=False)
    assert torch.equal(total, one_by_one)


def test_ghost_and_token_ids_are_left_to_group_gram():
    grp = GROUPINGS["contiguous"]()
    lin, _, norm = _pieces(torch.Generator().manual_seed(1))
    assert row_gradients(lin, grp, "ghost") is None
    assert row_gradients(Outer(torch.randint(0, 4, (B, 5)), torch.randn(B, 5, 3), (4, 3)), grp, "auto") is None
    assert row_gradients(norm, grp, "ghost") is not None  # a Dense is its rows whatever the method
    assert torch.equal(row_gradients(norm, grp), norm.z)


def test_what_waits_stays_within_the_slab_budget(monkeypatch):
    """With a budget of 100 elements (pieces of 6 x 12, 6 x 14, 6 x 9 = 72, 84, 54 elements): a piece that would pass
    it reduces what waits first, one at least that large is reduced alone; every piece is reduced once."""
    monkeypatch.setattr(slabs, "SLAB_ELEMS", 100)
    grp = GROUPINGS["interleaved"]()
    pieces = _pieces(torch.Generator().manual_seed(2))
    grams = []
    real = gram.rows_gram
    monkeypatch.setattr(gram, "rows_gram", lambda z, split=None: grams.append(z.shape[2]) or real(z, split))
    sums = GramSum(grp)
    zs = [row_gradients(c, grp, "materialize") for c in pieces]
    for z in zs:
        sums.add_rows(z)
        assert sums.elems <= slabs.SLAB_ELEMS
    total = sums.total()
    assert grams == [12, 14, 9]  # 72 + 84 > 100: one Gram each
    ref = _gram_by_hand([_by_hand(c) for c in pieces], grp)
    assert torch.allclose(gram.mask_padding(total, grp).double(), ref, rtol=1e-5, atol=1e-5)
    grams.clear()
    monkeypatch.setattr(slabs, "SLAB_ELEMS", 60)
    sums = GramSum(grp)
    sums.add_rows(zs[0])  # 72 >= 60: reduced at once, alone
    assert grams == [12] and not sums.waiting
    sums.add_rows(zs[2])  # 54 waits
    assert grams == [12] and sums.elems == 54


def test_a_norm_pass_reduces_the_layers_with_one_gram(monkeypatch):
    """A two-pass norm pass on tiny Qwen3 (tied, checkpointed; "materialize"): the linears and norm weights of every
    layer wait and are reduced by one batched Gram per shape ([L B, 1, n]: each row alone); the tied embedding,
    kept for its cross terms, by one more. The norms it gives are the loop's (tests/gradnorm/test_gradnorm_twopass.py
    checks every method and grouping)."""
    from conftest import tiny_qwen3
    from gradnorm_helpers import checkpointed, make_batch, rel_err

    from oblr.gradnorm import TwoPassBookKeeper, loop_sequence_sq_norms
    from oblr.logprobs import sequence_logprobs, token_logprobs

    model = checkpointed(tiny_qwen3(seed=3))
    ids, am, rm = make_batch(model.config.vocab_size, [3, 4, 2, 5], [5, 2, 6, 4], seed=2)
    widths = []
    real = gram.rows_gram
    monkeypatch.setattr(gram, "rows_gram", lambda z, split=None: widths.append((z.shape[0], z.shape[2]))
                        or real(z, split))
    book = TwoPassBookKeeper(model, method="materialize")
    with book.record():
        seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq)
    w = book.sq_norms()
    book.clear()
    emb = model.get_input_embeddings().weight
    shapes = collections.Counter(tuple(p.shape) for p in model.parameters() if p is not emb)
    B = ids.shape[0]
    assert sorted(widths) == sorted([(L * B, math.prod(s)) for s, L in shapes.items()] + [(B, emb.numel())])
    assert max(shapes.values()) > 1  # the layers' parameters are stacked
    assert rel_err(w, loop_sequence_sq_norms(model, ids, am, rm)) < 1e-5


def test_a_shared_input_is_detached_once_and_not_kept():
    """The Tap hooks detach a tensor that several modules take (q/k/v, gate/up) once; the detached view is dropped
    with the tensor itself, so the hooks keep no activation alive."""
    import gc

    from conftest import tiny_qwen3

    from oblr.gradnorm import TwoPassBookKeeper

    book = TwoPassBookKeeper(tiny_qwen3(seed=3))
    x = torch.randn(2, 3, requires_grad=True) * 2
    d = book._detached(x)
    assert d is book._detached(x) and not d.requires_grad and d.data_ptr() == x.data_ptr()
    y = x + 1
    assert book._detached(y) is not d and len(book._inputs) == 2
    del x, d
    gc.collect()
    assert len(book._inputs) == 1  # y's only


@pytest.mark.parametrize("method", ["auto", "materialize"])
def test_a_norm_pass_gives_bitwise_the_norms_of_each_contribution_reduced_alone(monkeypatch, method):
    """The two-pass engine with the stacked Grams against the same engine with every contribution reduced by
    ``group_gram`` as it comes (``row_gradients`` patched to decline): on CPU the same numbers, bit for bit, for
    unequal interleaved groups (the order of the sums is kept: another moved a 2-process FSDP step's update past its
    tolerance)."""
    from conftest import tiny_qwen3
    from gradnorm_helpers import checkpointed, make_batch

    from oblr.gradnorm import TwoPassBookKeeper, twopass
    from oblr.logprobs import sequence_logprobs, token_logprobs

    model = checkpointed(tiny_qwen3(seed=3))
    ids, am, rm = make_batch(model.config.vocab_size, [3, 4, 2, 5, 3], [5, 2, 6, 4, 1], seed=2)
    gid = torch.tensor([2, 0, 2, 1, 0])
    coeffs = torch.randn(5, generator=torch.Generator().manual_seed(1))

    def norms():
        book = TwoPassBookKeeper(model, method=method)
        with book.record():
            seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
            book.backward(seq, group_ids=gid)
        out = book.sq_norms(), book.group_sq_norms(coeffs, gid)
        book.clear()
        return out

    stacked = norms()
    monkeypatch.setattr(twopass, "row_gradients", lambda c, grp, method: None)
    alone = norms()
    assert all(torch.equal(a, b) for a, b in zip(stacked, alone))
    assert stacked[0].min() > 0
