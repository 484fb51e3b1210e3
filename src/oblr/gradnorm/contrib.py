"""Per-sample gradient contributions and their exact inner products.

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
All arithmetic is float32 whatever the model dtype. On CUDA, the products of a bf16 or fp16 model's
factors run as TF32 (:func:`tf32_products`): exact for the factors themselves (TF32's 11-bit significand
holds their values); a factor the one-pass engine scaled by a row's coefficient first is rounded to 11 bits
(relative 2^-11 per element, below the 2^-8 of the bf16 values it came from and of a bf16 gradient it is
added to; for fp16, equal to its own). Products of accumulated per-row gradients (the two-pass Grams
``z z^T``) stay float32.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

Tensor = torch.Tensor

#: an Outer is materialised once after the backward pass when its per-row gradients [K, R, C] (float32)
#: take at most this many times the memory of its factors (see :func:`keep_dense`)
KEEP_DENSE_SLACK = 1.0

#: cost-model weight of one element written and read by a memory-bound pass, in multiply-adds (a batched
#: matmul does several multiply-adds per element moved; zero-filling, scattering into and reducing a
#: per-sample [R, C] matrix does not)
MEMORY_COST = 8

#: elements one chunk of per-sample Gram or materialised matrices may hold (float32: 256 MiB)
CHUNK_ELEMS = 1 << 26

#: an Outer's rows are trimmed to their non-zero token windows (:func:`token_windows`) when that drops at
#: least this fraction of its tokens
TRIM_MIN_FRACTION = 0.1

#: half-precision factor dtypes: their values are exact in TF32 (8- and 11-bit significands, TF32 keeps 11)
HALF = (torch.bfloat16, torch.float16)
#: run the float32 products of half-precision factors on CUDA as TF32 (:func:`tf32_products`); False: full
#: float32 (``benchmarks/gpu/memory_check.py --fp32-compare`` measures the difference)
TF32_HALF_PRODUCTS = True

#: on CPU, a parameter's own Grams (``x x^T``, ``g g^T`` of one row: symmetric) are formed as at most this many
#: column strips of their lower triangle (:func:`strip_bounds`), about ``(n + 1) / (2 n)`` of a full product's
#: work. Elsewhere (CUDA) they are one full product (:func:`gram_strips`): on an H200 the strips made the
#: one-pass step launch-bound (Qwen3-0.6B, T = 1024: 4.0x a GRPO step, run ``4_recompute_lora``, against 1.9x
#: with one product, run ``7_strips1``; ``benchmarks/results/gpu/h200_scale``)
GRAM_STRIPS = 16
#: strips per symmetric Gram on every other device type (1: one full product)
GRAM_STRIPS_OTHER = 1
#: the narrowest strip: a row of at most this many tokens gets one full product. Narrower products run at a
#: lower rate: at the ghost path's shapes on this project's CPU 32 and 48 were about equally fast, 0.6-0.75x the
#: full product's time, 16 no faster and 128 slower (``benchmarks/gram_strips.py``)
MIN_STRIP = 48


def gram_strips(device_type: str) -> int:
    """Strips per symmetric Gram on ``device_type``: :data:`GRAM_STRIPS` on CPU, :data:`GRAM_STRIPS_OTHER` (1, one
    full product) elsewhere."""
    return GRAM_STRIPS if device_type == "cpu" else GRAM_STRIPS_OTHER


def strip_bounds(T: int, device_type: str = "cpu") -> list[tuple[int, int]]:
    """``(start, width)`` of the column strips of a symmetric ``[T, T]`` Gram on ``device_type``: strip ``j``
    holds rows ``start:`` of columns ``start:start + width``, i.e. its diagonal block and everything below
    it (one strip ``(0, T)`` where :func:`gram_strips` is 1)."""
    n = gram_strips(device_type)
    w = T if n <= 1 else max(MIN_STRIP, -(-T // n))
    return [(s, min(w, T - s)) for s in range(0, T, w)]


def strip_entries(T: int, device_type: str = "cpu") -> int:
    """Entries of a ``[T, T]`` Gram that :func:`strip_bounds`' strips form (``T^2`` for one strip)."""
    return sum((T - s) * w for s, w in strip_bounds(T, device_type))


