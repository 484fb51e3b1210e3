"""Per-group Gram matrices of per-row gradients: ``M_k[a, b] = <s_{i_a}, s_{i_b}>`` for rows of group k.

Used by the two-pass engine (:mod:`oblr.gradnorm.twopass`), which must reduce each layer's contribution
the moment it is computed, before the coefficients are known. With the Gram of every group,
``w_i = M_k[a, a]`` and ``||sum_{i in k} c_i s_i||^2 = c_k^T M_k c_k`` for any coefficients later.

A group's rows are given by a :class:`~oblr.gradnorm.contrib.Grouping` built with unit coefficients:
``index`` [K, M] (padding slots have scale 0 and are masked out). For contributions ``a``, ``b`` of one
parameter the cross block ``X_ab[k, p, q] = <G_a[index[k, p]], G_b[index[k, q]]>`` is computed by

- ghost: ``sum_{t,s} (left_a,pt . left_b,qs)(right_a,pt . right_b,qs)`` over the group's ``M T`` tokens
  (memory ``(M T)^2`` per group, cost ``~ (M T)^2 (R + C)``), or
- materialised per-row gradients ``Z`` [M, R C] and ``Z_a Z_b^T`` (memory ``M R C``, cost ``~ M T R C``),

chosen per parameter like :func:`oblr.gradnorm.contrib.use_ghost` (``method`` "auto" | "ghost" |
"materialize"). All arithmetic is float32.
"""

from __future__ import annotations

import torch

from .contrib import MEMORY_COST, Dense, Grouping, Outer, _chunks, _left_gram, _numel

Tensor = torch.Tensor


def _gather_outer(c: Outer, index: Tensor) -> Outer:
    """The Outer with each group's rows' tokens concatenated, unscaled: K samples of ``M T`` tokens."""
    K, M = index.shape
    left = c.left if c.is_index else c.left.float()
    left = left[index].reshape(K, M * c.T) if c.is_index else left[index].reshape(K, M * c.T, c.R)
    return Outer(left, c.right.float()[index].reshape(K, M * c.T, c.C), c.shape)


def _rows_materialized(c, index: Tensor, k0: int, k1: int) -> Tensor:
    """[k1-k0, M, numel] float32 per-row gradients of groups k0..k1-1."""
    idx = index[k0:k1]
    k, M = idx.shape
    if isinstance(c, Dense):
        return c.z[idx].reshape(k, M, -1)
    left = c.left[idx].reshape(k * M, c.T) if c.is_index else c.left[idx].reshape(k * M, c.T, c.R)
    return Outer(left, c.right[idx].reshape(k * M, c.T, c.C), c.shape).materialize().float().reshape(k, M, -1)


def _use_ghost(contribs: list, M: int, method: str) -> bool:
    if method == "materialize" or any(isinstance(c, Dense) for c in contribs):
        return False
    if method == "ghost":
        return True
    ghost = mat = 0
    for a in contribs:
        R, C, T = a.R, a.C, a.T
        mat += M * (T * C * (1 if a.is_index else R) + MEMORY_COST * R * C)
        for b in contribs:
            ghost += (M * a.T) * (M * b.T) * ((1 if a.is_index or b.is_index else R) + C + MEMORY_COST)
    mat += M * M * _numel(contribs[0].shape)
    return ghost < mat


def group_gram(contribs: list, grp: Grouping, method: str = "auto") -> Tensor:
    """``[K, M, M]`` Gram of the per-row sums of ``contribs`` (all of one parameter) within each group."""
    index = grp.index
    K, M = index.shape
    out = torch.zeros(K, M, M, dtype=torch.float32, device=index.device)
    if _use_ghost(contribs, M, method):
        gathered = [_gather_outer(c, index) for c in contribs]
        for i, a in enumerate(gathered):
            for j in range(i, len(gathered)):
                b = gathered[j]
                for k0, k1 in _chunks(K, 2 * a.T * b.T):
                    ac, bc = a.slice(k0, k1), b.slice(k0, k1)
                    prod = _left_gram(ac, bc) * torch.bmm(ac.right, bc.right.transpose(1, 2))
                    x = prod.reshape(k1 - k0, M, a.T // M, M, b.T // M).sum((2, 4))
                    out[k0:k1] += x if i == j else x + x.transpose(1, 2)
    elif len(contribs) == 1 and isinstance(contribs[0], Dense) and grp.contiguous:  # a view, no copy
        z = contribs[0].z.reshape(K, M, -1)
        out = torch.bmm(z, z.transpose(1, 2))
    else:
        for k0, k1 in _chunks(K, M * _numel(contribs[0].shape)):
            z = _rows_materialized(contribs[0], index, k0, k1)
            for c in contribs[1:]:
                z = z + _rows_materialized(c, index, k0, k1)
            out[k0:k1] = torch.bmm(z, z.transpose(1, 2))
    valid = (grp.scale != 0).float()
    return out * valid[:, :, None] * valid[:, None, :]
