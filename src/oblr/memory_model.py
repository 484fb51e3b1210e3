"""Peak memory of one update step predicted from shapes (pure functions, no torch).

Terms, for a Qwen3-architecture decoder (``Shape``) and a micro-batch of ``B`` sequences of ``T`` tokens
(prompt + response, padded):

- parameters ``P`` (:func:`n_params`), their gradients and the optimizer state (AdamW: two moments, plus an
  fp32 master copy when parameters are bf16);
- activations kept for the backward, in elements per token per layer (``h`` hidden, ``q = heads*head_dim``,
  ``kv = kv_heads*head_dim``, ``I`` intermediate), counted from the tensors autograd saves in a Hugging
  Face Qwen3 layer (sdpa attention with no ``T x T`` matrix kept, as the CPU flash kernel and GPU
  flash/efficient kernels do):

  * GRPO (weights trainable): ``6h + 7q + 6kv + 4I`` -- two RMSNorms (input, normalised, output: 3h each),
    q/k projections, q/k norms, rotary (``rotate_half`` and result) and sdpa (q: 5q + sdpa output + o_proj
    input = 7q; k: 5kv; v: kv), MLP (gate, silu, up, product: 4I);
  * OBLR-PO one pass (``BookKeeper``; weights frozen during the forward, hooks keep each hooked module's
    input and output): ``10h + 5q + 4kv + 4I`` -- autograd's saved tensors with frozen weights
    (``2h + 3q + 3kv + 3I``), the hooks' inputs not saved by autograd (``2h + q + I``) and outputs
    (``2h + q + kv``), and ``4h`` for the activation gradients in flight. The last term is calibrated on
    the CPU measurements of ``benchmarks/memory.py``, not derived;
  * with activation checkpointing (both GRPO and the two-pass ``TwoPassBookKeeper``): each layer keeps its
    input ``h``; one layer is recomputed at a time;
  * the ``[B, 1, T, T]`` attention mask of a padded batch (sdpa/eager attention), once: ``T`` per token
    (profiled on the CPU cases: every layer's attention saves it; without it the chunked-logit plans, whose
    peak is inside a recomputed layer's backward, measured up to 1.32x the prediction);

- per token outside the layers ``4h`` (embedding output, final norm);
- on top of these, the largest of the step's phases (:func:`phase_bytes`): at the start of the backward
  ``k * B * T * V`` float32 logit-sized elements, ``k = 5`` for GRPO and checkpointed runs (logits, the saved
  log-softmax, and in the backward the gathered gradient, the log-softmax gradient and the un-sliced logits
  gradient) and ``k = 4`` for the one-pass engine (its backward forms activation gradients only); with
  checkpointing, later, one recomputed layer plus all gradients; for the two-pass engine's norm pass
  (``retain_graph``), 4 logit-sized tensors (3 untied) plus one recomputed layer.

What this leaves out: the kept-dense conversion of the one-pass engine (it only replaces factors with
smaller per-row gradients), the engines' chunked assembly work, allocator fragmentation, and memory outside
torch's allocator. The counts are derived from the code paths; the one-pass ``4h`` in-flight term and the
two-pass norm-pass term were read off the CPU measurements, so they are calibrated, not derived.
The CPU benchmark measures the step's peak *above* the model, optimizer state and batch
(:func:`step_peak_bytes`); :func:`gpu_peak_bytes` adds the resident state for a projection.
"""

from __future__ import annotations

from dataclasses import dataclass

PLANS = ("grpo", "oblr", "grpo_ckpt", "oblr_ckpt")
LOGIT_MULT = {"grpo": 5, "oblr": 4, "grpo_ckpt": 5, "oblr_ckpt": 5}
GIB = 2**30


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


def act_per_token_layer(s: Shape, plan: str) -> int:
    """Activation elements kept per token per layer (see the module docstring); checkpointed: the layer input."""
    h, q, kv, i = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate
    if plan == "grpo":
        return 6 * h + 7 * q + 6 * kv + 4 * i
    if plan == "oblr":
        return 10 * h + 5 * q + 4 * kv + 4 * i
    if plan in ("grpo_ckpt", "oblr_ckpt"):
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


def step_peak_bytes(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int = 4, grad_bytes: int = 4,
                    grad_shards: int = 1, logit_chunk: int = 0, head_trainable: bool = True) -> int:
    """Peak of one step above the resident model, optimizer state and batch (what ``benchmarks/memory.py``
    measures on CPU): kept activations plus the largest of the step's phases (:func:`phase_bytes`)."""
    if batch < 1 or tokens < 2:
        raise ValueError(f"need batch >= 1 and tokens >= 2, got batch={batch}, tokens={tokens}")
    return (activation_bytes(s, plan, batch, tokens, act_bytes)
            + max(phase_bytes(s, plan, batch, tokens, act_bytes, grad_bytes, grad_shards, logit_chunk,
                              head_trainable).values()))


