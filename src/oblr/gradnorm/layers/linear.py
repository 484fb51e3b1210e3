"""nn.Linear: weight by ghost norm or materialisation (an Outer), bias as a reduced Dense.

Per sequence i with tokens t (all leading dims between batch and features flattened):
``dW_i = sum_t g_{i,t} x_{i,t}^T`` ([d_out, d_in]), ``db_i = sum_t g_{i,t}``. Also covers peft LoRA
adapters, whose ``lora_A``/``lora_B`` are plain nn.Linear modules.
"""

from __future__ import annotations

from torch import nn

from ..contrib import Dense, Outer
from .base import register_rule


@register_rule(nn.Linear, params=("weight", "bias"))
def linear_rule(module: nn.Linear, x, g, names):
    B = g.shape[0]
    if x.dim() != 3:  # already [B, T, d]: no reshape dispatched (one host-side operator per factor and call)
        x = x.reshape(B, -1, x.shape[-1])
    if g.dim() != 3:
        g = g.reshape(B, -1, g.shape[-1])
    out = {}
    if "weight" in names:
        out["weight"] = Outer(g, x, module.weight.shape)
    if "bias" in names:
        out["bias"] = Dense(g.float().sum(1))
    return out
