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
  * with activation checkpointing (GRPO, the two-pass ``TwoPassBookKeeper`` and the recompute engine
    ``RecomputeBookKeeper``): each layer keeps its input ``h``; one layer is recomputed at a time;
  * the ``[B, 1, T, T]`` attention mask of a padded batch (sdpa/eager attention), once: ``T`` per token
    (profiled on the CPU cases: every layer's attention saves it; without it the chunked-logit plans, whose
    peak is inside a recomputed layer's backward, measured up to 1.32x the prediction);

- per token outside the layers ``4h`` (embedding output, final norm);
- on top of these, the largest of the step's phases (:func:`phase_bytes`): at the start of the backward
  ``k * B * T * V`` float32 logit-sized elements, ``k = 5`` for GRPO and checkpointed runs (logits, the saved
  log-softmax, and in the backward the gathered gradient, the log-softmax gradient and the un-sliced logits
  gradient) and ``k = 4`` for the one-pass engine (its backward forms activation gradients only); with
  checkpointing, later, one recomputed layer plus all gradients; for the two-pass engine's norm pass
  (``retain_graph``), 4 logit-sized tensors (3 untied) plus one recomputed layer;
- ``oblr_recompute`` (:class:`oblr.gradnorm.RecomputeBookKeeper`: checkpointing on, one activation-gradient
  backward, each recomputed layer's contributions kept, no gradient pass): the checkpointed activations, the
  one-pass engine's 4 logit-sized tensors at the start of its backward (it forms no weight gradient), and the
  kept contributions (:func:`kept_bytes`, derived from ``assembly.keep_dense``: per trainable weight the
  smaller of its float32 per-row gradients ``4 B R C`` and its factors ``B T (R + C)`` in the activation
  dtype, an input shared by q/k/v or gate/up counted once; norm weights dense; the output layer's float32
  per-row sum ``4 B V h`` when it runs in chunks; with LoRA only the adapters'), which grow through the
  backward and stay until the assembly. They are **not sharded under FSDP2** (per-row gradients of the
  gathered weights, whole on every rank), so at billions of trainable parameters and long responses they
  approach ``B x`` the parameters in float32 per rank: the two-pass engine, which keeps nothing per layer,
  is the one that fits there, and the planner (:mod:`oblr.train.plan`) prices all three. Phases:
  :func:`phase_bytes`.

What this leaves out: the kept-dense conversion of the one-pass engine (it only replaces factors with
smaller per-row gradients), the one-pass plan's factor working copies in its assembly (``oblr_recompute``
counts the largest entry's), allocator fragmentation, and memory outside torch's allocator. The assembly of
the one-pass and recompute plans is counted entry by entry with its float32 group sums, same-shaped kept-dense
entries a slab at a time (:func:`assembly_bytes`). The counts are
derived from the code paths; the one-pass ``4h`` in-flight term and the two-pass norm-pass term were read off
the CPU measurements, so they are calibrated, not derived. The ``oblr_recompute`` terms are derived (from
``assembly.keep_dense``, ``RecomputeBookKeeper._take``/``_keep`` and ``oblr.update``'s order: backward, entropy,
assembly) and were located with torch.profiler memory events on the CPU cases; the one choice read off them
is where the backward's peak falls: inside the bottom layer, before that layer's own contributions exist.
KL (``algorithm.kl_coef > 0``) is not modelled: its first backward retains the graph, so the activations
and the saved log-softmax stay through the entropy (for every plan; the two-pass norm pass counts that).
The CPU benchmark measures the step's peak *above* the model, optimizer state and batch
(:func:`step_peak_bytes`); :func:`gpu_peak_bytes` adds the resident state for a projection.
"""

from __future__ import annotations

from dataclasses import dataclass

PLANS = ("grpo", "oblr", "grpo_ckpt", "oblr_ckpt", "oblr_recompute")
LOGIT_MULT = {"grpo": 5, "oblr": 4, "grpo_ckpt": 5, "oblr_ckpt": 5, "oblr_recompute": 4}
CHECKPOINTED = ("grpo_ckpt", "oblr_ckpt", "oblr_recompute")
GIB = 2**30
#: mirrors of ``oblr.gradnorm.assembly.KEEP_DENSE_SLACK`` and ``CHUNK_ELEMS`` and ``oblr.gradnorm.slabs.SLAB_ELEMS``
#: (tests check they agree)
KEEP_DENSE_SLACK = 1.0
CHUNK_ELEMS = 1 << 26
SLAB_ELEMS = 1 << 22
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


def linears(s: Shape) -> list[tuple[str, int, int, str]]:
    """One decoder layer's weight products: (name, R = out, C = in, input key); products with the same key
    read one input tensor (q/k/v: the normalised hidden state; gate/up: the post-attention one)."""
    h, q, kv, i = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate
    return [("q_proj", q, h, "attn_in"), ("k_proj", kv, h, "attn_in"), ("v_proj", kv, h, "attn_in"),
            ("o_proj", h, q, "o_in"), ("gate_proj", i, h, "mlp_in"), ("up_proj", i, h, "mlp_in"),
            ("down_proj", h, i, "down_in")]


def keep_dense(R: int, C: int, T: int, factor_bytes: int = 4, index: bool = False) -> bool:
    """``assembly.keep_dense``: a per-row gradient [R, C] float32 no larger than its factors ``T x (R + C)``
    elements of ``factor_bytes`` (``index``: the left factor is token ids, 8 bytes each)."""
    left = 8 if index else R * factor_bytes
    return 4 * R * C <= KEEP_DENSE_SLACK * T * (left + C * factor_bytes)


def _outer_kept(R: int, C: int, B: int, T: int, act_bytes: int) -> tuple[int, int]:
    """(bytes kept apart from the shared input, input bytes if the factors are kept else 0) of one weight's
    contribution: dense ``4 B R C`` or the output gradient ``B T R`` plus the input ``B T C``."""
    if keep_dense(R, C, T, act_bytes):
        return 4 * B * R * C, 0
    return B * T * R * act_bytes, B * T * C * act_bytes


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


def kept_bytes(s: Shape, batch: int, tokens: int, act_bytes: int = 4, logit_chunk: int = 0,
               head_trainable: bool = True, lora_rank: int = 0, lora_targets=LORA_TARGETS) -> dict[str, int]:
    """The recompute engine's kept contributions at the end of its backward, by part (``oblr_recompute``;
    :class:`oblr.gradnorm.RecomputeBookKeeper` keeps them as the one-pass engine's ``_add`` does).

    Per trainable weight ``[R, C]``: its per-row gradients ``4 B R C`` (float32) when ``keep_dense`` says they
    are no larger than the factors (mirrors ``assembly.keep_dense``), else the factors -- the output gradient
    ``B T R`` and the input ``B T C`` in ``act_bytes``, the input counted once for the weights that read the
    same tensor (q/k/v, gate/up). ``layers``: the decoder weights; ``norms``: the RMSNorm weights (dense,
    ``4 B n``); ``head``: the output layer, with a tied embedding's token-id part (folded into the head's
    per-row gradients when those are dense, else its ids ``8 B T`` and gradient ``B T h`` as factors), or,
    with the output layer in chunks (``logit_chunk``), the float32 per-row sum ``4 B V h`` of a module called
    once per chunk; ``embedding``: an untied embedding (token ids ``8 B T`` and its output gradient
    ``B T h``, or ``4 B V h`` dense). ``head_trainable`` False (a frozen output layer, e.g. LoRA): no head or
    embedding part. ``lora_rank`` > 0: only the adapters of ``lora_targets`` are trained -- per adapted
    projection ``A [r, C]`` (input: the projection's input, shared as above; output gradient ``B T r``) and
    ``B [R, r]`` (input: A's output ``B T r``; output gradient ``B T R``) -- and nothing else is kept
    (targets other than the projections of :func:`linears` are priced as a full fine-tuning).

    Not sharded under FSDP2: these are per-row gradients of the gathered weights, whole on every rank."""
    B, T, h, V, ab = batch, tokens, s.hidden, s.vocab, act_bytes
    out = {"layers": 0, "norms": 0, "head": 0, "embedding": 0}
    mods = _lora_modules(s, lora_rank, lora_targets)
    if mods is not None:
        per_layer, inputs = 0, {}
        for _, R, C, key in mods:
            a, x = _outer_kept(lora_rank, C, B, T, ab)
            per_layer += a
            inputs[key] = max(inputs.get(key, 0), x)
            b, xb = _outer_kept(R, lora_rank, B, T, ab)
            per_layer += b + xb
        out["layers"] = s.layers * (per_layer + sum(inputs.values()))
        return out
    per_layer, inputs = 0, {}
    for _, R, C, key in linears(s):
        a, x = _outer_kept(R, C, B, T, ab)
        per_layer += a
        inputs[key] = max(inputs.get(key, 0), x)
    out["layers"] = s.layers * (per_layer + sum(inputs.values()))
    out["norms"] = 4 * B * (s.layers * (2 * h + 2 * s.head_dim) + h)
    if not head_trainable:
        return out
    ids = B * T * (8 + h * ab)  # an embedding's token ids and output gradient
    if chunked(tokens, logit_chunk):
        out["head"] = 4 * B * V * h
    elif keep_dense(V, h, T, ab):
        out["head"] = 4 * B * V * h  # (tied: the embedding's ids are folded into it)
    else:
        out["head"] = B * T * (V + h) * ab + (ids if s.tied else 0)
    if not s.tied:
        out["embedding"] = 4 * B * V * h if keep_dense(V, h, T, ab, index=True) else ids
    return out


def _entries(s: Shape, tokens: int, act_bytes: int, logit_chunk: int, head_trainable: bool, lora_rank: int,
             lora_targets) -> list[tuple[int, bool]]:
    """The trainable entries in the engine's assembly order (parameter order: embedding, layers, final norm,
    an untied ``lm_head``) as ``(R * C, kept dense)``; a tied embedding is one entry with ``lm_head``."""
    return [(_numel(shape), dense) for shape, dense in _entry_shapes(s, tokens, act_bytes, logit_chunk, head_trainable,
                                                                    lora_rank, lora_targets)]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _entry_shapes(s: Shape, tokens: int, act_bytes: int, logit_chunk: int, head_trainable: bool, lora_rank: int,
                  lora_targets) -> list[tuple[tuple[int, ...], bool]]:
    """:func:`_entries` with each parameter's shape (``(R, C)``, or ``(n,)`` for a norm weight) for its size."""
    h, V, ab = s.hidden, s.vocab, act_bytes
    mods = _lora_modules(s, lora_rank, lora_targets)
    if mods is not None:
        per_layer = [e for _, R, C, _ in mods for e in (((lora_rank, C), keep_dense(lora_rank, C, tokens, ab)),
                                                        ((R, lora_rank), keep_dense(R, lora_rank, tokens, ab)))]
        return per_layer * s.layers
    head_dense = chunked(tokens, logit_chunk) or keep_dense(V, h, tokens, ab)
    first = [((V, h), head_dense if s.tied else keep_dense(V, h, tokens, ab, index=True))] if head_trainable else []
    lin = [((R, C), keep_dense(R, C, tokens, ab)) for _, R, C, _ in linears(s)]
    # the engine's order (parameter registration): q, k, v, o, q_norm, k_norm, gate, up, down, the two layer norms
    per_layer = lin[:4] + [((s.head_dim,), True)] * 2 + lin[4:] + [((h,), True)] * 2
    last = [((h,), True)] + ([((V, h), head_dense)] if head_trainable and not s.tied else [])
    return first + per_layer * s.layers + last


def slab_lists(entries: list[tuple[tuple[int, ...], bool]], batch: int, slab_elems: int = SLAB_ELEMS) -> list[list[int]]:
    """The positions in ``entries`` (:func:`_entry_shapes`) of each slab's members: kept-dense entries of one shape,
    in engine order, at most ``slab_elems`` per-row elements ``L B R C`` per slab, split into near-equal slabs of at
    least two (mirrors ``oblr.gradnorm.slabs.slab_groups``)."""
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, (shape, dense) in enumerate(entries):
        if dense:
            by_shape.setdefault(shape, []).append(i)
    out = []
    for shape, idx in by_shape.items():
        cap = slab_elems // max(1, batch * _numel(shape))
        if cap < 2 or len(idx) < 2:
            continue
        size = -(-len(idx) // -(-len(idx) // cap))
        out += [idx[j:j + size] for j in range(0, len(idx), size) if len(idx[j:j + size]) > 1]
    return out


def assembly_items(entries: list[tuple[tuple[int, ...], bool]], batch: int,
                   slab_elems: int = SLAB_ELEMS) -> list[tuple[int, bool, int]]:
    """The assembly's steps in order as ``(R * C, kept dense, L)``: an entry alone (``L = 1``), or a slab of ``L``
    entries (:func:`slab_lists`) at its first member's place."""
    lists = slab_lists(entries, batch, slab_elems)
    starts = {x[0]: len(x) for x in lists}
    members = {i for x in lists for i in x}
    return [(_numel(shape), dense, starts.get(i, 1)) for i, (shape, dense) in enumerate(entries)
            if i in starts or i not in members]


def entry_work_units(n: int, dense: bool, groups: int, chunk_elems: int = CHUNK_ELEMS) -> int:
    """Float32 ``[R, C]`` tensors (``n = R C`` elements) that ``assembly.grouped_sums`` holds at once for one
    entry and ``groups`` groups (:func:`assembly_bytes`)."""
    step = min(groups, max(1, chunk_elems // n))
    return (groups if dense else step) + 1 + (1 < step < groups)


def assembly_bytes(s: Shape, batch: int, tokens: int, groups: int = 0, act_bytes: int = 4, grad_bytes: int = 4,
                   grad_shards: int = 1, logit_chunk: int = 0, head_trainable: bool = True, *, lora_rank: int = 0,
                   lora_targets=LORA_TARGETS, grads_live: bool = False) -> int:
    """Peak of the one-pass assembly (``BookKeeper.accumulate_grad_with_group_norms``, which the recompute
    engine shares) above what it reads: the entries one after another (:func:`_entries`), each with the
    gradients formed before it (all of them with ``grads_live``) and its own float32 working set in
    ``assembly.grouped_sums``, in ``[R, C]`` units for ``K = groups`` groups (0: one per sequence): an entry kept
    dense (one per-row sum) is regrouped into a new ``[K, R, C]`` and read in views, ``K + 1`` with the running
    total; an entry kept as factors forms ``s = min(K, CHUNK_ELEMS / (R C))`` groups at a time, ``s + 1``; either
    takes one more for the chunk's sum when it runs in several chunks of more than one group (the regrouping
    of a dense entry by non-contiguous group ids holds more, which training never does: its groups are
    contiguous rows). Kept-dense entries of one shape are stacked into slabs (:func:`assembly_items`, mirroring
    ``oblr.gradnorm.slabs``): a slab of ``L`` members is assembled at its first member's place, ``L (K + 1)``
    units at once (``slabs.slab_sums``), and its stacking at the end of the backward holds its ``L B`` per-row
    gradients beside the ones it replaces (before any gradient is formed). Plus the totals' copy
    in the gradient's dtype when that is narrower. At least every gradient (the end of the assembly). Measured
    on CPU against ``grouped_sums`` alone (tests/core/test_memory_model.py). The output layer's working set is
    the largest (``vocab x hidden``: 0.58 GiB per ``[R, C]`` at Qwen3-0.6B); on one GPU, leaving it out put a
    chunked recompute step 1.7 GiB above the model."""
    K = groups or batch
    grads = lora_params(s, lora_rank, lora_targets) * grad_bytes // grad_shards
    formed, peak = 0, 0
    entries = _entry_shapes(s, tokens, act_bytes, logit_chunk, head_trainable, lora_rank, lora_targets)
    for n, dense, L in assembly_items(entries, batch):
        if L > 1:  # a slab: stacked at the end of the backward (its copy beside the originals), then its members'
            # K group sums and totals at once
            peak = max(peak, (grads if grads_live else 0) + L * batch * n * 4)
            work = L * (K + 1) * n * 4
        else:
            work = entry_work_units(n, dense, K) * n * 4
        work += L * n * grad_bytes if grad_bytes < 4 else 0
        peak = max(peak, (grads if grads_live else formed) + work)
        formed += L * (n * grad_bytes // grad_shards)
    return max(peak, grads)


def step_peak_bytes(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int = 4, grad_bytes: int = 4,
                    grad_shards: int = 1, logit_chunk: int = 0, head_trainable: bool = True, *,
                    lora_rank: int = 0, lora_targets=LORA_TARGETS, grads_live: bool = False, groups: int = 0) -> int:
    """Peak of one step above the resident model, optimizer state and batch (what ``benchmarks/memory.py``
    measures on CPU): kept activations plus the largest of the step's phases (:func:`phase_bytes`).
    ``lora_rank``/``lora_targets``: LoRA adapters instead of full fine-tuning; only ``oblr_recompute`` uses
    them (its kept contributions and gradients are the adapters'); the other plans count the full model's
    gradients whatever they are (conservative). ``grads_live``: a micro-batch after the first of a split
    batch, which starts with every gradient buffer held (:func:`phase_bytes`). ``groups``: prompt groups in the
    micro-batch (0: one per sequence, the most the exact-norm assembly can hold; :func:`assembly_bytes`)."""
    if batch < 1 or tokens < 2:
        raise ValueError(f"need batch >= 1 and tokens >= 2, got batch={batch}, tokens={tokens}")
    return (activation_bytes(s, plan, batch, tokens, act_bytes)
            + max(phase_bytes(s, plan, batch, tokens, act_bytes, grad_bytes, grad_shards, logit_chunk,
                              head_trainable, lora_rank=lora_rank, lora_targets=lora_targets,
                              grads_live=grads_live, groups=groups).values()))


#: the phase of each plan in which its gradient buffers are formed (counted there already)
_GRADS_FORMED = {"oblr": "assembly", "grpo_ckpt": "recompute", "oblr_ckpt": "recompute", "oblr_recompute": "assembly"}


def phase_bytes(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int = 4, grad_bytes: int = 4,
                grad_shards: int = 1, logit_chunk: int = 0, head_trainable: bool = True, *,
                lora_rank: int = 0, lora_targets=LORA_TARGETS, grads_live: bool = False,
                groups: int = 0, assembly_work: bool = True) -> dict[str, int]:
    """What each phase adds on top of the kept activations (``grads_live``: every gradient buffer is held
    from the start, the sum of the earlier micro-batches of a split batch; then each phase other than the one
    forming the gradients counts them too: ``P grad_bytes / grad_shards``, the adapters' with LoRA under
    ``oblr_recompute``; the gradients a phase forms are increments added in place, counted as before, except
    the output layer's in the ``logits`` phase, which is not counted then: measured, it is added in before
    that phase's peak):

    - ``logits`` (start of the backward): the logit-sized tensors and ``lm_head``'s gradient (the first one
      formed; none for the one-pass engine, whose backward forms no weight gradient);
    - ``recompute`` (checkpointed plans, after ``lm_head``'s backward): one recomputed layer and all gradients;
    - ``tied_sum`` (a tied, trainable output layer; every plan whose backward forms weight gradients, i.e. all
      but ``oblr``): at the end of the backward autograd's input buffer has held ``lm_head``'s weight gradient
      until the embedding's arrives and sums the two: every gradient plus ``2 V h grad_bytes``. Read off one GPU
      measurement (Qwen3-4B, chunked logits: 1.44 GiB above the model without it, two bf16 ``V x h``); it only
      shows when chunking removes the logits' peak;
    - ``norm_pass`` (``oblr_ckpt`` only): the two-pass engine's norm pass runs with ``retain_graph``, so the
      logits and saved log-softmax stay, plus ``lm_head``'s output gradient, plus (tied embeddings) its kept
      copy for the cross term -- 4 logit-sized tensors tied, 3 untied -- and one recomputed layer; no gradients.

    ``oblr_recompute`` (``kept``: :func:`kept_bytes`, whole on every rank whatever ``grad_shards``):

    - ``logits``: 4 logit-sized tensors (with chunks: one chunk's, plus the output layer's float32 per-row sum
      ``4 B V h`` when it is trainable), no gradient;
    - ``recompute`` (inside the bottom layer's backward, before its own contributions): one recomputed layer,
      ``kept`` less one layer's share, the float32 logits (referenced until the step ends; not with chunks)
      and, with half-precision activations, the float32 copies of the largest kept-dense weight's factors
      ``4 B T (R + C)`` (``Outer.regroup`` casts them before the per-row product);
    - ``entropy`` (whole logits only: after the backward, ``oblr.update`` computes the entropy from the logits;
      the activations are freed by then): the logits and 3 temporaries (4 logit-sized) and ``kept``;
    - ``assembly``: ``kept``, the gradients (of the adapters with LoRA), the logits (whole) and the largest
      factor-kept entry's float32 working copy ``4 B T (R + C)``.

    The last two come after the backward, when the checkpointed activations are freed: their values are their
    bytes *less* :func:`activation_bytes` (so may be negative), keeping ``step_peak_bytes = activations +
    max(phases)``.

    With the output layer in chunks of ``logit_chunk`` positions (checkpointed plans): the logit-sized
    tensors span one chunk, and nothing logit-sized is retained for the gradient pass; the two-pass norm pass
    holds one recomputed chunk's 4 (the chunks first, then the layers: the larger of that and one recomputed
    layer) and, when the output layer is trainable (``head_trainable``: not LoRA), the float32 per-row sum of
    its gradient ``batch * vocab * hidden`` throughout (a module called once per chunk:
    :class:`oblr.gradnorm.TwoPassBookKeeper`).
    """
    asm = assembly_bytes(s, batch, tokens, groups, act_bytes, grad_bytes, grad_shards, logit_chunk, head_trainable,
                         lora_rank=lora_rank if plan == "oblr_recompute" else 0, lora_targets=lora_targets,
                         grads_live=grads_live) if assembly_work else 0  # gradients formed by the assembly + its work
    if plan == "oblr_recompute":
        out = _recompute_phases(s, batch, tokens, act_bytes, grad_bytes, grad_shards, logit_chunk, head_trainable,
                                lora_rank, lora_targets, asm)
        live = lora_params(s, lora_rank, lora_targets) * grad_bytes // grad_shards
    else:
        out = _plain_phases(s, plan, batch, tokens, act_bytes, grad_bytes, grad_shards, logit_chunk, head_trainable,
                            grads_live, asm)
        live = n_params(s) * grad_bytes // grad_shards
    if grads_live:  # the assembly phase (assembly_bytes) counts the held gradients itself
        out = {k: v + (0 if k == _GRADS_FORMED.get(plan) else live) for k, v in out.items()}
    return out


def _plain_phases(s: Shape, plan: str, batch: int, tokens: int, act_bytes: int, grad_bytes: int, grad_shards: int,
                  logit_chunk: int, head_trainable: bool, grads_live: bool = False, asm: int = 0) -> dict[str, int]:
    """:func:`phase_bytes` of every plan but ``oblr_recompute`` (with ``grads_live`` the output layer's
    gradient is an increment added into the held one, not a new buffer of the logits phase)."""
    grads = n_params(s) * grad_bytes // grad_shards
    head_grad = 0 if grads_live else s.vocab * s.hidden * grad_bytes // grad_shards
    out = {"logits": logits_bytes(s, plan, batch, tokens, logit_chunk) + (0 if plan == "oblr" else head_grad)}
    if plan == "oblr":  # after the backward, the factors still kept: the assembly (:func:`assembly_bytes`: the
        # gradients and one entry's group sums; the forward's own saved tensors counted as still held: conservative)
        out["assembly"] = max(grads, asm)
    if plan.endswith("_ckpt"):
        out["recompute"] = recompute_bytes(s, batch, tokens, act_bytes) + grads
    if s.tied and head_trainable and plan != "oblr":
        # the end of an autograd backward with a tied output layer: autograd's input buffer holds lm_head's weight
        # gradient until the embedding's arrives, then sums the two (two more vocab x hidden tensors than the
        # gradients; read off one GPU row, Qwen3-4B with chunked logits, 1.44 GiB above the model without it)
        out["tied_sum"] = (0 if grads_live else grads) + 2 * s.vocab * s.hidden * grad_bytes
    if plan == "oblr_ckpt" and chunked(tokens, logit_chunk):  # the chunks, then the layers; the sum stays
        out["norm_pass"] = ((batch * s.vocab * s.hidden * 4 if head_trainable else 0)
                            + max(4 * batch * logit_chunk * s.vocab * 4, recompute_bytes(s, batch, tokens, act_bytes)))
    elif plan == "oblr_ckpt":
        out["norm_pass"] = ((4 if s.tied else 3) * batch * tokens * s.vocab * 4
                            + recompute_bytes(s, batch, tokens, act_bytes))
    return out


def _working_copies(s: Shape, batch: int, tokens: int, act_bytes: int, logit_chunk: int, head_on: bool,
                    lora_rank: int, lora_targets) -> tuple[int, int]:
    """(backward, assembly) float32 copies of one weight's factors ``4 B T (R + C)``: in the backward, the
    largest layer weight kept dense when the factors are in half precision (``Outer.regroup`` casts them
    before the per-row product; float32 factors are used as they are); in the assembly, the largest entry
    kept as factors (cast, or scaled per group)."""
    B, T, ab = batch, tokens, act_bytes
    mods = _lora_modules(s, lora_rank, lora_targets)
    if mods is not None:
        weights = [w for _, R, C, _ in mods for w in ((lora_rank, C), (R, lora_rank))]
    else:
        weights = [(R, C) for _, R, C, _ in linears(s)]
    dense = [4 * B * T * (R + C) for R, C in weights if keep_dense(R, C, T, ab)]
    factors = [4 * B * T * (R + C) for R, C in weights if not keep_dense(R, C, T, ab)]
    if head_on and not chunked(tokens, logit_chunk) and not keep_dense(s.vocab, s.hidden, T, ab):
        factors.append(4 * B * T * (s.vocab + s.hidden))
    return (max(dense) if dense and ab < 4 else 0), max(factors, default=0)


def _recompute_phases(s: Shape, batch: int, tokens: int, act_bytes: int, grad_bytes: int, grad_shards: int,
                      logit_chunk: int, head_trainable: bool, lora_rank: int, lora_targets,
                      asm: int = 0) -> dict[str, int]:
    """:func:`phase_bytes` of ``oblr_recompute`` (its docstring)."""
    whole = not chunked(tokens, logit_chunk)
    head_on = head_trainable and _lora_modules(s, lora_rank, lora_targets) is None
    parts = kept_bytes(s, batch, tokens, act_bytes, logit_chunk, head_on, lora_rank, lora_targets)
    kept = sum(parts.values())
    grads = lora_params(s, lora_rank, lora_targets) * grad_bytes // grad_shards
    logit = batch * tokens * s.vocab * 4  # the float32 logits, referenced until the step ends (whole logits)
    # float32 working copies of one weight's factors, B T (R + C) * 4: materialising a kept-dense weight from
    # half-precision factors in the backward, and the largest factor-kept entry in the assembly
    mat, fac = _working_copies(s, batch, tokens, act_bytes, logit_chunk, head_on, lora_rank, lora_targets)
    acts = activation_bytes(s, "oblr_recompute", batch, tokens, act_bytes)
    out = {"logits": logits_bytes(s, "oblr_recompute", batch, tokens, logit_chunk)
           + (0 if whole or not head_on else 4 * batch * s.vocab * s.hidden),
           # the bottom layer's peak (its MLP backward) comes before that layer's own contributions
           "recompute": (recompute_bytes(s, batch, tokens, act_bytes) + kept - parts["layers"] // s.layers
                         + (logit if whole else 0) + mat)}
    if whole:  # after the backward the activations are freed: these two count their bytes less ``acts``
        out["entropy"] = 4 * logit + kept - acts
    out["assembly"] = kept + max(grads, asm) + (logit if whole else 0) + fac - acts
    return out


def per_sequence_bytes(s: Shape, plan: str, tokens: int, act_bytes: int = 2, logit_chunk: int = 0) -> int:
    """What one more sequence in the micro-batch costs: activations (``act_bytes``) + float32 logits. The
    exact-norm assembly's working set is a cost of the micro-batch, not of a sequence: :func:`max_micro_batch`
    sets it aside."""
    return activation_bytes(s, plan, 1, tokens, act_bytes) + max(
        v for k, v in phase_bytes(s, plan, 1, tokens, act_bytes, grad_bytes=0, logit_chunk=logit_chunk,
                                  assembly_work=False).items())


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
    """Largest micro-batch (sequences) whose predicted peak fits ``budget_bytes`` per GPU (0 if none): the
    budget less the resident state and, for the one-pass and recompute plans, one group's assembly working set
    (:func:`assembly_bytes` of its largest entry), divided by :func:`per_sequence_bytes`."""
    free = budget_bytes - resident_bytes(s, world)
    if plan in ("oblr", "oblr_recompute"):
        free -= assembly_bytes(s, 1, tokens, 1, 2, grad_bytes=0, logit_chunk=logit_chunk)
    return max(0, int(free // per_sequence_bytes(s, plan, tokens, logit_chunk=logit_chunk)))


# Qwen3 public configs (assumed from the Hugging Face config.json files): layers, hidden, intermediate,
# heads, kv heads, head_dim 128, vocab 151936; embeddings tied for 0.6B, 1.7B and 4B, untied for 8B.
QWEN3 = {
    "Qwen3-0.6B": Shape(28, 1024, 3072, 16, 8, 128, 151936, True),
    "Qwen3-1.7B": Shape(28, 2048, 6144, 16, 8, 128, 151936, True),
    "Qwen3-4B": Shape(36, 2560, 9728, 32, 8, 128, 151936, True),
    "Qwen3-8B": Shape(36, 4096, 12288, 32, 8, 128, 151936, False),
}