def phase_bytes(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int = 4, grad_bytes: int = 4,
                grad_shards: int = 1, logit_chunk: int = 0, head_trainable: bool = True) -> dict[str, int]:
    """What each phase adds on top of the kept activations:

    - ``logits`` (start of the backward): the logit-sized tensors and ``lm_head``'s gradient (the first one
      formed; none for the one-pass engine, whose backward forms no weight gradient);
    - ``recompute`` (checkpointed plans, after ``lm_head``'s backward): one recomputed layer and all gradients;
    - ``norm_pass`` (``oblr_ckpt`` only): the two-pass engine's norm pass runs with ``retain_graph``, so the
      logits and saved log-softmax stay, plus ``lm_head``'s output gradient, plus (tied embeddings) its kept
      copy for the cross term -- 4 logit-sized tensors tied, 3 untied -- and one recomputed layer; no gradients.

    With the output layer in chunks of ``logit_chunk`` positions (checkpointed plans): the logit-sized
    tensors span one chunk, and nothing logit-sized is retained for the gradient pass; the two-pass norm pass
    holds one recomputed chunk's 4 (the chunks first, then the layers: the larger of that and one recomputed
    layer) and, when the output layer is trainable (``head_trainable``: not LoRA), the float32 per-row sum of
    its gradient ``batch * vocab * hidden`` throughout (a module called once per chunk:
    :class:`oblr.gradnorm.TwoPassBookKeeper`).
    """
    grads = n_params(s) * grad_bytes // grad_shards
    head_grad = s.vocab * s.hidden * grad_bytes // grad_shards
    out = {"logits": logits_bytes(s, plan, batch, tokens, logit_chunk) + (0 if plan == "oblr" else head_grad)}
    if plan.endswith("_ckpt"):
        out["recompute"] = recompute_bytes(s, batch, tokens, act_bytes) + grads
    if plan == "oblr_ckpt" and chunked(tokens, logit_chunk):  # the chunks, then the layers; the sum stays
        out["norm_pass"] = ((batch * s.vocab * s.hidden * 4 if head_trainable else 0)
                            + max(4 * batch * logit_chunk * s.vocab * 4, recompute_bytes(s, batch, tokens, act_bytes)))
    elif plan == "oblr_ckpt":
        out["norm_pass"] = ((4 if s.tied else 3) * batch * tokens * s.vocab * 4
                            + recompute_bytes(s, batch, tokens, act_bytes))
    return out


def per_sequence_bytes(s: Shape, plan: str, tokens: int, act_bytes: int = 2, logit_chunk: int = 0) -> int:
    """What one more sequence in the micro-batch costs: activations (``act_bytes``) + float32 logits."""
    return activation_bytes(s, plan, 1, tokens, act_bytes) + max(
        v for k, v in phase_bytes(s, plan, 1, tokens, act_bytes, grad_bytes=0, logit_chunk=logit_chunk).items())


def resident_bytes(s: Shape, world: int = 8, param_bytes: int = 2, grad_bytes: int = 2, optim_bytes: int = 12) -> int:
    """FSDP2 over ``world`` GPUs: sharded bf16 parameters and gradients, fp32 AdamW state (``optim_bytes`` per
    parameter: master copy and two moments, 12 bytes), plus two gathered layers (one computing, one prefetched)
    and the gathered embedding (and ``lm_head`` if untied) in ``param_bytes``."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    sharded = n_params(s) * (param_bytes + grad_bytes + optim_bytes) // world
    gathered = (2 * layer_params(s) + s.vocab * s.hidden * (1 if s.tied else 2)) * param_bytes
    return sharded + gathered


def max_micro_batch(s: Shape, plan: str, tokens: int, budget_bytes: float, world: int = 8,
                    logit_chunk: int = 0) -> int:
    """Largest micro-batch (sequences) whose predicted peak fits ``budget_bytes`` per GPU (0 if none)."""
    free = budget_bytes - resident_bytes(s, world)
    return max(0, int(free // per_sequence_bytes(s, plan, tokens, logit_chunk=logit_chunk)))


# Qwen3 public configs (assumed from the Hugging Face config.json files): layers, hidden, intermediate,
# heads, kv heads, head_dim 128, vocab 151936; embeddings tied for 0.6B, 1.7B and 4B, untied for 8B.
QWEN3 = {
    "Qwen3-0.6B": Shape(28, 1024, 3072, 16, 8, 128, 151936, True),
    "Qwen3-1.7B": Shape(28, 2048, 6144, 16, 8, 128, 151936, True),
    "Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 128, 151936, True),
    "Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 128, 151936, False),
}
