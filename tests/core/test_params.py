"""The one summation of ``||.grad||^2`` (oblr.params.sq_norm_sum): the one-process float32 value and the global
float64 value are bit for bit what their formulas give, over parameters in order, a tensor larger than one
float64 chunk included."""

from __future__ import annotations

import pytest
import torch

from oblr.distributed.collectives import grad_sq_norm as global_grad_sq_norm
from oblr.params import grad_sq_norm, sq_norm_sum, trainable_params


def _model_with_grads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    big = torch.nn.Parameter(torch.zeros((1 << 22) + 5))  # two float64 chunks
    model.register_parameter("big", big)
    model[2].bias.requires_grad_(False)
    for p in trainable_params(model):
        p.grad = torch.randn_like(p) * 1e-2
    model[1].weight.grad = None  # a parameter without a gradient is skipped
    return model


def test_one_process_norm_is_the_float32_sum_in_parameter_order():
    model = _model_with_grads()
    want = sum((p.grad.float().pow(2).sum() for p in trainable_params(model) if p.grad is not None),
               torch.zeros(()))
    got = grad_sq_norm(model)
    assert got.dtype == torch.float32 and torch.equal(got, want)


def test_global_norm_is_the_chunked_float64_sum_in_parameter_order():
    model = _model_with_grads()
    want = torch.zeros((), dtype=torch.float64)
    for p in trainable_params(model):
        if p.grad is not None:
            per = torch.zeros((), dtype=torch.float64)
            for c in p.grad.reshape(-1).split(1 << 22):
                per = per + torch.linalg.vector_norm(c, dtype=torch.float64).square()
            want = want + per
    got = global_grad_sq_norm(trainable_params(model))
    assert got.dtype == torch.float64 and torch.equal(got, want)
    # and it differs from a plain float64 sum of the float32 value only by rounding
    assert abs(got.item() - grad_sq_norm(model).item()) < 1e-5 * got.item()


def test_other_dtypes_are_refused_in_one_line():
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        sq_norm_sum([torch.ones(2)], dtype=torch.bfloat16)
