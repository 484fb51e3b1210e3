"""Activations kept for the backward per plan (the plan names, ``PLANS``), one recomputed layer, and the
float32 logit-sized tensors at the start of the backward (pure functions; the counts are derived in
:mod:`oblr.memory_model`'s docstring)."""

from __future__ import annotations

from .shapes import Shape

PLANS = ("grpo", "oblr", "grpo_ckpt", "oblr_ckpt", "oblr_recompute")
LOGIT_MULT = {"grpo": 5, "oblr": 4, "grpo_ckpt": 5, "oblr_ckpt": 5, "oblr_recompute": 4}
CHECKPOINTED = ("grpo_ckpt", "oblr_ckpt", "oblr_recompute")


def act_per_token_layer(s: Shape, plan: str) -> int:
    """Activation elements kept per token per layer (see the module docstring); checkpointed: the layer input."""
    h, q, kv, i = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate
    if plan == "grpo":
        return 6 * h + 7 * q + 6 * kv + 4 * i
    if plan == "oblr":
        return 10 * h + 5 * q + 4 * kv + 4 * i
    if plan in CHECKPOINTED:
        return h
    raise ValueError(f"unknown plan {plan!r}; known: {', '.join(PLANS)}")


def activation_bytes(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int = 4) -> int:
    """Activations of ``batch`` sequences of ``tokens`` tokens (layers, one recomputed layer if
    checkpointed, and ``4h`` per token outside the layers), plus the ``[B, 1, T, T]`` attention mask Hugging Face
    builds for a padded batch (sdpa and eager attention; one tensor in the activation dtype that every layer's
    attention keeps, and checkpointing keeps as a layer input; flash-attention kernels need none, so this errs
    on the safe side there)."""
    per_tok = s.layers * act_per_token_layer(s, plan) + 4 * s.hidden
    return batch * tokens * (per_tok + tokens) * act_bytes


def recompute_bytes(s: Shape, batch: int, tokens: int, act_bytes: int = 4) -> int:
    """One recomputed layer's activations (checkpointed plans)."""
    return batch * tokens * act_per_token_layer(s, "grpo") * act_bytes


def chunked(tokens: int, logit_chunk: int) -> bool:
    """Whether the output layer runs in more than one chunk (``model.logit_chunk_tokens``)."""
    return 0 < logit_chunk < tokens - 1


def logits_bytes(s: Shape, plan: str, batch: int, tokens: int, logit_chunk: int = 0) -> int:
    """The float32 logit-sized tensors live at the peak (``LOGIT_MULT[plan]`` of them), over ``logit_chunk``
    positions instead of ``tokens`` when the output layer runs in chunks."""
    if plan not in LOGIT_MULT:
        raise ValueError(f"unknown plan {plan!r}; known: {', '.join(PLANS)}")
    t = logit_chunk if chunked(tokens, logit_chunk) else tokens
    return LOGIT_MULT[plan] * batch * t * s.vocab * 4
