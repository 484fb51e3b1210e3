"""Per-sample gradient contributions: the two kinds every layer rule returns, and the groupings they are assembled in.

A layer rule turns what the recorded backward pass hands a module (its input ``x`` and the gradient
``g`` of ``sum_i l_i`` with respect to its output) into one *contribution* per trainable parameter.
Because rows of a batch are independent, row ``i`` of ``x`` and ``g`` carry exactly the per-sequence
gradient ``s_i`` restricted to that parameter. Two kinds cover every rule:

- :class:`Outer` -- ``G_k = sum_t left[k, t] right[k, t]^T`` reshaped to the parameter's shape
  (Linear weight: ``left = g`` [K, T, d_out], ``right = x`` [K, T, d_in]; Embedding weight:
  ``left`` = token ids [K, T] standing for one-hot rows of the [V, D] table, ``right = g`` [K, T, D]).
  Its squared norm is available two ways: the *ghost norm*
  ``sum_{t,s} (left_t . left_s)(right_t . right_s)`` (cost ~ T^2 (R + C) per sample, memory T^2) or the
  *materialised* matrix ``left^T right`` (cost ~ T R C, memory R C).
- :class:`Dense` -- the per-row gradient already reduced, ``z`` [B, *shape] float32 (biases, norm
  weights, loop-fallback parameters): cheap because these parameters are small.

A :class:`Grouping` says which "samples" to assemble: every row alone (per-sequence norms ``w_i``),
groups of rows with coefficients (``||sum_{i in k} c_i s_i||^2``), or everything with coefficients
(the weighted gradient). Grouping rows concatenates their tokens, so one code path serves all three.
:class:`RowProducts` is a windowed Outer's grouped sums formed row by row (:func:`regroup_for_products`).
All arithmetic is float32 whatever the model dtype.

Elsewhere: their squared norms and sums (:mod:`.assembly`), the Gram strips of the ghost norm
(:mod:`.strips`), each row's non-zero token window (:mod:`.windows`), TF32 products of half-precision
factors (:mod:`.precision`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor

#: cost-model weight of one element written and read by a memory-bound pass, in multiply-adds (a batched
#: matmul does several multiply-adds per element moved; zero-filling, scattering into and reducing a
#: per-sample [R, C] matrix does not)
MEMORY_COST = 8


@dataclass(frozen=True)
class Grouping:
    """Which sums of per-row gradients to assemble.

    ``K`` samples; sample ``k`` is ``sum_m scale[k, m] * s_{index[k, m]}``. ``index``/``scale`` are
    [K, M] (padding slots have scale 0); ``row_group`` [B] and ``coeff`` [B] say the same row-wise.
    ``index is None`` means the identity: K = B, each row alone with coefficient 1.
    ``contiguous`` means ``index == arange(K*M).view(K, M)`` so tensors can be reshaped, not gathered.
    """

    K: int
    index: Tensor | None = None
    scale: Tensor | None = None
    row_group: Tensor | None = None
    coeff: Tensor | None = None
    contiguous: bool = False

    @staticmethod
    def rows(batch: int) -> Grouping:
        return Grouping(K=batch)

    @staticmethod
    def from_groups(coeffs: Tensor, group_ids: Tensor) -> Grouping:
        """Groups by ``group_ids`` [B] (any integers; output order = sorted unique ids), coefficients [B]."""
        if coeffs.dim() != 1 or group_ids.shape != coeffs.shape:
            raise ValueError(
                f"coeffs and group_ids must both be [B]; got {tuple(coeffs.shape)} and {tuple(group_ids.shape)}"
            )
        if group_ids.is_floating_point():
            raise ValueError("group_ids must be an integer tensor")
        B = coeffs.shape[0]
        dev = coeffs.device
        coeffs = coeffs.detach().float()
        _, inv = torch.unique(group_ids.to(dev), return_inverse=True)
        counts = torch.bincount(inv)
        K, M = counts.shape[0], int(counts.max())  # one host sync per call, not per layer
        order = torch.argsort(inv, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(B, device=dev) - starts[inv[order]]
        index = torch.zeros(K, M, dtype=torch.long, device=dev)
        scale = torch.zeros(K, M, dtype=torch.float32, device=dev)
        index[inv[order], slot] = order
        scale[inv[order], slot] = coeffs[order]
        contiguous = K * M == B and bool(torch.equal(index.flatten(), torch.arange(B, device=dev)))
        return Grouping(K=K, index=index, scale=scale, row_group=inv, coeff=coeffs, contiguous=contiguous)

    @staticmethod
    def single(coeffs: Tensor) -> Grouping:
        """One sample: ``sum_i coeffs[i] s_i``."""
        return Grouping.from_groups(coeffs, torch.zeros_like(coeffs, dtype=torch.long))


def f32(t: Tensor) -> Tensor:
    """``t`` in float32: itself when it already is (``t.float()`` would dispatch a no-op conversion, one host-side
    operator per call, which a launch-bound GPU step pays; ``benchmarks/op_count.py``)."""
    return t if t.dtype == torch.float32 else t.float()


def numel(shape) -> int:
    """The number of elements of a tensor of ``shape`` (1 for ``()``)."""
    n = 1
    for s in shape:
        n *= s
    return n


class Outer:
    """``G_k = sum_t left[k, t] right[k, t]^T``, viewed as ``shape`` (whose numel is R*C).

    left: [K, T, R] float, or [K, T] long ids (one-hot rows of an R-row table); right: [K, T, C].
    ``win``: optional per-row token windows ``(first, last)`` (two lists of K ints): row k's tokens outside
    ``first[k]:last[k]`` contribute nothing (their gradient factor is zero), so Grams and per-group products
    may skip them (:func:`oblr.gradnorm.windows.token_windows`).
    """

    def __init__(self, left: Tensor, right: Tensor, shape: torch.Size | tuple[int, ...],
                 win: tuple[list[int], list[int]] | None = None):
        self.left, self.right, self.shape = left, right, tuple(shape)
        self.win = win
        self.C = right.shape[-1]
        self.R = self.shape[0] if self.is_index else left.shape[-1]
        if self.R * self.C != numel(self.shape):
            raise ValueError(f"Outer factors R={self.R}, C={self.C} do not fit parameter shape {self.shape}")

    @property
    def is_index(self) -> bool:
        return not self.left.is_floating_point()

    @property
    def K(self) -> int:
        return self.right.shape[0]

    @property
    def T(self) -> int:
        return self.right.shape[1]

    def regroup(self, grp: Grouping) -> Outer:
        left = self.left if self.is_index else f32(self.left)
        right = f32(self.right)
        if grp.index is None:
            return Outer(left, right, self.shape, self.win)
        K, M = grp.index.shape
        # scale the cheaper dense factor (never the ids)
        scale_right = self.is_index or self.C <= self.R
        if self.win is not None:
            return self._regroup_packed(left, right, grp, scale_right)

        def gather(t: Tensor) -> Tensor:
            if grp.contiguous:
                return t.reshape(K, M, *t.shape[1:])
            return t[grp.index]

        if grp.contiguous:  # rows k*M .. k*M+M-1 form sample k: scale them in place of order, then view as K samples
            s = grp.scale.view(K * M, 1, 1)
        else:
            left, right = gather(left), gather(right)  # [K, M, T, ...]
            s = grp.scale.view(K, M, 1, 1)
        if scale_right:
            right = right * s
        else:
            left = left * s
        T = self.T
        left = left.reshape(K, M * T) if self.is_index else left.reshape(K, M * T, self.R)
        return Outer(left, right.reshape(K, M * T, self.C), self.shape)

    def _regroup_packed(self, left: Tensor, right: Tensor, grp: Grouping, scale_right: bool) -> Outer:
        """Sample k = the scaled windows of its rows, packed one after another and zero-padded to the longest
        sample: [K, N, .] with N <= M T (exact: padding tokens have zero factors)."""
        first, last = self.win
        index, scale = grp.index.tolist(), grp.scale.tolist()
        parts = [[(i, s) for i, s in zip(idx, sc) if s != 0 and last[i] > first[i]] for idx, sc in zip(index, scale)]
        N = max(1, max(sum(last[i] - first[i] for i, _ in p) for p in parts))
        K = len(parts)
        lo = left.new_zeros((K, N) if self.is_index else (K, N, self.R))
        ro = right.new_zeros(K, N, self.C)
        for k, p in enumerate(parts):
            pos = 0
            for i, s in p:
                a, b = first[i], last[i]
                n = b - a
                if scale_right:
                    lo[k, pos:pos + n] = left[i, a:b]
                    torch.mul(right[i, a:b], s, out=ro[k, pos:pos + n])
                else:
                    torch.mul(left[i, a:b], s, out=lo[k, pos:pos + n])
                    ro[k, pos:pos + n] = right[i, a:b]
                pos += n
        return Outer(lo, ro, self.shape)

    def slice(self, k0: int, k1: int) -> Outer:
        if k0 == 0 and k1 == self.K:  # the whole: itself (no view dispatched)
            return self
        win = None if self.win is None else (self.win[0][k0:k1], self.win[1][k0:k1])
        return Outer(self.left[k0:k1], self.right[k0:k1], self.shape, win)

    def row(self, k: int, a: int, b: int) -> Outer:
        """Row ``k``'s tokens ``a:b`` as a one-sample Outer."""
        return Outer(self.left[k:k + 1, a:b], self.right[k:k + 1, a:b], self.shape)

    def materialize(self) -> Tensor:
        """[K, *shape] float32."""
        K, R, C = self.K, self.R, self.C
        if self.is_index:
            out = torch.zeros(K, R, C, dtype=self.right.dtype, device=self.right.device)
            out.scatter_add_(1, self.left[..., None].expand(-1, -1, C), self.right)
        else:
            out = torch.bmm(self.left.transpose(1, 2), self.right)
        return out.reshape(K, *self.shape)

    def add_to(self, z: Tensor) -> None:
        """``z += G`` in place (``z`` [K, *shape] float32): a scatter for token ids, a batched matmul otherwise."""
        K, R, C = self.K, self.R, self.C
        out = z.view(K, R, C)
        if self.is_index:
            out.scatter_add_(1, self.left[..., None].expand(-1, -1, C), f32(self.right))
        else:
            out.baddbmm_(f32(self.left).transpose(1, 2), f32(self.right))

    def materialize_cost(self) -> int:
        """Multiply-adds of the product plus ``MEMORY_COST`` per element of the [R, C] result (written, read)."""
        return self.T * self.C * (1 if self.is_index else self.R) + MEMORY_COST * self.R * self.C


