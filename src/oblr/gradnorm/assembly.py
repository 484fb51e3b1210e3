"""Squared norms and sums of a parameter's stored contributions, by ghost norm or materialisation, in chunks.

:func:`sq_norm` gives ``||sum_c G_c[k]||^2`` per sample: by ghost inner products of the Outer factors
(:func:`ghost_inner`, on :mod:`.strips`' Grams) or by materialising each sample, whichever the cost model
finds cheaper (:func:`use_ghost`: :func:`ghost_cost` against ``Outer.materialize_cost``). :func:`materialized_sum`
and :func:`grouped_sums` materialise the sums themselves (the weighted gradient, and the group norms with it);
:func:`keep_dense` says when an Outer is better stored materialised right after the backward pass. Work is
done in chunks of samples bounded by :data:`CHUNK_ELEMS` (:func:`chunks`).
"""

from __future__ import annotations

import torch

from .contrib import (
    MEMORY_COST,
    Contribution,
    Dense,
    Grouping,
    Outer,
    RowProducts,
    numel,
    regroup_for_products,
)
from .strips import GramCache, strip_entries, strips_dot, sym_strips

Tensor = torch.Tensor

#: an Outer is materialised once after the backward pass when its per-row gradients [K, R, C] (float32)
#: take at most this many times the memory of its factors (see :func:`keep_dense`)
KEEP_DENSE_SLACK = 1.0

#: elements one chunk of per-sample Gram or materialised matrices may hold (float32: 256 MiB)
CHUNK_ELEMS = 1 << 26


