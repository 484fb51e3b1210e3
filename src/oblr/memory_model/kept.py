"""What the recompute engine keeps per trainable weight until the assembly: per-row gradients or their
factors, whichever is smaller (``keep_dense``, mirroring ``oblr.gradnorm.assembly.keep_dense``), summed by
part in ``kept_bytes`` (pure functions)."""

from __future__ import annotations

from .activations import chunked
from .shapes import LORA_TARGETS, Shape, _lora_modules, linears

#: mirror of ``oblr.gradnorm.assembly.KEEP_DENSE_SLACK`` (tests check they agree)
KEEP_DENSE_SLACK = 1.0


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
