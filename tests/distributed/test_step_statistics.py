"""oblr.distributed.step.step_statistics, the one owner of a step's ||gbar||^2 and S, V: the same numbers as
the sums it replaced (bit for bit), S and V by hand, the sum form, and no statistics without norms."""

from __future__ import annotations

import torch

from oblr.distributed.collectives import grad_sq_norm as collective_grad_sq_norm
from oblr.distributed.step import step_statistics
from oblr.params import grad_sq_norm


def _model_with_grads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 3))
    model[1].bias.requires_grad_(False)  # frozen: not part of ||gbar||^2
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    return model


def test_one_process_float32_is_the_params_sum_bit_for_bit_and_s_v_are_the_formula():
    model = _model_with_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    gks = torch.tensor([3.0, 5.0, 4.5, 6.0])
    gsq, st = step_statistics(params, gks, float64=False)
    assert gsq.dtype == torch.float32 and torch.equal(gsq, grad_sq_norm(model))  # what oblr train always summed
    by_hand = sum(float(p.grad.double().pow(2).sum()) for p in params)
    assert abs(float(gsq) - by_hand) < 1e-5 * by_hand
    N = 4
    V = (float(gks.sum()) - N * float(gsq)) / (N - 1)
    signal = float(gsq) - V / N
    assert st.n == N and abs(float(st.V) - V) < 1e-5 * abs(V) and abs(float(st.signal) - signal) < 1e-4 * abs(V)
    assert float(st.S) == max(float(st.signal), 0.0)


def test_float64_is_the_collective_sum_and_the_summed_form_gives_the_same_s_v():
    model = _model_with_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    gks = torch.tensor([3.0, 5.0, 4.5, 6.0])
    gsq, st = step_statistics(params, gks)
    assert gsq.dtype == torch.float64 and torch.equal(gsq, collective_grad_sq_norm(params))
    assert st.S.dtype == torch.float64
    gsq2, st2 = step_statistics(params, gks.double().sum(), 4)  # sum over ranks, as TRL and verl pass it
    assert torch.equal(gsq2, gsq) and torch.equal(st2.V, st.V) and torch.equal(st2.signal, st.signal)


def test_without_per_prompt_norms_only_the_norm():
    model = _model_with_grads()
    params = [p for p in model.parameters() if p.requires_grad]
    gsq, st = step_statistics(params, None, float64=False)
    assert st is None and torch.equal(gsq, grad_sq_norm(model))
