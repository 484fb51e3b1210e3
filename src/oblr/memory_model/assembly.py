"""The exact-norm assembly's working set (``assembly_bytes``): the trainable entries in the engine's order,
same-shaped kept-dense entries stacked into slabs, each entry's float32 group sums (mirrors
``oblr.gradnorm.assembly.grouped_sums`` and ``oblr.gradnorm.slabs``; pure functions)."""

from __future__ import annotations

from .activations import chunked
from .kept import keep_dense
from .shapes import LORA_TARGETS, Shape, _lora_modules, linears, lora_params

#: mirrors of ``oblr.gradnorm.assembly.CHUNK_ELEMS`` and ``oblr.gradnorm.slabs.SLAB_ELEMS`` (tests check
#: they agree)
CHUNK_ELEMS = 1 << 26
SLAB_ELEMS = 1 << 22


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
