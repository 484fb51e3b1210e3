"""Normalisation weights: torch.nn.RMSNorm, torch.nn.LayerNorm and Hugging Face ``*RMSNorm`` classes.

With ``x_hat`` the normalised input (recomputed here in float32 from the recorded input), the
per-sequence gradients are ``dweight_i = sum_t g_{i,t} * x_hat_{i,t}`` and ``dbias_i = sum_t g_{i,t}``,
summed over every leading dim between the batch and the normalised dims (Qwen3's ``q_norm``/``k_norm``
act on [B, T, heads, head_dim]: heads are summed too). Stored as reduced :class:`Dense` rows.
Hugging Face RMSNorm classes (``Qwen3RMSNorm``, ``LlamaRMSNorm``, ...) compute ``x_hat`` in float32 and
cast it to the input dtype before multiplying by the weight; the rule does the same. They are matched by
structure and verified numerically against autograd once per class and dtype (see ``rule_for``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..contrib import Dense, f32
from .base import register_rule, register_structural_rule


def _rms_hat(x: torch.Tensor, nd: int, eps: float) -> torch.Tensor:
    xf = f32(x)
    dims = tuple(range(-nd, 0))
    return xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)


def _reduce(g: torch.Tensor, v: torch.Tensor, shape) -> torch.Tensor:
    """sum over every dim but batch and the trailing ``shape`` dims: [B, *shape] float32."""
    p = f32(g) * v
    if p.dim() != 2 + len(shape):  # one dim between batch and ``shape`` already: no reshape dispatched
        p = p.reshape(g.shape[0], -1, *shape)
    return p.sum(1)


@register_rule(nn.RMSNorm, params=("weight",))
def rmsnorm_rule(module: nn.RMSNorm, x, g, names):
    shape = tuple(module.normalized_shape)
    eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
    return {"weight": Dense(_reduce(g, _rms_hat(x, len(shape), eps), shape))}


@register_rule(nn.LayerNorm, params=("weight", "bias"))
def layernorm_rule(module: nn.LayerNorm, x, g, names):
    shape = tuple(module.normalized_shape)
    out = {}
    if "weight" in names:
        xf = x.float()
        dims = tuple(range(-len(shape), 0))
        mu = xf.mean(dims, keepdim=True)
        var = (xf - mu).pow(2).mean(dims, keepdim=True)
        out["weight"] = Dense(_reduce(g, (xf - mu) * torch.rsqrt(var + module.eps), shape))
    if "bias" in names:
        out["bias"] = Dense(g.float().reshape(g.shape[0], -1, *shape).sum(1))
    return out


def _hf_eps(module: nn.Module):
    for attr in ("variance_epsilon", "eps"):
        v = getattr(module, attr, None)
        if isinstance(v, (float, int)) and not isinstance(v, bool):
            return float(v)
    return None


def _is_hf_rmsnorm(module: nn.Module) -> bool:
    params = dict(module.named_parameters(recurse=False))
    return (
        type(module).__name__.endswith("RMSNorm")
        and list(params) == ["weight"]
        and params["weight"].dim() == 1
        and _hf_eps(module) is not None
        and not list(module.children())
    )


def _hf_probe(module: nn.Module) -> torch.Tensor:
    w = module.weight
    gen = torch.Generator().manual_seed(1)
    return (2.0 * torch.randn(2, 3, w.shape[0], generator=gen)).to(device=w.device, dtype=w.dtype)


@register_structural_rule(_is_hf_rmsnorm, _hf_probe, params=("weight",))
def hf_rmsnorm_rule(module: nn.Module, x, g, names):
    x_hat = _rms_hat(x, 1, _hf_eps(module))
    if x.dtype != torch.float32:  # HF casts x_hat to the input dtype
        x_hat = x_hat.to(x.dtype).float()
    return {"weight": Dense(_reduce(g, x_hat, (module.weight.shape[0],)))}
