"""Shared helpers for the gradnorm tests: padded batches and a tiny non-HF LM with torch norm layers."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


def make_batch(vocab: int, prompt_lens, resp_lens, *, left_pad: bool = True, seed: int = 0):
    """Batch in the project layout. left_pad: ``[pad.. prompt | response ..pad]`` (prompt block aligned
    right); otherwise right-padded ``[prompt response pad..]``. Returns ids, attention_mask, response_mask."""
    g = torch.Generator().manual_seed(seed)
    P = max(prompt_lens)
    T = P + max(resp_lens) if left_pad else max(p + r for p, r in zip(prompt_lens, resp_lens))
    B = len(prompt_lens)
    ids = torch.zeros(B, T, dtype=torch.long)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        start = P - p if left_pad else 0
        ids[i, start:start + p + r] = torch.randint(1, vocab, (p + r,), generator=g)
        am[i, start:start + p + r] = 1
        rm[i, start + p:start + p + r] = 1
    return ids, am, rm


class Scale(nn.Module):
    """A custom module with a parameter and no gradnorm rule."""

    def __init__(self, d: int):
        super().__init__()
        self.gain = nn.Parameter(1.0 + 0.3 * torch.randn(d))

    def forward(self, x):
        return x * self.gain


class ToyLM(nn.Module):
    """Embedding -> LayerNorm -> causal running mean -> Linear on [B,T,2,d/2] -> RMSNorm -> (Scale) -> head."""

    def __init__(self, vocab=23, d=8, padding_idx=None, custom=False, tied=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, d, padding_idx=padding_idx)
        self.ln = nn.LayerNorm(d)
        self.halves = nn.Linear(d // 2, d // 2)
        self.rms = nn.RMSNorm(d, eps=1e-5)
        self.scale = Scale(d) if custom else None
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        with torch.no_grad():
            for n, p in self.named_parameters():
                if "ln" in n or "rms" in n:
                    p.add_(0.2 * torch.randn_like(p))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
        m = attention_mask.float()[..., None]
        h = self.ln(self.emb(input_ids)) * m
        h = h.cumsum(1) / m.cumsum(1).clamp_min(1.0)  # tokens interact (causally)
        B, T, d = h.shape
        h = h + torch.tanh(self.halves(h.view(B, T, 2, d // 2))).reshape(B, T, d)
        h = self.rms(h)
        if self.scale is not None:
            h = self.scale(h)
        return SimpleNamespace(logits=self.head(h))


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs().clamp_min(1e-12)).max())


def checkpointed(model, reentrant: bool = False):
    """``model`` in train mode with Hugging Face activation checkpointing on (non-reentrant by default)."""
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return model


def grad_err(got, ref) -> float:
    """Largest relative max-abs error over a list of gradient tensors."""
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(got, ref))


# A ragged batch of 7 rows: unequal prompts and responses, one response a single token.
RAGGED_PROMPTS = [3, 4, 2, 5, 3, 3, 4]
RAGGED_RESPONSES = [5, 2, 6, 4, 3, 1, 3]


def ragged_batch(vocab: int):
    """The 7-row ragged batch (left-padded, seed 2) the engine-against-loop tests share."""
    return make_batch(vocab, RAGGED_PROMPTS, RAGGED_RESPONSES, seed=2)


def assert_matches_loop(model, ids, am, rm, coeffs, gid, w, gk, grads, rtol: float) -> None:
    """An engine's per-row squared norms ``w``, group norms ``gk`` and weighted gradient ``grads`` against the
    loop reference (one backward per row) on the same batch, each within ``rtol`` (largest relative error)."""
    from oblr.gradnorm import loop_group_sq_norms, loop_sequence_sq_norms, loop_weighted_grad

    assert rel_err(w, loop_sequence_sq_norms(model, ids, am, rm)) < rtol
    assert rel_err(gk, loop_group_sq_norms(model, ids, am, rm, coeffs, gid)) < rtol
    assert grad_err(grads, loop_weighted_grad(model, ids, am, rm, coeffs)) < rtol
