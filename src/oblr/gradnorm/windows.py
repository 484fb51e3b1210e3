"""Each row's token window outside which an Outer contribution's gradient factor is exactly zero.

In a causal LM with right-padded rows every layer's output gradient is zero after a row's last token, and an
output head's is zero on the prompt; :func:`token_windows` finds those windows on CPU so that the Grams and the
per-group products may skip the zero tokens exactly (``Outer.win``).
"""

from __future__ import annotations

import torch

from .contrib import Outer

#: an Outer's rows are trimmed to their non-zero token windows (:func:`token_windows`) when that drops at
#: least this fraction of its tokens
TRIM_MIN_FRACTION = 0.1

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
