"""Per-token log-probabilities and entropies of a causal LM, with left or right padding.

Layout convention used across oblr: ``input_ids`` [B, T] holds prompt and response tokens;
``attention_mask`` [B, T] is 1 on real tokens; ``response_mask`` [B, T] is 1 on response tokens.
``token_logprobs(...)[i, t] = log p(input_ids[i, t] | input_ids[i, <t])``, taken from the logits at
position ``t - 1``; column 0 is 0 (no prediction for the first token).
"""

from __future__ import annotations

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them. [B, T] long."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp_(min=0)


def forward_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V] from one forward pass, with position ids derived from the mask."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.logits


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Shift and gather: [B, T, V] logits, [B, T] ids -> [B, T] log-probs (column 0 is 0), float32."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    tok = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(tok, (1, 0), value=0.0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, <t]) for every position, [B, T] float32 (column 0 is 0)."""
    return gather_logprobs(forward_logits(model, input_ids, attention_mask), input_ids)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution predicting position t, aligned like the log-probs. [B, T]."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.nn.functional.pad(ent, (1, 0), value=0.0)


def sequence_logprobs(token_lp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """l_i = sum_t response_mask[i, t] * token_lp[i, t]. [B]."""
    return (token_lp * response_mask.to(token_lp.dtype)).sum(-1)
