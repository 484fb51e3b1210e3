"""Symmetric Grams as lower-triangle strips (strips.sym_strips / strips_dot / assembly.ghost_inner with a is b)
against the full Grams and against materialised per-row gradients, float64 so that only the algebra is compared."""

from __future__ import annotations

import pytest
import torch

from oblr.gradnorm import assembly, contrib
from oblr.gradnorm import strips as strips_module
from oblr.gradnorm.assembly import ghost_inner
from oblr.gradnorm.contrib import Outer
from oblr.gradnorm.strips import GramCache, strip_bounds, strip_entries, strips_dot, sym_strips

LENGTHS = (1, 5, 16, 17, 33, 100, 161)


@pytest.mark.parametrize("strips", [1, 2, 4, 7])
def test_strips_cover_the_lower_triangle_once(strips, monkeypatch):
    monkeypatch.setattr(strips_module, "GRAM_STRIPS", strips)
    monkeypatch.setattr(strips_module, "MIN_STRIP", 4)
    for T in LENGTHS:
        seen = torch.zeros(T, T, dtype=torch.long)
        for s, w in strip_bounds(T):
            seen[s:, s:s + w] += 1
        lower = torch.tril(torch.ones(T, T, dtype=torch.long))
        assert torch.equal(seen * lower, lower), T  # every entry on or below the diagonal exactly once
        assert int(seen.sum()) == strip_entries(T) <= T * T
    # long rows: about (n + 1) / (2 n) of the full square
    assert strip_entries(4096) / 4096 ** 2 == pytest.approx((strips + 1) / (2 * strips), rel=0.02)


@pytest.mark.parametrize("strips", [1, 2, 4, 7])
def test_strips_dot_equals_full_gram_inner_product(strips, monkeypatch):
    monkeypatch.setattr(strips_module, "GRAM_STRIPS", strips)
    monkeypatch.setattr(strips_module, "MIN_STRIP", 4)
    gen = torch.Generator().manual_seed(0)
    for T in LENGTHS:
        a = torch.randn(3, T, 9, generator=gen, dtype=torch.float64)
        b = torch.randn(3, T, 5, generator=gen, dtype=torch.float64)
        ids = torch.randint(0, 4, (3, T), generator=gen)  # repeats: off-diagonal ones in the equality Gram
        full_a, full_b = a @ a.mT, b @ b.mT
        full_ids = (ids[:, :, None] == ids[:, None, :]).double()
        want = (full_a * full_b).sum((1, 2))
        torch.testing.assert_close(strips_dot(sym_strips(a), sym_strips(b)), want, rtol=1e-12, atol=0)
        want_ids = (full_ids * full_b).sum((1, 2))
        got_ids = strips_dot(sym_strips(ids, torch.float64), sym_strips(b))
        torch.testing.assert_close(got_ids, want_ids, rtol=1e-12, atol=0)


def _windowed(o: Outer, first, last) -> Outer:
    """``o`` with its left factor zeroed outside each row's window, and the windows set."""
    left = o.left.clone()
    for k, (a, b) in enumerate(zip(first, last)):
        left[k, :a] = 0
        left[k, b:] = 0
    return Outer(left, o.right, o.shape, (first, last))


@pytest.mark.parametrize("T", [3, 20, 70])
@pytest.mark.parametrize("min_strip", [4, 48])
def test_ghost_self_inner_matches_materialised_rows(T, min_strip, monkeypatch):
    monkeypatch.setattr(strips_module, "MIN_STRIP", min_strip)
    gen = torch.Generator().manual_seed(T)
    K, R, C, V = 4, 6, 11, 7
    x = torch.randn(K, T, C, generator=gen, dtype=torch.float64)
    lin = Outer(torch.randn(K, T, R, generator=gen, dtype=torch.float64), x, (R, C))
    emb = Outer(torch.randint(0, V, (K, T), generator=gen), x, (V, C))
    for o in (lin, emb):
        want = o.materialize().reshape(K, -1).pow(2).sum(1)
        torch.testing.assert_close(ghost_inner(o, o), want, rtol=1e-12, atol=0)
        torch.testing.assert_close(ghost_inner(o, o, GramCache()), want, rtol=1e-12, atol=0)
    # two parameters reading the same input share its strips through the cache: both still exact
    other = Outer(torch.randn(K, T, R + 2, generator=gen, dtype=torch.float64), x, (R + 2, C))
    cache = GramCache()
    for o in (lin, other):
        want = o.materialize().reshape(K, -1).pow(2).sum(1)
        torch.testing.assert_close(ghost_inner(o, o, cache), want, rtol=1e-12, atol=0)
    # per-row token windows (the CPU path): rows of different lengths, one empty
    first, last = [0, 1, T // 2, 0], [T, T - 1, T, 0]
    w = _windowed(lin, first, last)
    want = w.materialize().reshape(K, -1).pow(2).sum(1)
    torch.testing.assert_close(ghost_inner(w, w, GramCache()), want, rtol=1e-12, atol=0)


def test_ghost_cost_counts_a_self_pair_by_its_strips():
    T, R, C = 160, 576, 1536
    o = Outer(torch.zeros(1, T, R), torch.zeros(1, T, C), (R, C))
    assert assembly.ghost_cost([o]) == strip_entries(T) * (R + C + contrib.MEMORY_COST)
    ids = Outer(torch.zeros(1, T, dtype=torch.long), torch.zeros(1, T, C), (R, C))
    both = assembly.ghost_cost([o, ids])
    assert both == strip_entries(T) * (R + C + contrib.MEMORY_COST) + strip_entries(T) * (1 + C + contrib.MEMORY_COST) \
        + 2 * T * T * (1 + C + contrib.MEMORY_COST)


def test_other_devices_form_one_full_product():
    """Strips are a CPU path: on any other device (meta here, standing for CUDA, where 16 strips made the step
    launch-bound on an H200) a Gram is one product, and the engine's cost model counts it whole."""
    T, R, C = 160, 576, 1536
    assert strips_module.gram_strips("cpu") == strips_module.GRAM_STRIPS > 1 and strips_module.gram_strips("cuda") == 1
    assert strip_bounds(T, "cuda") == [(0, T)] and strip_entries(T, "cuda") == T * T
    assert strip_entries(T, "cpu") < T * T
    (one,) = sym_strips(torch.zeros(2, T, 8, device="meta"))
    assert one.shape == (2, T, T)
    o = Outer(torch.zeros(1, T, R, device="meta"), torch.zeros(1, T, C, device="meta"), (R, C))
    assert assembly.ghost_cost([o]) == T * T * (R + C + contrib.MEMORY_COST)


def test_one_full_strip_is_the_plain_inner_product(monkeypatch):
    """A single strip (the path other devices take) counts each entry once."""
    monkeypatch.setattr(strips_module, "GRAM_STRIPS", 1)
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(3, 70, 9, generator=gen, dtype=torch.float64)
    b = torch.randn(3, 70, 5, generator=gen, dtype=torch.float64)
    (sa,), (sb,) = sym_strips(a), sym_strips(b)
    assert sa.shape == (3, 70, 70)
    torch.testing.assert_close(strips_dot([sa], [sb]), ((a @ a.mT) * (b @ b.mT)).sum((1, 2)), rtol=1e-12, atol=0)
