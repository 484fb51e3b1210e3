"""Per-token log-probabilities and entropies of a causal LM, with left or right padding.

Layout convention used across oblr: ``input_ids`` [B, T] holds prompt and response tokens;
``attention_mask`` [B, T] is 1 on real tokens; ``response_mask`` [B, T] is 1 on response tokens.
``token_logprobs(...)[i, t] = log p(input_ids[i, t] | input_ids[i, <t])``, taken from the logits at
position ``t - 1``; column 0 is 0 (no prediction for the first token).

:func:`chunked_response_logprobs` gives the scored log-probs without ever holding the ``[B, T, V]`` logits:
the model's output layer is applied ``chunk`` positions at a time, each chunk under non-reentrant
checkpointing (its logits are recomputed in the backward, one chunk at a time).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint


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


def entropy_of_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the last dimension, float32. [...]"""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution predicting position t, aligned like the log-probs. [B, T]."""
    return torch.nn.functional.pad(entropy_of_logits(logits[:, :-1]), (1, 0), value=0.0)


def sequence_logprobs(token_lp: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """l_i = sum_t response_mask[i, t] * token_lp[i, t]. [B]."""
    return (token_lp * response_mask.to(token_lp.dtype)).sum(-1)


# ------------------------------------------------------------------ chunked output layer
#: model types whose causal-LM forward is ``logits = lm_head(hidden)`` with nothing applied afterwards (no
#: soft-capping or scaling), so the output layer can be swapped for :class:`_ChunkedHead`
CHUNKABLE_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "smollm3")


class _ChunkedHead(torch.nn.Module):
    """Stands in for a causal LM's output layer during one forward: returns the scored token log-probs [B, T]
    (as :func:`sampling_token_logprobs`) instead of logits, computing the logits ``chunk`` positions at a
    time. With gradients on, each chunk runs under non-reentrant checkpointing, so no chunk's logits are kept
    for the backward; the summed token entropy of the response positions is kept in ``entropy_sum``
    (detached; computed in the forward only, not again when a chunk is recomputed)."""

    def __init__(self, head: torch.nn.Module, input_ids, response_mask, chunk: int, temperature: float,
                 top_p: float):
        super().__init__()
        self.head = head
        self.ids, self.rm = input_ids, response_mask
        self.chunk, self.temperature, self.top_p = chunk, temperature, top_p
        self.entropy_sum = None
        self.out = None
        self._forwarding = False

    def _piece(self, h: torch.Tensor, t0: int) -> torch.Tensor:
        t1 = t0 + h.shape[1]
        logits = self.head(h)
        lp = sampling_log_probs(logits, temperature=self.temperature, top_p=self.top_p)
        if self._forwarding:
            with torch.no_grad():
                scaled = logits.detach() if self.temperature == 1.0 else logits.detach() / self.temperature
                self.entropy_sum = self.entropy_sum + (entropy_of_logits(scaled) * self.rm[:, t0 + 1:t1 + 1]).sum()
        return lp.gather(-1, self.ids[:, t0 + 1:t1 + 1, None]).squeeze(-1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        T = hidden.shape[1]
        if T != self.ids.shape[1]:
            raise RuntimeError(f"chunked output layer: the model passed {T} positions to its output layer, "
                               f"expected {self.ids.shape[1]} (a model that slices its hidden states is not supported)")
        self._forwarding = True
        self.entropy_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad = torch.is_grad_enabled()
        parts = []
        try:
            for t0 in range(0, T - 1, self.chunk):
                h = hidden[:, t0:min(T - 1, t0 + self.chunk)]
                parts.append(checkpoint(self._piece, h, t0, use_reentrant=False) if grad else self._piece(h, t0))
        finally:
            self._forwarding = False
        lp = torch.cat(parts, dim=1) if parts else hidden.new_zeros((hidden.shape[0], 0), dtype=torch.float32)
        self.out = torch.nn.functional.pad(lp, (1, 0), value=0.0)  # one position: nothing predicted, [B, 1]
        return self.out


def _head_slot(model: torch.nn.Module):
    """``(parent, attribute, head)``: where the model keeps its output layer (through PEFT wrappers too)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output layer (get_output_embeddings() is None); "
                         "model.logit_chunk_tokens needs one")
    for name, mod in model.named_modules():
        if mod is head:
            parent, _, attr = name.rpartition(".")
            return (model.get_submodule(parent) if parent else model), attr, head
    raise ValueError(f"{type(model).__name__}: its output layer is not one of its submodules")


def check_chunkable(model_type: str | None, where: str = "model.logit_chunk_tokens") -> None:
    """Refuse a model type whose forward may post-process the logits (one line)."""
    if model_type not in CHUNKABLE_MODEL_TYPES:
        raise ValueError(f"{where}: model type {model_type!r} is not known to return its output layer's logits "
                         f"unchanged (known: {', '.join(CHUNKABLE_MODEL_TYPES)}); set it to 0")


@contextmanager
def _swapped_head(slot, head_stand_in):
    parent, attr, head = slot
    setattr(parent, attr, head_stand_in)
    try:
        yield
    finally:
        setattr(parent, attr, head)


def chunked_response_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                              response_mask: torch.Tensor, *, chunk: int, temperature: float = 1.0,
                              top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token log-probs [B, T], entropy sum)``: :func:`response_token_logprobs` of :func:`forward_logits`
    and the summed response-token entropy of ``softmax(logits / temperature)``, with the output layer applied
    ``chunk`` positions at a time (module docstring). Peak logit memory ``~ B * chunk * V`` instead of
    ``B * T * V``; the backward recomputes each chunk's logits (one more output-layer product)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    check_chunkable(getattr(getattr(model, "config", None), "model_type", None))
    slot = _head_slot(model)
    stand_in = _ChunkedHead(slot[2], input_ids, response_mask.to(torch.float32), chunk, temperature, top_p)
    with _swapped_head(slot, stand_in):
        out = model(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids_from_mask(attention_mask), use_cache=False)
    if out.logits is not stand_in.out:
        raise RuntimeError(f"{type(model).__name__} changed its output layer's result before returning it; "
                           "model.logit_chunk_tokens cannot be used with it")
    lp = torch.where(response_mask.bool(), out.logits, torch.zeros_like(out.logits))
    return lp, stand_in.entropy_sum