class Dense:
    """Per-row gradients already reduced: ``z`` [K, *shape] float32.

    ``owned=True`` marks a ``z`` that no one else references (created by the engine), so contributions
    may be added to it in place.
    """

    def __init__(self, z: Tensor, owned: bool = False):
        self.z = f32(z)
        self.shape = tuple(z.shape[1:])
        self.owned = owned

    def regroup(self, grp: Grouping) -> Dense:
        if grp.index is None:
            return self
        if grp.contiguous:  # rows k*M .. k*M+M-1 form sample k: one batched matrix-vector product
            K, M = grp.index.shape
            out = torch.bmm(grp.scale.view(K, 1, M), self.z.reshape(K, M, -1))
            return Dense(out.reshape(K, *self.shape))
        coeff = grp.coeff.view(-1, *([1] * len(self.shape)))
        out = torch.zeros(grp.K, *self.shape, dtype=torch.float32, device=self.z.device)
        return Dense(out.index_add_(0, grp.row_group, self.z * coeff))

    @property
    def K(self) -> int:
        return self.z.shape[0]

    def slice(self, k0: int, k1: int) -> Dense:
        return self if k0 == 0 and k1 == self.K else Dense(self.z[k0:k1])

    def materialize(self) -> Tensor:
        return self.z


class RowProducts:
    """Grouped sums of a windowed :class:`Outer`'s rows, computed row by row: sample ``k`` is
    ``sum_m scale[k, m] left[i, a:b]^T right[i, a:b]`` (``i = index[k, m]``, ``a:b`` row i's token window).

    One ``[R, n] x [n, C]`` product per row, accumulated with the row's coefficient as the product's scale
    (``addmm``): no scaled or packed copy of the factors, and each row's zero-gradient tokens skipped. What
    :meth:`Outer.regroup` followed by ``materialize`` computes, for the per-group products of the weighted
    gradient (:func:`regroup_for_products`)."""

    is_index = False

    def __init__(self, outer: Outer, parts: list[list[tuple[int, float]]]):
        self.outer, self.parts = outer, parts
        self.shape, self.R, self.C = outer.shape, outer.R, outer.C

    @property
    def K(self) -> int:
        return len(self.parts)

    def slice(self, k0: int, k1: int) -> RowProducts:
        if k0 == 0 and k1 == self.K:
            return self
        return RowProducts(self.outer, self.parts[k0:k1])

    def add_to(self, z: Tensor) -> None:
        """``z += G`` in place (``z`` [K, *shape] float32)."""
        out = z.view(self.K, self.R, self.C)
        first, last = self.outer.win
        left, right = self.outer.left, self.outer.right
        if left.dtype == right.dtype == torch.float32:  # the same views, fewer host-side operators: no no-op
            lt = left.transpose(1, 2)                   # conversions, one transpose, each sample's view once
            for k, part in enumerate(self.parts):
                ok = out[k]
                for i, s in part:
                    a, b = first[i], last[i]
                    ok.addmm_(lt[i, :, a:b], right[i, a:b], alpha=s)
            return
        for k, part in enumerate(self.parts):
            for i, s in part:
                a, b = first[i], last[i]
                out[k].addmm_(left[i, a:b].float().T, right[i, a:b].float(), alpha=s)

    def materialize(self) -> Tensor:
        """[K, *shape] float32."""
        out = torch.zeros(self.K, self.R, self.C, dtype=torch.float32, device=self.outer.right.device)
        self.add_to(out)
        return out.reshape(self.K, *self.shape)


def regroup_for_products(c, grp: Grouping):
    """``c.regroup(grp)`` for assemblies that materialise each sample (the weighted gradient, its group sums):
    a windowed float :class:`Outer` becomes :class:`RowProducts`; anything else is regrouped as usual."""
    if not isinstance(c, Outer) or c.win is None or c.is_index or grp.index is None:
        return c.regroup(grp)
    first, last = c.win
    parts = [[(i, s) for i, s in zip(idx, sc) if s != 0 and last[i] > first[i]]
             for idx, sc in zip(grp.index.tolist(), grp.scale.tolist())]
    return RowProducts(c, parts)


Contribution = Outer | Dense
