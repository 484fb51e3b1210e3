"""The trainable parameters of a model, and the squared norm of their gradient: the one home of both.

Every path that updates a model (the trainer, the data-parallel step, the framework adapters, the
exact-norm engine and its loop reference) takes the parameters to train from :func:`trainable_params`,
so they all reduce, clip, measure and checkpoint the same list in the same order. :func:`grad_sq_norm`
is ``||.grad||^2`` in one process; data-parallel and sharded gradients are measured over every rank by
:func:`oblr.distributed.collectives.grad_sq_norm` (float64).
"""

from __future__ import annotations


def trainable_params(model) -> list:
    """The parameters an update changes (``requires_grad``), in ``model.parameters()`` order (which
    deduplicates tied parameters by identity)."""
    return [p for p in model.parameters() if p.requires_grad]


def grad_sq_norm(model):
    """``sum_p ||p.grad||^2`` over the trainable parameters (float32, 0-d; no host sync)."""
    import torch

    params = trainable_params(model)
    device = params[0].device if params else None
    return sum((p.grad.float().pow(2).sum() for p in params if p.grad is not None),
               torch.zeros((), device=device))
