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

chosen per parameter like :func:`oblr.gradnorm.assembly.use_ghost` (``method`` "auto" | "ghost" |
"materialize"). Per-row gradients that are small (a norm weight's ``[B, d]``, a narrow linear's materialised
``[B, R, C]``) need not be reduced one parameter at a time: :class:`GramSum` stacks those of one shape, up to
``slabs.SLAB_ELEMS`` elements in all, forms their Grams with one batched product and sums every Gram in the order
given (a launch-bound GPU step pays per dispatched operator, ``benchmarks/op_count.py``). All arithmetic is
float32 (products of a half-precision model's factors as TF32 on CUDA, exact for those values:
:func:`oblr.gradnorm.precision.tf32_products`).
"""

from __future__ import annotations

import torch

from .assembly import chunks, left_gram
from .contrib import MEMORY_COST, Dense, Grouping, Outer, f32, numel
from .precision import half_factors, tf32_products
from .slabs import RunningSum, slab_budget

Tensor = torch.Tensor


def _rows(t: Tensor, index: Tensor, contiguous: bool, k0: int = 0, k1: int | None = None) -> Tensor:
    """Rows ``index[k0:k1]`` of ``t`` as ``[k, M, ...]``: a view when the groups are contiguous, else a gather."""
    K, M = index.shape
    k1 = K if k1 is None else k1
    if contiguous:
        return t[k0 * M:k1 * M].unflatten(0, (k1 - k0, M))
    return t[index[k0:k1]]


def _gather_outer(c: Outer, index: Tensor, contiguous: bool = False) -> Outer:
    """The Outer with each group's rows' tokens concatenated, unscaled: K samples of ``M T`` tokens."""
    K, M = index.shape
    left = _rows(c.left, index, contiguous)
    left = left.reshape(K, M * c.T) if c.is_index else left.float().reshape(K, M * c.T, c.R)
    return Outer(left, _rows(c.right, index, contiguous).float().reshape(K, M * c.T, c.C), c.shape)


def _rows_materialized(c, index: Tensor, k0: int, k1: int, contiguous: bool = False) -> Tensor:
    """[k1-k0, M, numel] float32 per-row gradients of groups k0..k1-1."""
    k, M = k1 - k0, index.shape[1]
    if isinstance(c, Dense):
        return _rows(c.z, index, contiguous, k0, k1).reshape(k, M, -1)
    left = _rows(c.left, index, contiguous, k0, k1)
    left = left.reshape(k * M, c.T) if c.is_index else left.float().reshape(k * M, c.T, c.R)
    right = _rows(c.right, index, contiguous, k0, k1).float().reshape(k * M, c.T, c.C)
    return Outer(left, right, c.shape).materialize().reshape(k, M, -1)


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
    mat += M * M * numel(contribs[0].shape)
    return ghost < mat


#: :func:`rows_gram` splits an inner dimension longer than twice this into slices of this many elements
GRAM_SLICE = 4096
#: device types on which :func:`rows_gram` splits by default (CPU BLAS serves the one long product well)
SPLIT_DEVICES = ("cuda",)


def rows_gram(z: Tensor, split: bool | None = None) -> Tensor:
    """``z z^T`` per group: ``[k, M, n]`` -> ``[k, M, M]``, for few rows ``M`` and a long ``n`` (a parameter's size).

    One ``[M, n] x [n, M]`` product per group is what cuBLAS serves with a kernel that walks ``n`` in one
    sequence (``gemmSN``): measured on an H200 at 6-9 ms per layer of Qwen3-0.6B, 80 % of a two-pass step.
    With ``split`` (default: on ``SPLIT_DEVICES``, i.e. CUDA) ``n`` is cut into slices of ``GRAM_SLICE``, each group's slices form a
    batch of short products (a strided view, no copy) and the ``[M, M]`` results are summed: the same sums
    in another order. Float32 products, never TF32: ``z`` holds accumulated sums, not a model's half values."""
    k, M, n = z.shape
    if split is None:
        split = z.device.type in SPLIT_DEVICES
    if not split or n < 2 * GRAM_SLICE:
        return torch.bmm(z, z.transpose(1, 2))
    if M == 1:  # one row per group: its squared norm, one reduction for all groups
        return torch.linalg.vector_norm(z, dim=2, keepdim=True).square()
    s = n // GRAM_SLICE
    head = s * GRAM_SLICE
    out = []
    for zk in z:
        sl = zk[:, :head].unflatten(1, (s, GRAM_SLICE)).transpose(0, 1)  # [s, M, GRAM_SLICE], a view
        g = torch.bmm(sl, sl.transpose(1, 2)).sum(0)
        if head < n:
            g = g + zk[:, head:] @ zk[:, head:].T
        out.append(g)
    return torch.stack(out)


def group_gram(contribs: list, grp: Grouping, method: str = "auto", mask: bool = True) -> Tensor:
    """``[K, M, M]`` Gram of the per-row sums of ``contribs`` (all of one parameter) within each group.

    Products of a half-precision model's factors (the ghost Grams, the per-row gradients) run as TF32 on
    CUDA (:func:`oblr.gradnorm.precision.tf32_products`: exact for those values); the Gram of accumulated
    per-row gradients (:func:`rows_gram`) does not. ``mask=False`` leaves the entries of padding slots
    (scale 0) unzeroed, for a caller that sums many Grams and masks the sum once (:func:`mask_padding`)."""
    out = _group_gram(contribs, grp, method)
    return mask_padding(out, grp) if mask else out


def mask_padding(gram: Tensor, grp: Grouping) -> Tensor:
    """``gram`` [K, M, M] with the rows and columns of ``grp``'s padding slots (scale 0) zeroed."""
    valid = (grp.scale != 0).float()
    return gram * (valid[:, :, None] * valid[:, None, :])


def _group_gram(contribs: list, grp: Grouping, method: str) -> Tensor:
    index = grp.index
    K, M = index.shape
    tf32 = half_factors(contribs)
    ranges = list(chunks(K, M * numel(contribs[0].shape)))
    ghost = _use_ghost(contribs, M, method)
    if not ghost:
        if len(contribs) == 1 and isinstance(contribs[0], Dense) and grp.contiguous:  # a view, no copy
            return rows_gram(contribs[0].z.reshape(K, M, -1))
        if len(ranges) == 1:  # one chunk of groups: no buffer to fill
            with tf32_products(tf32):
                z = _rows_materialized(contribs[0], index, 0, K, grp.contiguous)
                for c in contribs[1:]:
                    z = z + _rows_materialized(c, index, 0, K, grp.contiguous)
            return rows_gram(z)
    out = torch.zeros(K, M, M, dtype=torch.float32, device=index.device)
    if ghost:
        gathered = [_gather_outer(c, index, grp.contiguous) for c in contribs]
        for i, a in enumerate(gathered):
            for j in range(i, len(gathered)):
                b = gathered[j]
                for k0, k1 in chunks(K, 2 * a.T * b.T):
                    ac, bc = a.slice(k0, k1), b.slice(k0, k1)
                    with tf32_products(tf32):
                        prod = left_gram(ac, bc) * torch.bmm(ac.right, bc.right.transpose(1, 2))
                    x = prod.reshape(k1 - k0, M, a.T // M, M, b.T // M).sum((2, 4))
                    out[k0:k1] += x if i == j else x + x.transpose(1, 2)
    else:
        for k0, k1 in ranges:
            with tf32_products(tf32):
                z = _rows_materialized(contribs[0], index, k0, k1, grp.contiguous)
                for c in contribs[1:]:
                    z = z + _rows_materialized(c, index, k0, k1, grp.contiguous)
            out[k0:k1] = rows_gram(z)
    return out


def row_gradients(c, grp: Grouping, method: str = "auto") -> Tensor | None:
    """``c``'s per-row gradients ``[B, *shape]`` float32 where :func:`group_gram` of ``c`` alone would take them
    materialised in one chunk of groups: a :class:`Dense`'s ``z``, or a float :class:`Outer`'s one batched product
    ``left^T right`` ``[B, R, C]`` (TF32 for a half-precision model's factors on CUDA, as there). Their Gram
    within ``grp``'s groups is then ``group_gram([c], grp)`` unmasked. None where ``group_gram`` takes another path
    (the ghost Gram, token ids, several chunks of groups)."""
    if isinstance(c, Dense):
        return c.z
    K, M = grp.index.shape
    if c.is_index or _use_ghost([c], M, method) or len(list(chunks(K, M * numel(c.shape)))) > 1:
        return None
    with tf32_products(half_factors([c])):
        return torch.bmm(f32(c.left).transpose(1, 2), f32(c.right))


class GramSum:
    """The per-group Grams ``[K, M, M]`` (``grp``'s groups, unmasked) of one norm pass, summed in the order the layers
    hand them over: a Gram formed elsewhere (:meth:`add`), or per-row gradients ``[B, *shape]`` whose Gram is formed
    later (:meth:`add_rows`). Those of one shape wait and are stacked (as ``slabs.form_slabs`` stacks them), and
    their Grams formed by one batched product ``[L K, M, n] x [L K, n, M]``: each one's Gram is the product it is
    alone, and :meth:`total` adds them all, each at its own place, with ``slabs.RunningSum`` (on CPU bitwise the
    running sum ``0 + G_1 + G_2 + ...``; elsewhere one reduction). A few operators per shape instead of a few per
    parameter; the same sums as adding each Gram as it comes.

    At most ``slabs.SLAB_ELEMS`` elements (read at each :meth:`add_rows`) wait: a row block that would pass it
    reduces those waiting first, and one at least that large is reduced alone, so this holds that much at most (and
    a stack as much again while it is reduced), besides the ``[K, M, M]`` Grams themselves."""

    def __init__(self, grp: Grouping):
        self.grp = grp
        self.waiting: dict[tuple, list[Tensor]] = {}
        self.elems = 0
        self._items: list[tuple] = []  # in order: (None, Gram) or ((flush, shape), member)
        self._blocks: dict[tuple, Tensor] = {}  # (flush, shape): [L, K, M, M]
        self._flushes = 0

    def add(self, gram: Tensor) -> None:
        self._items.append((None, gram))

    def add_rows(self, z: Tensor) -> None:
        budget = slab_budget()
        if self.waiting and self.elems + z.numel() > budget:
            self.flush()
        members = self.waiting.setdefault(tuple(z.shape), [])
        self._items.append(((self._flushes, tuple(z.shape)), len(members)))
        members.append(z)
        self.elems += z.numel()
        if self.elems >= budget:
            self.flush()

    def flush(self) -> None:
        """Form the Grams of the per-row gradients waiting: one batched product per shape."""
        waiting, self.waiting, self.elems = self.waiting, {}, 0
        grp = self.grp
        K, M = grp.index.shape
        for shape, zs in waiting.items():
            L, B = len(zs), zs[0].shape[0]
            z = zs[0] if L == 1 else torch.stack(zs)  # [L, B, *shape], no copy for one
            z = z.view(L * K, M, -1) if grp.contiguous else z.view(L, B, -1)[:, grp.index].view(L * K, M, -1)
            self._blocks[(self._flushes, shape)] = rows_gram(z).view(L, K, M, M)
        self._flushes += 1

    def total(self) -> Tensor:
        """``[K, M, M]``: every Gram added, in order."""
        self.flush()
        K, M = self.grp.index.shape
        out = RunningSum((K, M, M), self.grp.index.device)
        for key, x in self._items:
            if key is None:
                out.add(x)
            else:
                out.add_row(self._blocks[key], x)
        return out.total()
