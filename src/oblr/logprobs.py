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


def _gather_shifted(logp: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """[B, T-1, V] next-token log-probs (position t predicts t+1), [B, T] ids -> [B, T] (column 0 is 0)."""
    tok = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(tok, (1, 0), value=0.0)


def gather_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Shift and gather: [B, T, V] logits, [B, T] ids -> [B, T] log-probs (column 0 is 0), float32."""
    return _gather_shifted(torch.log_softmax(logits[:, :-1].float(), dim=-1), input_ids)


def sampling_log_probs(logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probs [..., V] (float32) of the distribution a sampler draws from, given logits [..., V].

    ``q = softmax(logits / temperature)`` restricted to the nucleus -- the smallest set of most likely tokens
    whose probability reaches ``top_p``: a token is kept when the mass of the tokens sorted before it is
    ``< top_p`` (so the top token always is) -- and renormalised: ``log q_p(v) = log q(v) - log sum_{u in
    nucleus} q(u)``, ``-inf`` outside the nucleus. This is the rule of :func:`oblr.rollout.hf.sample_next_token`
    and of vLLM's top-p (``logprobs_mode="processed_logprobs"`` reports these values).
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, idx = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_lp.exp()
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly before each token
    drop = torch.zeros_like(logp, dtype=torch.bool).scatter_(-1, idx, before >= top_p)
    logp = logp.masked_fill(drop, float("-inf"))
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)


def sampling_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0,
                            top_p: float = 1.0) -> torch.Tensor:
    """Like :func:`gather_logprobs` under the sampling distribution of :func:`sampling_log_probs`. [B, T]."""
    return _gather_shifted(sampling_log_probs(logits[:, :-1], temperature=temperature, top_p=top_p), input_ids)


def response_token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, response_mask: torch.Tensor, *,
                            temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """What the update scores: :func:`sampling_token_logprobs` on response tokens, 0 elsewhere. [B, T] float32.

    Prompt and padding positions are set to 0 (under top-p they may be ``-inf``, and ``-inf * 0`` is NaN);
    a response token outside the nucleus stays ``-inf``: its sample is impossible under the scored
    distribution, the step's loss is not finite, and the trainer skips it.
    """
    lp = sampling_token_logprobs(logits, input_ids, temperature=temperature, top_p=top_p)
    return torch.where(response_mask.bool(), lp, torch.zeros_like(lp))


def logprob_gap(sampler_lp: torch.Tensor, trainer_lp: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """How far the rollout engine's log-probs of the sampled tokens are from the trainer's.

    ``sampler_lp``, ``trainer_lp``, ``response_mask``: [B, T]; both log-probs are of the same tokens under
    the same sampling distribution (temperature and top-p applied, :func:`sampling_token_logprobs`).
    Over response tokens where the trainer's log-prob is finite, ``d = |sampler_lp - trainer_lp|``:
    ``rollout/logprob_gap_max = max d``, ``rollout/logprob_gap_mean = mean d`` (0 when there is none);
    ``rollout/outside_nucleus``: response tokens the trainer's top-p nucleus excludes (log-prob ``-inf``:
    the engine sampled a token the trainer would never sample). Values are 0-d tensors.
    """
    resp = response_mask.bool()
    inside = resp & torch.isfinite(trainer_lp)
    d = (sampler_lp.float() - trainer_lp.float()).abs()
    d = torch.where(inside, d, torch.zeros_like(d))
    n = inside.sum()
    return {"rollout/logprob_gap_max": d.max() if d.numel() else d.new_zeros(()),
            "rollout/logprob_gap_mean": d.sum() / n.clamp(min=1),
            "rollout/outside_nucleus": (resp & ~inside).sum().float()}


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
