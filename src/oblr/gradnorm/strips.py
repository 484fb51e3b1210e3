"""Symmetric per-sample Grams ``t t^T`` formed as column strips of their lower triangle; a cache of one factor's Grams.

The ghost norm of a contribution with itself needs the Grams ``x x^T`` and ``g g^T`` of one row's tokens, which
are symmetric: on CPU only their lower triangle is formed, as at most :data:`GRAM_STRIPS` column strips
(:func:`strip_bounds`, :func:`sym_strips`), and two such Grams are multiplied entry by entry with each strip's
diagonal block counted once and the blocks below it twice (:func:`strips_dot`). On every other device a Gram is
one full product (:func:`gram_strips`). :class:`GramCache` keeps the last factor's Grams, so the q/k/v (and
gate/up) projections that read one input form its Gram once.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor

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


def sym_strips(t: Tensor, dtype: torch.dtype = torch.float32) -> list[Tensor]:
    """The lower-triangle strips of ``t t^T`` per sample (:func:`strip_bounds`): ``t`` [K, T, d] float gives
    ``[K, T - start, width]`` each; ``t`` [K, T] token ids stand for one-hot rows (their Gram is equality, as
    ``dtype``)."""
    bounds = strip_bounds(t.shape[1], t.device.type)
    if len(bounds) == 1:  # one strip: the whole Gram, from the factor itself
        return [torch.bmm(t, t.transpose(1, 2)) if t.is_floating_point() else (t[:, :, None] == t[:, None, :]).to(dtype)]
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
        part = t if k0 == 0 and k1 == t.shape[0] else t[k0:k1]
        return self._get(t, ("gram", k0, k1), lambda: torch.bmm(part, part.transpose(1, 2)))

    def strips(self, t: Tensor, k0: int, k1: int) -> list[Tensor]:
        """:func:`sym_strips` of samples ``k0:k1``."""
        return self._get(t, ("strips", k0, k1), lambda: sym_strips(t if k0 == 0 and k1 == t.shape[0] else t[k0:k1]))

    def strips_row(self, t: Tensor, k: int, a: int, b: int) -> list[Tensor]:
        """:func:`sym_strips` of sample ``k``'s tokens ``a:b`` (one sample)."""
        return self._get(t, ("row", k, a, b), lambda: sym_strips(t[k:k + 1, a:b]))
