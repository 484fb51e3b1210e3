"""Forward-only proxies for w_i = ||s_i||^2 (no backward pass).

- :func:`length_weights`: the response length ``L_i`` (OPO's proxy).
- :func:`logit_energy_weights`: ``sum_t (1 - 2 p_t + sum_v p_{t,v}^2)`` over response tokens, where
  ``p_{t,.}`` is the next-token distribution from the logits at ``t - 1`` and ``p_t`` its value at the
  sampled token ``input_ids[t]``. Each term is ``||onehot(y_t) - p_t||^2``, the squared norm of the
  gradient of ``log p_t`` with respect to the logits: the per-sequence norm of the score restricted to
  the last layer's output, ignoring cross-token terms.
"""

from __future__ import annotations

import torch


def length_weights(response_mask: torch.Tensor) -> torch.Tensor:
    """L_i = sum_t response_mask[i, t]. [B] float32."""
    return response_mask.float().sum(-1)


def logit_energy_weights(logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """sum_t response_mask[i,t] (1 - 2 p_{i,t} + sum_v p_{i,t,v}^2), p from logits[:, t-1]. [B] float32.

    logits [B, T, V], input_ids and response_mask [B, T]. Column 0 (no prediction) contributes 0.
    """
    if logits.shape[:2] != input_ids.shape or input_ids.shape != response_mask.shape:
        raise ValueError(f"shape mismatch: logits {tuple(logits.shape)}, input_ids {tuple(input_ids.shape)}, "
                         f"response_mask {tuple(response_mask.shape)}")
    with torch.no_grad():
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        p_tok = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1).exp()
        sum_p2 = torch.exp(2.0 * logp).sum(-1)
        energy = 1.0 - 2.0 * p_tok + sum_p2
        return (energy * response_mask[:, 1:].float()).sum(-1)
