"""Peak of one step: the kept activations plus the largest of the step's phases (``step_peak_bytes``,
``phase_bytes``), per plan: the logits, a recomputed layer, a tied output layer's gradient sum, the
two-pass norm pass, the recompute engine's entropy and assembly (pure functions)."""

from __future__ import annotations

from .activations import activation_bytes, chunked, logits_bytes, recompute_bytes
from .assembly import assembly_bytes
from .kept import keep_dense, kept_bytes
from .shapes import LORA_TARGETS, Shape, _lora_modules, linears, lora_params, n_params


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
