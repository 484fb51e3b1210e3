"""TF32 products of a half-precision model's factors on CUDA: when they may run so, and the switch that does it.

On CUDA, the products of a bf16 or fp16 model's factors run as TF32 (:func:`tf32_products`): exact for the
factors themselves (TF32's 11-bit significand holds their values); a factor the one-pass engine scaled by a
row's coefficient first is rounded to 11 bits (relative 2^-11 per element, below the 2^-8 of the bf16 values
it came from and of a bf16 gradient it is added to; for fp16, equal to its own). Products of accumulated
per-row gradients (the two-pass Grams ``z z^T``) stay float32. :data:`TF32_HALF_PRODUCTS` switches it off.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from .contrib import Outer

#: half-precision factor dtypes: their values are exact in TF32 (8- and 11-bit significands, TF32 keeps 11)
HALF = (torch.bfloat16, torch.float16)
#: run the float32 products of half-precision factors on CUDA as TF32 (:func:`tf32_products`); False: full
#: float32 (``benchmarks/gpu/memory_check.py --fp32-compare`` measures the difference)
TF32_HALF_PRODUCTS = True


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