def _one_or_cat(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``, or the single part itself (no copy, no operator)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def chunks(K: int, per_item: int, budget: int = CHUNK_ELEMS):
    """``(k0, k1)`` ranges covering ``K`` samples of ``per_item`` elements each, at most ``budget`` elements (and
    at least one sample) per range."""
    step = max(1, budget // max(1, per_item))
    for k0 in range(0, K, step):
        yield k0, min(K, k0 + step)


def left_gram(a: Outer, b: Outer) -> Tensor:
    """[K, Ta, Tb] inner products of left factors (one-hot ids handled without materialising)."""
    if a.is_index and b.is_index:
        return (a.left[:, :, None] == b.left[:, None, :]).float()
    if a.is_index:
        return b.left.gather(2, a.left[:, None, :].expand(-1, b.T, -1)).transpose(1, 2)
    if b.is_index:
        return a.left.gather(2, b.left[:, None, :].expand(-1, a.T, -1))
    return torch.bmm(a.left, b.left.transpose(1, 2))


def _self_inner(a: Outer, rs: list[Tensor] | None) -> Tensor:
    """``||G_a[k]||^2`` from the strips of both Grams (``rs``: the right factor's, if already formed)."""
    return strips_dot(sym_strips(a.left, a.right.dtype), sym_strips(a.right) if rs is None else rs)


def ghost_inner(a: Outer, b: Outer, cache: GramCache | None = None) -> Tensor:
    """<G_a[k], G_b[k]> = sum_{t,s} (left_a,t . left_b,s)(right_a,t . right_b,s). [K] float32.

    With ``a is b`` both Grams are symmetric and only their lower-triangle strips are formed
    (:func:`sym_strips`, :func:`strips_dot`)."""
    if a.win is not None or b.win is not None:
        return _ghost_inner_windows(a, b, cache)
    out = []
    for k0, k1 in chunks(a.K, 2 * a.T * b.T):
        ac, bc = a.slice(k0, k1), b.slice(k0, k1)
        if a is b:
            out.append(_self_inner(ac, None if cache is None else cache.strips(a.right, k0, k1)))
            continue
        if cache is not None and a.right is b.right:
            gr = cache.gram(a.right, k0, k1)
        else:
            gr = torch.bmm(ac.right, bc.right.transpose(1, 2))
        lg = left_gram(ac, bc)
        out.append(torch.linalg.vecdot(lg.reshape(k1 - k0, -1), gr.reshape(k1 - k0, -1)))
    return _one_or_cat(out)


def _self_inner_windows(a: Outer, cache: GramCache | None) -> Tensor:
    """``||G_a[k]||^2`` row by row over each row's token window: for each row, :func:`_self_inner` of
    ``a.row(k, first, last)`` -- the same products of the same views -- with fewer host-side operators (each
    factor split into its rows once, no per-row Outer, the rows' results concatenated rather than selected and
    stacked): at a small model's shapes this loop is bound by dispatch, not by its products
    (``benchmarks/profile_update.py``)."""
    first, last = a.win if a.win is not None else ([0] * a.K, [a.T] * a.K)
    lefts = a.left.split(1)
    rights = a.right.split(1) if cache is None else None
    out = []
    for k, (f, n) in enumerate(zip(first, last)):
        if n <= f:
            out.append(a.right.new_zeros(1, dtype=torch.float32))
            continue
        rs = sym_strips(rights[k][:, f:n]) if cache is None else cache.strips_row(a.right, k, f, n)
        out.append(strips_dot(sym_strips(lefts[k][:, f:n], a.right.dtype), rs))
    return torch.cat(out)


def _ghost_inner_windows(a: Outer, b: Outer, cache: GramCache | None) -> Tensor:
    """:func:`ghost_inner` row by row over each row's token windows (an Outer without windows: all tokens)."""
    if a is b:
        return _self_inner_windows(a, cache)
    K = a.K
    fa, la = a.win if a.win is not None else ([0] * K, [a.T] * K)
    fb, lb = b.win if b.win is not None else ([0] * K, [b.T] * K)
    out = []
    for k in range(K):
        if la[k] <= fa[k] or lb[k] <= fb[k]:
            out.append(a.right.new_zeros((), dtype=torch.float32))
            continue
        ak = a.row(k, fa[k], la[k])
        bk = b.row(k, fb[k], lb[k])
        gr = ak.right[0] @ bk.right[0].T
        out.append(torch.linalg.vecdot(left_gram(ak, bk).reshape(-1), gr.reshape(-1)))
    return torch.stack(out)


def ghost_cost(contribs: list[Outer]) -> int:
    """Multiply-adds of the Gram products plus ``MEMORY_COST`` per element of the Grams: ``T_a T_b`` elements
    for a pair of two contributions, :func:`strip_entries` (on the factors' device) for a contribution with itself."""
    cost = 0
    for a in contribs:
        for b in contribs:
            n = strip_entries(a.T, a.right.device.type) if a is b else a.T * b.T
            cost += n * ((1 if a.is_index or b.is_index else a.R) + a.C + MEMORY_COST)
    return cost


def use_ghost(contribs: list[Contribution], method: str) -> bool:
    """Ghost norm when every contribution is an Outer and (method="ghost" or it is cheaper)."""
    if not contribs or any(isinstance(c, Dense) for c in contribs) or method == "materialize":
        return False
    if method == "ghost":
        return True
    mat = sum(c.materialize_cost() for c in contribs)
    return ghost_cost(contribs) < mat


def keep_dense(c: Contribution) -> bool:
    """True when storing ``c`` materialised ([K, R, C] float32) takes no more memory than its factors.

    Then materialising it once, right after the backward pass, is the cheapest way to serve every later
    query: per-row norms, group norms and the weighted gradient become reductions over the stored
    per-row gradients (``O(K R C)``) instead of a ghost Gram or a ``[K, T] x [T, R, C]`` product each time.
    Per row: dense ``4 R C`` bytes vs factors ``T (R' + C)`` elements (``R' = 1`` for token ids).
    """
    if not isinstance(c, Outer):
        return False
    r_left = 1 if c.is_index else c.R
    factor_bytes = c.T * (r_left * c.left.element_size() + c.C * c.right.element_size())
    return 4 * c.R * c.C <= KEEP_DENSE_SLACK * factor_bytes


def materialized_sum(contribs: list[Contribution]) -> Tensor:
    """[K, *shape] float32: the sum of all contributions, materialised (a matmul-backed Outer first, the others
    added into it in place: a scatter for token ids, a batched matmul-add otherwise)."""
    if len(contribs) == 1:
        return contribs[0].materialize()
    order = sorted(contribs, key=lambda c: 0 if isinstance(c, Outer | RowProducts) and not c.is_index else 1)
    total = order[0].materialize()
    if isinstance(order[0], Dense):
        total = total.clone()
    for c in order[1:]:
        if isinstance(c, Dense):
            total.add_(c.z)
        else:
            c.add_to(total)
    return total


def grouped_sums(contribs: list[Contribution], grp: Grouping) -> tuple[Tensor, Tensor]:
    """Materialise each sample's sum ``M_k = sum_c G_c[k]`` in chunks of samples.

    Returns ``(sq, total)``: ``sq[k] = ||M_k||^2`` [K] and ``total = sum_k M_k`` [*shape], both float32.
    For ``Grouping.from_groups`` the total is the weighted gradient over all rows, so group norms and the
    weighted gradient come from one pass (for an Outer: one ``[R, M T] x [M T, C]`` product per group, the
    same work as the ordinary weight gradient).
    """
    regrouped = [regroup_for_products(c, grp) for c in contribs]
    sq, total = [], None
    for k0, k1 in chunks(grp.K, numel(regrouped[0].shape)):
        m = materialized_sum([c.slice(k0, k1) for c in regrouped]).reshape(k1 - k0, -1)
        sq.append(torch.linalg.vector_norm(m, dim=1).square())
        if total is None:
            total = m.sum(0)  # a new tensor (m may be a view of a kept one), then added into in place
        else:
            total.add_(m[0] if k1 - k0 == 1 else m.sum(0))
        del m  # freed before the next chunk is formed: one chunk and the total live at a time
    return _one_or_cat(sq), total.reshape(regrouped[0].shape)


def sq_norm(contribs: list[Contribution], method: str, cache: GramCache | None = None) -> Tensor:
    """||sum_c G_c[k]||^2 for each sample k, [K] float32, by ghost pairs or materialisation in chunks."""
    if use_ghost(contribs, method):
        total = None  # the pairs' sum (no 0 + 1 * first: the same numbers, two operators fewer)
        for i, a in enumerate(contribs):
            for b in contribs[i:]:
                term = ghost_inner(a, b, cache)
                term = term if a is b else 2 * term
                total = term if total is None else total + term
        return total
    K = contribs[0].K
    per_item = numel(contribs[0].shape)
    out = []
    for k0, k1 in chunks(K, per_item):
        m = materialized_sum([c.slice(k0, k1) for c in contribs])
        out.append(torch.linalg.vector_norm(m.reshape(k1 - k0, -1), dim=1).square())
    return _one_or_cat(out)
