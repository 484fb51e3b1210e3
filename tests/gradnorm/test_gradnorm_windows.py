"""Token windows: the one-pass engine skips each row's tokens whose output gradient is exactly zero (padding,
an output head's prompt tokens) in the ghost Grams and the per-group products, by per-row windows or by one
cropped span (``windows.trim_windows``, chosen by ``windows.row_windows_pay``). Norms, group norms and the
weighted gradient must still match the one-backward-per-sequence loop (rtol 1e-4) either way."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import make_batch, rel_err

from oblr.gradnorm import BookKeeper, Outer, loop_per_sequence_grads
from oblr.gradnorm.reference import trainable_parameters
from oblr.gradnorm.windows import token_windows
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs

TOL = 1e-4


def test_token_windows_finds_first_and_last_nonzero_token():
    g = torch.zeros(3, 10, 4)
    g[0, 2:5] = 1.0
    g[0, 7, 1] = -2.0  # a zero token inside the window stays inside
    g[2, 0] = 3.0
    c = Outer(g, torch.randn(3, 10, 5), (4, 5))
    assert token_windows(c) == ([2, 0, 0], [8, 0, 1])  # row 1 has no non-zero token: empty window
    ids = Outer(torch.zeros(2, 10, dtype=torch.long), g[:2], (7, 4))  # token ids: the factor is `right`
    assert token_windows(ids) == ([2, 0], [8, 0])
    full = Outer(torch.ones(2, 10, 4), torch.ones(2, 10, 5), (4, 5))
    assert token_windows(full) is None  # nothing to trim


def _windowed(book):
    return [e.name for e in book._entries for c in e.contribs if isinstance(c, Outer) and c.win is not None]


def _cropped(book, T):
    """Names of the Outers cropped to a span shorter than the batch's ``T``, without per-row windows."""
    return [e.name for e in book._entries for c in e.contribs
            if isinstance(c, Outer) and c.win is None and c.T < T]