def tf32_eligible(device_type: str, dtypes) -> bool:
    """True when products of factors of ``dtypes`` on ``device_type`` may run as TF32: on CUDA, with every
    factor from a half-precision model (bf16 or fp16, whose values TF32 holds exactly; the products accumulate
    in float32, as a float32 product does). A float32 model never qualifies."""
    dtypes = list(dtypes)
    return TF32_HALF_PRODUCTS and device_type == "cuda" and bool(dtypes) and all(d in HALF for d in dtypes)


def half_factors(contribs) -> bool:
    """:func:`tf32_eligible` for stored contributions: some :class:`Outer` among them, every Outer's float
    factors in half precision and on CUDA (Dense sums are float32 and are not looked at)."""
    outers = [c for c in contribs if isinstance(c, Outer)]
    dtypes = [t.dtype for c in outers for t in ((c.right,) if c.is_index else (c.left, c.right))]
    return all(c.right.is_cuda for c in outers) and tf32_eligible("cuda", dtypes)


@contextmanager
def tf32_products(on: bool):
    """CUDA float32 matrix products as TF32 inside, when ``on``; off: nothing changes.

    Only the CUDA matmul setting is touched, and exactly it is restored on exit (an exception included):
    ``torch.backends.cuda.matmul.fp32_precision`` where torch has it (2.9 and later; reading it works whichever
    of torch's old or new precision switches the caller used), else the older ``allow_tf32``. The setting is
    process-wide while inside: another thread's CUDA float32 products in that window run as TF32 too."""
    if not on:
        yield
        return
    m = torch.backends.cuda.matmul
    name, value = ("fp32_precision", "tf32") if hasattr(m, "fp32_precision") else ("allow_tf32", True)
    prev = getattr(m, name)
    setattr(m, name, value)
    try:
        yield
    finally:
        setattr(m, name, prev)


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


