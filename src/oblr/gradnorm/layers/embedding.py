"""nn.Embedding: the per-sequence gradient adds g_{i,t} to row id_{i,t} of the [V, D] table.

As an Outer with one-hot left factors, its ghost norm is ``sum_{t,s} [id_t == id_s] (g_t . g_s)``
and its cross term with a tied output head ``W`` (left = logit grads q, right = hidden h) is
``sum_{t,s} q_s[id_t] (g_t . h_s)`` -- no [V, D] matrix per sequence is ever formed on the ghost path.
Rows equal to ``padding_idx`` get no gradient (as in torch).
"""

from __future__ import annotations

from torch import nn

from ..contrib import Outer
from .base import register_rule


def _check(module: nn.Embedding):
    if module.scale_grad_by_freq:
        return "scale_grad_by_freq=True makes the gradient depend on the whole batch"
    return None


@register_rule(nn.Embedding, params=("weight",), check=_check)
def embedding_rule(module: nn.Embedding, x, g, names):
    B = g.shape[0]
    ids = x.reshape(B, -1)
    g = g.reshape(B, ids.shape[1], g.shape[-1])
    if module.padding_idx is not None:
        g = g.masked_fill((ids == module.padding_idx)[..., None], 0.0)
    return {"weight": Outer(ids, g, module.weight.shape)}
