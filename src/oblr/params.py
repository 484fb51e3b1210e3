"""The trainable parameters of a model, and the squared norm of their gradient: the one home of both.

Every path that updates a model (the trainer, the data-parallel step, the framework adapters, the
exact-norm engine and its loop reference) takes the parameters to train from :func:`trainable_params`,
so they all reduce, clip, measure and checkpoint the same list in the same order. :func:`grad_sq_norm`
is ``||.grad||^2`` in one process; data-parallel and sharded gradients are measured over every rank by
:func:`oblr.distributed.collectives.grad_sq_norm` (float64); both sum with :func:`sq_norm_sum`.
"""

from __future__ import annotations


def trainable_params(model) -> list:
    """The parameters an update changes (``requires_grad``), in ``model.parameters()`` order (which
    deduplicates tied parameters by identity)."""
    return [p for p in model.parameters() if p.requires_grad]


def grad_sq_norm(model):
    """``sum_p ||p.grad||^2`` over the trainable parameters (float32, 0-d; no host sync)."""
    return params_grad_sq_norm(trainable_params(model))


def params_grad_sq_norm(params: list):
    """:func:`grad_sq_norm` of a parameter list (those without ``.grad`` skipped; float32, 0-d)."""
    return sq_norm_sum([p.grad for p in params if p.grad is not None], device=params[0].device if params else None)


def sq_norm_sum(tensors, *, dtype=None, device=None):
    """``sum_t ||t||^2``: a 0-d tensor of ``dtype`` on ``device``, summed over ``tensors`` in order from 0.

    float32 (``dtype=None``, the default): each ``t.float().pow(2).sum()``, one process's ``||.grad||^2`` (:func:`grad_sq_norm`).
    float64: each tensor's sum of squares in float64, converting ``2**22`` elements at a time (no float64 copy
    of a whole tensor), for :func:`oblr.distributed.collectives.grad_sq_norm`, whose S is a difference of nearly
    equal numbers. (The two per-tensor sums are kept as they are: either one in the other's place changes the
    last bits of the result.)
    """
    import torch

    if dtype not in (None, torch.float32, torch.float64):
        raise ValueError(f"sq_norm_sum: dtype must be torch.float32 or torch.float64, got {dtype}")
    total = torch.zeros((), dtype=dtype, device=device)  # None: torch's default dtype (float32), as before
    for t in tensors:
        total = total + (_sq_sum64(t) if dtype == torch.float64
                         else (t if t.dtype == torch.float32 else t.float()).pow(2).sum())
    return total


def _sq_sum64(t, chunk: int = 1 << 22):
    """``sum(t**2)`` in float64, converting ``chunk`` elements at a time."""
    import torch

    flat = t.detach().reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=t.device)
    for c in flat.split(chunk):
        total = total + torch.linalg.vector_norm(c, dtype=torch.float64).square()
    return total