def _one_or_cat(parts: list[Tensor]) -> Tensor:
    """``torch.cat(parts)``, or the single part itself (no copy, no operator)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _chunks(K: int, per_item: int, budget: int = CHUNK_ELEMS):
    step = max(1, budget // max(1, per_item))
    for k0 in range(0, K, step):
        yield k0, min(K, k0 + step)


class Outer:
    """``G_k = sum_t left[k, t] right[k, t]^T``, viewed as ``shape`` (whose numel is R*C).

    left: [K, T, R] float, or [K, T] long ids (one-hot rows of an R-row table); right: [K, T, C].
    ``win``: optional per-row token windows ``(first, last)`` (two lists of K ints): row k's tokens outside
    ``first[k]:last[k]`` contribute nothing (their gradient factor is zero), so Grams and per-group products
    may skip them (:func:`token_windows`).
    """

    def __init__(self, left: Tensor, right: Tensor, shape: torch.Size | tuple[int, ...],
                 win: tuple[list[int], list[int]] | None = None):
        self.left, self.right, self.shape = left, right, tuple(shape)
        self.win = win
        self.C = right.shape[-1]
        self.R = self.shape[0] if self.is_index else left.shape[-1]
        if self.R * self.C != _numel(self.shape):
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
        return Dense(self.z[k0:k1])

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
        return RowProducts(self.outer, self.parts[k0:k1])

    def add_to(self, z: Tensor) -> None:
        """``z += G`` in place (``z`` [K, *shape] float32)."""
        out = z.view(self.K, self.R, self.C)
        first, last = self.outer.win
        left, right = self.outer.left, self.outer.right
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


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _left_gram(a: Outer, b: Outer) -> Tensor:
    """[K, Ta, Tb] inner products of left factors (one-hot ids handled without materialising)."""
    if a.is_index and b.is_index:
        return (a.left[:, :, None] == b.left[:, None, :]).float()
    if a.is_index:
        return b.left.gather(2, a.left[:, None, :].expand(-1, b.T, -1)).transpose(1, 2)
    if b.is_index:
        return a.left.gather(2, b.left[:, None, :].expand(-1, a.T, -1))
    return torch.bmm(a.left, b.left.transpose(1, 2))


def sym_strips(t: Tensor, dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """The lower-triangle strips of ``t t^T`` per sample (:func:`strip_bounds`): ``t`` [K, T, d] float gives
    ``[K, T - start, width]`` each; ``t`` [K, T] token ids stand for one-hot rows (their Gram is equality, as
    ``dtype``)."""
    bounds = strip_bounds(t.shape[1], t.device.type)
    if t.is_floating_point():
        return [torch.bmm(t[:, s:], t[:, s:s + w].transpose(1, 2)) for s, w in bounds]
    return [(t[:, s:, None] == t[:, None, s:s + w]).to(dtype) for s, w in bounds]


def strips_dot(a: list[Tensor], b: list[Tensor]) -> Tensor:
    """``<A, B>`` per sample for two symmetric Grams given as :func:`sym_strips` of one length: each strip's
    diagonal block counted once, the blocks below it twice. [K] float32."""
    total = 0
    for x, y in zip(a, b):
        K, w = x.shape[0], x.shape[2]
        whole = torch.linalg.vecdot(x.reshape(K, -1), y.reshape(K, -1))
        if len(a) == 1:  # one strip: the whole Gram (other devices, or a short row), each entry once
            return whole
        diag = torch.linalg.vecdot(x[:, :w].reshape(K, -1), y[:, :w].reshape(K, -1))
        total = total + 2 * whole - diag
    return total


class GramCache:
    """Per-sample Grams ``right right^T`` of the last right factor seen: whole [k, T, T] by chunk, or the
    lower-triangle strips (:func:`sym_strips`) by chunk or by one row's token window.

    Parameters that read the same input (q/k/v projections, gate/up projections: the same ``x`` tensor)
    are assembled one after another, so remembering one tensor's Grams saves recomputing ``x x^T``.
    Keyed by storage and layout; use one cache per assembly pass, while the factors are alive.
    """

    def __init__(self):
        self._key = None
        self._tensor: Tensor | None = None  # held so that its memory cannot be reused by another tensor
        self._grams: dict[tuple, Tensor | list[Tensor]] = {}

    def _get(self, t: Tensor, key: tuple, make):
        tkey = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if tkey != self._key:
            self._key, self._tensor, self._grams = tkey, t, {}
        g = self._grams.get(key)
        if g is None:
            g = self._grams[key] = make()
        return g

    def gram(self, t: Tensor, k0: int, k1: int) -> Tensor:
        """``t[k] t[k]^T`` for samples ``k0:k1``: [k1-k0, T, T]."""
        return self._get(t, ("gram", k0, k1), lambda: torch.bmm(t[k0:k1], t[k0:k1].transpose(1, 2)))

    def strips(self, t: Tensor, k0: int, k1: int) -> list[Tensor]:
        """:func:`sym_strips` of samples ``k0:k1``."""
        return self._get(t, ("strips", k0, k1), lambda: sym_strips(t[k0:k1]))

    def strips_row(self, t: Tensor, k: int, a: int, b: int) -> list[Tensor]:
        """:func:`sym_strips` of sample ``k``'s tokens ``a:b`` (one sample)."""
        return self._get(t, ("row", k, a, b), lambda: sym_strips(t[k:k + 1, a:b]))


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
    for k0, k1 in _chunks(a.K, 2 * a.T * b.T):
        ac, bc = a.slice(k0, k1), b.slice(k0, k1)
        if a is b:
            out.append(_self_inner(ac, None if cache is None else cache.strips(a.right, k0, k1)))
            continue
        if cache is not None and a.right is b.right:
            gr = cache.gram(a.right, k0, k1)
        else:
            gr = torch.bmm(ac.right, bc.right.transpose(1, 2))
        lg = _left_gram(ac, bc)
        out.append(torch.linalg.vecdot(lg.reshape(k1 - k0, -1), gr.reshape(k1 - k0, -1)))
    return _one_or_cat(out)


