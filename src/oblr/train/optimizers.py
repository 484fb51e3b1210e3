"""Optimizers by name (``optim.optimizer``): the registry :data:`OPTIMIZERS` of factories
``f(params, optim_config) -> torch.optim.Optimizer``, built with :func:`make_optimizer`.

Registered: ``adamw`` (``lr``, ``betas``, ``weight_decay``) and ``sgd`` (``lr``, ``momentum``). The
learning rate set here is the starting value; the schedule (:mod:`oblr.schedules`) sets it every step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oblr.registry import Registry

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch

OPTIMIZERS = Registry("optimizer")


@OPTIMIZERS.register("adamw")
def adamw(params, o) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)


@OPTIMIZERS.register("sgd")
def sgd(params, o) -> torch.optim.Optimizer:
    import torch

    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum)


def make_optimizer(name: str, params, optim_config) -> torch.optim.Optimizer:
    """The optimizer registered as ``name`` over ``params``, with the settings of ``optim_config``
    (a :class:`oblr.config.OptimConfig`)."""
    return OPTIMIZERS.get(name)(params, optim_config)
