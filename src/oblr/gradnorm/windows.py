"""Each row's token window outside which an Outer contribution's gradient factor is exactly zero, and how to skip it.

In a causal LM with right-padded rows every layer's output gradient is zero after a row's last token, and an
output head's is zero on the prompt; :func:`token_windows` finds those windows on CPU. :func:`trim_windows` then
skips the zero tokens exactly, in one of two ways: the span that holds every row's window crops both factors (a
view: every later query stays batched), and inside that span each row's own window is kept (``Outer.win``: the
Grams and per-group products loop over rows) only where the tokens it skips outweigh the loops' host cost per
row (:func:`row_windows_pay`). Where no row's window could pay (one row's whole work is within that cost) only the
span is searched (:func:`token_span`, which reads less than every row's window) and crops both factors.
"""

from __future__ import annotations

import torch

from .contrib import MEMORY_COST, Outer
from .strips import strip_entries

#: an Outer's rows are trimmed to their non-zero token windows (:func:`token_windows`) when that drops at
#: least this fraction of its tokens
TRIM_MIN_FRACTION = 0.1

#: leading elements of each token's gradient that :func:`token_windows` reads first
WINDOW_PROBE = 8

#: host cost of one row of the per-row window loops, in multiply-adds: the operators one row dispatches in a
#: ghost norm and a per-group product (about a dozen, each some microseconds on CPU) at the rate of the small
#: products they replace: ``python benchmarks/window_cost.py`` times both ways and prints this choice per shape
#: (benchmarks/results/step_cost/issue41/window_cost.md: it picks the faster way in each of its 9 cases)
ROW_DISPATCH_MACS = 1_500_000


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


def token_span(c: Outer) -> tuple[int, int] | None:
    """``[first, last)``: the tokens where some row's gradient factor is non-zero (None: every token is zero in
    every row), i.e. the span of :func:`token_windows`' windows, found with less reading: every token's first
    :data:`WINDOW_PROBE` elements, then in full only the tokens where no row's probe saw a non-zero (a prompt at
    an output head, padding that every row shares)."""
    g = c.right if c.is_index else c.left
    K, T = g.shape[0], g.shape[1]
    g = g.reshape(K, T, -1)
    seen = g[:, :, :WINDOW_PROBE].ne(0).any(-1).any(0)  # [T]
    if g.shape[2] > WINDOW_PROBE:
        unknown = ~seen
        if bool(unknown.any()):
            seen[unknown] = g[:, unknown].ne(0).any(-1).any(0)
    idx = seen.nonzero().flatten()
    if idx.numel() == 0:
        return None
    return int(idx[0]), int(idx[-1]) + 1


def _row_work(c: Outer, n: int) -> int:
    """Multiply-adds of one per-group product (``n R C``) and one ghost norm (:func:`strip_entries` ``(n)
    (R + C + MEMORY_COST)``) over ``n`` tokens of one row of ``c``."""
    r = 1 if c.is_index else c.R
    return n * r * c.C + strip_entries(n, c.right.device.type) * (r + c.C + MEMORY_COST)


def row_windows_pay(c: Outer, first: list[int], last: list[int]) -> bool:
    """True when the per-row windows ``first:last`` of ``c`` (already cropped to their common span) save more work
    than their per-row loops cost: the multiply-adds of one per-group product (``n R C``) and one ghost norm
    (:func:`strip_entries` ``(n) (R + C + MEMORY_COST)``) over the tokens the windows skip, against
    :data:`ROW_DISPATCH_MACS` per row. Many short rows of a small model (the paper's 128 x 8 batch on the built-in
    model) fail it: their loops are bound by dispatch, not by the products."""
    full = _row_work(c, c.T)
    saved = sum(full - _row_work(c, max(0, b - a)) for a, b in zip(first, last))
    return saved > ROW_DISPATCH_MACS * c.K


def trim_windows(c: Outer) -> Outer:
    """``c`` with the tokens whose gradient factor is zero skipped, exactly (module docstring).

    When no row's window could pay for its loops (one row's whole work is at most :data:`ROW_DISPATCH_MACS`) only
    the span is looked for (:func:`token_span`, cheaper than every row's window) and crops both factors when it
    drops at least :data:`TRIM_MIN_FRACTION` of the tokens. Otherwise: no windows worth taking
    (:func:`token_windows` is None, or every row is zero): ``c`` itself; else the common span ``[min first, max
    last)`` of the non-empty rows crops both factors (views), and the rows' own windows, shifted into that span,
    are kept as ``win`` only when :func:`row_windows_pay`."""
    if _row_work(c, c.T) <= ROW_DISPATCH_MACS:
        span = token_span(c)
        if span is None or span[1] - span[0] > (1 - TRIM_MIN_FRACTION) * c.T:
            return c
        a, b = span
        return Outer(c.left[:, a:b], c.right[:, a:b], c.shape)
    win = token_windows(c)
    if win is None:
        return c
    first, last = win
    live = [k for k in range(len(first)) if last[k] > first[k]]
    if not live:
        c.win = win
        return c
    a, b = min(first[k] for k in live), max(last[k] for k in live)
    out = c if (a, b) == (0, c.T) else Outer(c.left[:, a:b], c.right[:, a:b], c.shape)
    f2 = [first[k] - a if last[k] > first[k] else 0 for k in range(len(first))]
    l2 = [last[k] - a if last[k] > first[k] else 0 for k in range(len(first))]
    if row_windows_pay(out, f2, l2):
        out.win = (f2, l2)
    return out