def _ghost_inner_windows(a: Outer, b: Outer, cache: GramCache | None) -> Tensor:
    """:func:`ghost_inner` row by row over each row's token windows (an Outer without windows: all tokens)."""
    K = a.K
    fa, la = a.win if a.win is not None else ([0] * K, [a.T] * K)
    fb, lb = b.win if b.win is not None else ([0] * K, [b.T] * K)
    out = []
    for k in range(K):
        if la[k] <= fa[k] or lb[k] <= fb[k]:
            out.append(a.right.new_zeros((), dtype=torch.float32))
            continue
        ak = a.row(k, fa[k], la[k])
        if a is b:
            rs = None if cache is None else cache.strips_row(a.right, k, fa[k], la[k])
            out.append(_self_inner(ak, rs)[0])
            continue
        bk = b.row(k, fb[k], lb[k])
        gr = ak.right[0] @ bk.right[0].T
        out.append(torch.linalg.vecdot(_left_gram(ak, bk).reshape(-1), gr.reshape(-1)))
    return torch.stack(out)


#: leading elements of each token's gradient that :func:`token_windows` reads first
WINDOW_PROBE = 8


def token_windows(c: Outer) -> tuple[list[int], list[int]] | None:
    """Per row, the window ``[first, last)`` outside which the gradient factor of ``c`` is exactly zero.

    The gradient factor is ``left`` for a Linear (the output gradient) and ``right`` for token ids (the
    embedding's output gradient). In a causal LM with right-padded rows every layer's output gradient is zero
    after a row's last token, and an output head's is zero on the prompt, so these tokens can be skipped
    exactly. Returns None when the windows would drop less than ``TRIM_MIN_FRACTION`` of the tokens.

    Work: every token's first ``WINDOW_PROBE`` elements are read; a token found non-zero there is inside the
    window, so only the tokens before a row's first and after its last such token are read in full (a
    gradient row is rarely zero in its first elements unless it is zero: mostly the padding and prompt).
    """
    g = c.right if c.is_index else c.left
    K, T = g.shape[0], g.shape[1]
    g = g.reshape(K, T, -1)
    nz = g[:, :, :WINDOW_PROBE].ne(0).any(-1)  # [K, T]: True means non-zero; False: not known yet
    if g.shape[2] > WINDOW_PROBE:
        t = torch.arange(T, device=g.device)
        has = nz.any(1)
        f0 = torch.where(has, nz.to(torch.uint8).argmax(1), T)
        l0 = torch.where(has, T - nz.to(torch.uint8).flip(1).argmax(1), 0)
        edge = (t[None, :] < f0[:, None]) | (t[None, :] >= l0[:, None])  # tokens that decide the window
        if bool(edge.any()):
            nz[edge] = g[edge].ne(0).any(-1)
    nz = nz.to(torch.uint8)
    has = nz.any(1).bool()
    first = torch.where(has, nz.argmax(1), 0)
    last = torch.where(has, T - nz.flip(1).argmax(1), 0)
    first, last = first.tolist(), last.tolist()
    if sum(last) - sum(first) > (1 - TRIM_MIN_FRACTION) * K * T:
        return None
    return first, last


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
    for k0, k1 in _chunks(grp.K, _numel(regrouped[0].shape)):
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
        total = 0
        for i, a in enumerate(contribs):
            for b in contribs[i:]:
                total = total + (1 if a is b else 2) * ghost_inner(a, b, cache)
        return total
    K = contribs[0].K
    per_item = _numel(contribs[0].shape)
    out = []
    for k0, k1 in _chunks(K, per_item):
        m = materialized_sum([c.slice(k0, k1) for c in contribs])
        out.append(torch.linalg.vector_norm(m.reshape(k1 - k0, -1), dim=1).square())
    return _one_or_cat(out)