@pytest.mark.parametrize("how", ["rows", "span"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_windows_match_loop(left_pad, how, monkeypatch):
    """``rows``: every per-row window kept (no host cost charged); ``span``: none kept (an infinite one), so the
    factors are cropped to the span of all rows' windows and every query stays batched."""
    from oblr.gradnorm import windows

    monkeypatch.setattr(windows, "ROW_DISPATCH_MACS", 0 if how == "rows" else float("inf"))
    model = tiny_qwen3(hidden=64)  # wide next to the short rows: ghost norms and factors kept
    ids, am, rm = make_batch(model.config.vocab_size, [3, 5, 2, 4, 1, 3], [2, 9, 1, 4, 3, 6], left_pad=left_pad,
                             seed=5)
    grads = loop_per_sequence_grads(model, ids, am, rm)
    coeffs = torch.tensor([0.5, -1.0, 2.0, 0.0, -0.3, 1.2])

    def weighted(rows):
        return [sum(coeffs[i] * grads[i][j] for i in rows) for j in range(len(grads[0]))]

    for method in ("auto", "ghost", "materialize"):
        book = BookKeeper(model, method=method)
        with book.record():
            book.backward(sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm))
        if how == "rows":
            names = _windowed(book)
            assert "lm_head.weight" in names or "model.embed_tokens.weight" in names
            assert "model.layers.0.mlp.down_proj.weight" in names
        else:
            assert not _windowed(book)
            names = _cropped(book, ids.shape[1])
            assert names  # some factors are cropped (their span drops at least 10 % of the tokens)
            if left_pad:  # the head's (or the tied embedding's) lose the padding and the shortest prompt
                assert "lm_head.weight" in names or "model.embed_tokens.weight" in names
        want = torch.stack([sum(g.pow(2).sum() for g in row) for row in grads])
        assert rel_err(book.sq_norms(), want) < TOL
        for gid in ([0, 0, 1, 1, 2, 2], [2, 0, 2, 1, 0, 0]):  # contiguous and interleaved groups
            g = torch.tensor(gid)
            want = torch.stack([sum(w.pow(2).sum() for w in weighted((g == k).nonzero().flatten()))
                                for k in torch.unique(g)])
            assert rel_err(book.group_sq_norms(coeffs, g), want) < TOL
        g = torch.tensor([0, 0, 1, 1, 2, 2])
        gk = book.accumulate_grad_with_group_norms(coeffs, g)
        assert rel_err(gk, book.group_sq_norms(coeffs, g)) < TOL
        for p, w in zip(trainable_parameters(model), weighted(range(6))):
            assert torch.allclose(p.grad, w, rtol=TOL, atol=1e-5 * w.abs().max()), method
            p.grad = None
        book.clear()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_token_windows_reads_whole_tokens_where_the_probe_sees_zeros(dtype):
    """Tokens whose first elements are zero but not the rest, at a row's edges and inside it; -0.0 and NaN
    (a layer's output gradient is -0.0 on padding and prompt tokens, e.g. gate_proj's)."""
    from oblr.gradnorm import windows

    n = windows.WINDOW_PROBE + 5
    g = torch.zeros(4, 12, n, dtype=dtype)
    g[0, 3:9] = 1.0
    g[0, 1, -1] = 2.0  # zero where the probe looks: still the window's first token
    g[0, 10, n - 2] = -1.0  # and its last
    g[1, 5, -1] = 3.0  # the probe sees nothing in the whole row
    g[2, 4:6] = 1.0
    g[2, 8, -1] = -0.0  # -0.0 is zero: it does not widen the window
    g[3, 2, 0] = float("nan")
    c = Outer(g, torch.randn(4, 12, 3), (n, 3))
    first, last = windows.token_windows(c)
    assert first[:2] == [1, 5] and last[:2] == [11, 6]
    assert (first[2], last[2]) == (4, 6)
    assert (first[3], last[3]) == (2, 3)
    exact = g.float().ne(0).any(-1) | g.float().isnan().any(-1)
    for k in range(4):  # never narrower than the exact window
        idx = exact[k].nonzero().flatten().tolist()
        assert first[k] <= idx[0] and last[k] >= idx[-1] + 1


def _windowed_outer(left, T, C, seed):
    """An Outer on ``left`` whose rows are zero outside hand-set windows (one row empty, one longer than a strip)."""
    gen = torch.Generator().manual_seed(seed)
    K = left.shape[0]
    right = torch.randn(K, T, C, generator=gen)
    c = Outer(left, right, (left.shape[-1] if left.is_floating_point() else 11, C))
    c.win = ([2, 0, 5, 0][:K], [9, 0, 6, T][:K])  # row 1 empty, row 3 the whole row (T > MIN_STRIP: strips)
    return c


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("ids", [False, True])
def test_windowed_self_norms_are_the_per_row_products_bit_for_bit(cached, ids):
    """The windowed ghost norm of a contribution with itself: each row's number is exactly (torch.equal) the
    ghost norm of that row's window as a one-row Outer, formed the plain way (``_self_inner`` of ``row``)."""
    from oblr.gradnorm import assembly, strips

    T = strips.MIN_STRIP + 20
    gen = torch.Generator().manual_seed(3)
    left = torch.randint(0, 11, (4, T), generator=gen) if ids else torch.randn(4, T, 6, generator=gen)
    c = _windowed_outer(left, T, 5, seed=4)
    got = assembly.ghost_inner(c, c, strips.GramCache() if cached else None)
    first, last = c.win
    want = torch.stack([torch.zeros(()) if last[k] <= first[k] else
                        assembly._self_inner(c.row(k, first[k], last[k]), None)[0] for k in range(4)])
    assert torch.equal(got, want)
    assert got[1] == 0 and bool((got[[0, 2, 3]] > 0).all())


def test_row_products_are_the_per_row_addmm_bit_for_bit():
    """The float32 per-group products of a windowed Outer: exactly (torch.equal) each row's ``[R, n] x [n, C]``
    product added with its coefficient, formed the plain way; a bf16 Outer (no shortcut) agrees with float32 math."""
    from oblr.gradnorm.contrib import Grouping, regroup_for_products

    T = 12
    gen = torch.Generator().manual_seed(6)
    c = _windowed_outer(torch.randn(4, T, 6, generator=gen), T, 5, seed=7)
    grp = Grouping.from_groups(torch.tensor([0.5, -1.0, 2.0, 0.25]), torch.tensor([1, 0, 1, 1]))
    got = regroup_for_products(c, grp).materialize()
    first, last = c.win
    want = torch.zeros(2, 6, 5)
    for k, rows in enumerate(([1], [0, 2, 3])):
        for i in rows:
            if last[i] > first[i]:
                want[k].addmm_(c.left[i, first[i]:last[i]].T, c.right[i, first[i]:last[i]],
                               alpha=float(grp.coeff[i]))
    assert torch.equal(got, want)
    assert not torch.equal(want[1], torch.zeros(6, 5))
    half = Outer(c.left.bfloat16(), c.right.bfloat16(), c.shape, c.win)
    ref = regroup_for_products(Outer(half.left.float(), half.right.float(), c.shape, c.win), grp).materialize()
    assert torch.allclose(regroup_for_products(half, grp).materialize(), ref, rtol=1e-5, atol=1e-5)


def test_trim_windows_crops_to_the_rows_span_and_keeps_row_windows_only_where_they_pay(monkeypatch):
    """The span is [min first, max last) over the non-empty rows (an empty row adds nothing); the row windows
    are shifted into it; they are kept exactly when the skipped multiply-adds (one product, one ghost norm per
    row, ``row_windows_pay``) exceed ``ROW_DISPATCH_MACS`` per row."""
    from oblr.gradnorm import windows
    from oblr.gradnorm.contrib import MEMORY_COST
    from oblr.gradnorm.strips import strip_entries

    T, R, C = 12, 6, 5
    left = torch.zeros(3, T, R)
    left[0, 3:7] = 1.0
    left[2, 5:10] = 2.0  # row 1 is zero: an empty window
    c = Outer(left, torch.randn(3, T, C), (R, C))

    def work(n):
        return n * R * C + strip_entries(n) * (R + C + MEMORY_COST)

    saved = (work(7) - work(4)) + work(7) + (work(7) - work(5))  # span 3:10 (7 tokens); row 1 skips all
    monkeypatch.setattr(windows, "ROW_DISPATCH_MACS", saved / 3 - 1)
    out = windows.trim_windows(c)
    assert out.T == 7 and torch.equal(out.left, left[:, 3:10]) and torch.equal(out.right, c.right[:, 3:10])
    assert out.win == ([0, 0, 2], [4, 0, 7])
    monkeypatch.setattr(windows, "ROW_DISPATCH_MACS", saved / 3)
    out = windows.trim_windows(c)
    assert out.T == 7 and out.win is None
    full = Outer(torch.ones(2, T, R), torch.ones(2, T, C), (R, C))
    assert windows.trim_windows(full) is full and full.win is None  # nothing to trim: the contribution itself
    zero = Outer(torch.zeros(2, T, R), torch.ones(2, T, C), (R, C))
    assert windows.trim_windows(zero).win == ([0, 0], [0, 0])  # every row zero: empty windows, not an empty span


def test_many_short_rows_of_a_small_model_are_cropped_not_looped():
    """At the default cost the built-in model's shape at the paper's 128 x 8 (short rows, width 128) skips the
    per-row loops (their dispatch outweighs the tokens saved); long rows of a wide layer keep them."""
    from oblr.gradnorm import windows

    small = torch.zeros(64, 24, 128)
    small[:, 16:] = 1.0  # a head's gradient: zero on a 16-token prompt
    small[::2, 20:] = 0.0  # half the rows end early
    out = windows.trim_windows(Outer(small, torch.randn(64, 24, 128), (128, 128)))
    assert out.T == 8 and out.win is None
    wide = torch.zeros(4, 512, 512)
    wide[:, :100] = 1.0
    wide[0, :500] = 1.0  # one long row: the span is 500 tokens, the others use 100
    out = windows.trim_windows(Outer(wide, torch.randn(4, 512, 256), (512, 256)))
    assert out.T == 500 and out.win == ([0, 0, 0, 0], [500, 100, 100, 100])


@pytest.mark.parametrize("seed", range(6))
def test_token_span_is_the_span_of_the_row_windows(seed):
    """``token_span`` (the cheap search of the span-only path) equals [min first, max last) of ``token_windows``
    over the non-empty rows, with tokens zero where the probe looks, -0.0 and NaN; None when all is zero."""
    from oblr.gradnorm import windows

    gen = torch.Generator().manual_seed(seed)
    n = windows.WINDOW_PROBE + 4
    K, T = 5, 14
    g = torch.zeros(K, T, n)
    for k in range(K):
        if k == seed % K:
            continue  # one empty row
        a = int(torch.randint(0, T - 1, (1,), generator=gen))
        b = int(torch.randint(a + 1, T + 1, (1,), generator=gen))
        g[k, a:b] = torch.randn(b - a, n, generator=gen)
        g[k, a, :windows.WINDOW_PROBE] = 0.0  # the probe sees nothing at the row's first token
        g[k, a, -1] = 1.0
    g[0, -1, 0] = -0.0
    if seed == 3:
        g[1, 0, -1] = float("nan")
    c = Outer(g, torch.randn(K, T, 3), (n, 3))
    first, last = windows.token_windows(c) or ([0] * K, [T] * K)
    live = [k for k in range(K) if last[k] > first[k]]
    assert windows.token_span(c) == (min(first[k] for k in live), max(last[k] for k in live))
    assert windows.token_span(Outer(torch.zeros(K, T, n), torch.randn(K, T, 3), (n, 3))) is None


def test_the_span_only_path_crops_at_least_the_trim_fraction(monkeypatch):
    """Where no row's window can pay (one row's whole work within ROW_DISPATCH_MACS) only the span is searched:
    it crops when it drops at least TRIM_MIN_FRACTION of the tokens, and leaves the contribution whole otherwise."""
    from oblr.gradnorm import windows

    monkeypatch.setattr(windows, "token_windows", lambda c: pytest.fail("the per-row search ran"))
    g = torch.zeros(3, 20, 4)
    g[:, 2:19] = 1.0  # span 2:19 drops 3 of 20 tokens (15 %)
    out = windows.trim_windows(Outer(g, torch.randn(3, 20, 5), (4, 5)))
    assert (out.T, out.win) == (17, None) and torch.equal(out.left, g[:, 2:19])
    g[:, 1] = 1.0  # span 1:19 drops 2 of 20 (10 %): still cropped
    assert windows.trim_windows(Outer(g, torch.randn(3, 20, 5), (4, 5))).T == 18
    g[:, 0] = 1.0  # 0:19 drops 1 of 20 (5 %): whole
    c = Outer(g, torch.randn(3, 20, 5), (4, 5))
    assert windows.trim_windows(c) is c
