"""The slow exact reference: one backward pass per sequence.

This is what public reimplementations do and what every fast path in :mod:`oblr.gradnorm` is tested
against. One batched forward builds the graph; row i's gradient is ``autograd.grad(l_i, params)`` with
``retain_graph=True`` (B backward passes). Rows are independent, so this equals a forward per row.
Parameters are the trainable ones, deduplicated by identity (``model.parameters()`` order).
"""

from __future__ import annotations

import torch
from torch import nn

from ..logprobs import sequence_logprobs, token_logprobs
from ..params import trainable_params


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return trainable_params(model)


def loop_per_sequence_grads(model, input_ids, attention_mask, response_mask) -> list[list[torch.Tensor]]:
    """``grads[i][j]`` = d l_i / d params[j] (float32), params = :func:`trainable_parameters`."""
    params = trainable_parameters(model)
    with torch.enable_grad():
        seq_lp = sequence_logprobs(token_logprobs(model, input_ids, attention_mask), response_mask)
        out = []
        for i in range(seq_lp.shape[0]):
            gs = torch.autograd.grad(seq_lp[i], params, retain_graph=True, allow_unused=True)
            out.append([torch.zeros_like(p, dtype=torch.float32) if g is None else g.float()
                        for g, p in zip(gs, params)])
    return out


def _sq(grads: list[torch.Tensor]) -> torch.Tensor:
    return sum(g.pow(2).sum() for g in grads)


def loop_sequence_sq_norms(model, input_ids, attention_mask, response_mask) -> torch.Tensor:
    """w_i = ||d l_i / d theta||^2. [B] float32."""
    grads = loop_per_sequence_grads(model, input_ids, attention_mask, response_mask)
    return torch.stack([_sq(g) for g in grads])


def loop_weighted_grad(model, input_ids, attention_mask, response_mask, coeffs) -> list[torch.Tensor]:
    """sum_i coeffs[i] d l_i / d theta, one float32 tensor per trainable parameter."""
    grads = loop_per_sequence_grads(model, input_ids, attention_mask, response_mask)
    c = coeffs.float()
    return [sum(c[i] * grads[i][j] for i in range(len(grads))) for j in range(len(grads[0]))]


def loop_group_sq_norms(model, input_ids, attention_mask, response_mask, coeffs, group_ids) -> torch.Tensor:
    """||sum_{i: group_ids[i]=k} coeffs[i] d l_i/d theta||^2 for each distinct id k (sorted). [K] float32."""
    grads = loop_per_sequence_grads(model, input_ids, attention_mask, response_mask)
    c = coeffs.float()
    out = []
    for k in torch.unique(group_ids).tolist():
        rows = [i for i in range(len(grads)) if int(group_ids[i]) == k]
        out.append(_sq([sum(c[i] * grads[i][j] for i in rows) for j in range(len(grads[0]))]))
    return torch.stack(out)
