"""A Qwen3-architecture decoder's shape (``Shape``, the public configs ``QWEN3``) and what follows from it
alone: parameter counts, one layer's weight products, the projections LoRA adapts (pure functions)."""

from __future__ import annotations

from dataclasses import dataclass

#: the modules LoRA adapts by default (``model.lora_targets``)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class Shape:
    """A Qwen3-architecture decoder."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool

    def __post_init__(self):
        for k in ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise ValueError(f"Shape.{k} must be a positive int, got {getattr(self, k)!r}")


def layer_params(s: Shape) -> int:
    """Parameters of one decoder layer: q/k/v/o, gate/up/down, two RMSNorms, q_norm and k_norm."""
    q, kv, h = s.heads * s.head_dim, s.kv_heads * s.head_dim, s.hidden
    return h * q + 2 * h * kv + q * h + 3 * h * s.intermediate + 2 * h + 2 * s.head_dim


def n_params(s: Shape) -> int:
    """All parameters: embedding, layers, final norm, and ``lm_head`` unless tied."""
    return s.vocab * s.hidden * (1 if s.tied else 2) + s.layers * layer_params(s) + s.hidden


def linears(s: Shape) -> list[tuple[str, int, int, str]]:
    """One decoder layer's weight products: (name, R = out, C = in, input key); products with the same key
    read one input tensor (q/k/v: the normalised hidden state; gate/up: the post-attention one)."""
    h, q, kv, i = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate
    return [("q_proj", q, h, "attn_in"), ("k_proj", kv, h, "attn_in"), ("v_proj", kv, h, "attn_in"),
            ("o_proj", h, q, "o_in"), ("gate_proj", i, h, "mlp_in"), ("up_proj", i, h, "mlp_in"),
            ("down_proj", h, i, "down_in")]


def _lora_modules(s: Shape, lora_rank: int, lora_targets) -> list[tuple[str, int, int, str]] | None:
    """The adapted projections of a LoRA run; None for a full fine-tuning: ``lora_rank`` 0, or a target that
    is not one of :func:`linears`' names (priced as a full fine-tuning: conservative)."""
    known = {n: (n, r, c, k) for n, r, c, k in linears(s)}
    targets = list(dict.fromkeys(lora_targets))
    if lora_rank <= 0 or not targets or any(t not in known for t in targets):
        return None
    return [known[t] for t in targets]


def lora_params(s: Shape, lora_rank: int, lora_targets=LORA_TARGETS) -> int:
    """Parameters of LoRA adapters of rank ``lora_rank`` on ``lora_targets`` in every layer: ``r (R + C)``
    per adapted projection (all parameters, :func:`n_params`, when :func:`_lora_modules` prices a full
    fine-tuning)."""
    mods = _lora_modules(s, lora_rank, lora_targets)
    if mods is None:
        return n_params(s)
    return s.layers * sum(lora_rank * (r + c) for _, r, c, _ in mods)


# Qwen3 public configs (assumed from the Hugging Face config.json files): layers, hidden, intermediate,
# heads, kv heads, head_dim 128, vocab 151936; embeddings tied for 0.6B, 1.7B and 4B, untied for 8B.
QWEN3 = {
    "Qwen3-0.6B": Shape(28, 1024, 3072, 16, 8, 128, 151936, True),
    "Qwen3-1.7B": Shape(28, 2048, 6144, 16, 8, 128, 151936, True),
    "Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 128, 151936, True),
    "Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 128, 151936, False),
}
