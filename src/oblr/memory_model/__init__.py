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
(:func:`step_peak_bytes`); :func:`resident_bytes` is the resident state a projection adds to it.

The package, one job a module (every name below is importable from ``oblr.memory_model``):

- :mod:`~oblr.memory_model.shapes`: ``Shape``, ``QWEN3``, parameter counts, a layer's weight products, LoRA's;
- :mod:`~oblr.memory_model.activations`: the plans (``PLANS``), kept activations, logit-sized tensors;
- :mod:`~oblr.memory_model.kept`: ``keep_dense`` and the recompute engine's kept contributions (``kept_bytes``);
- :mod:`~oblr.memory_model.assembly`: the exact-norm assembly's entries, slabs, working set (``assembly_bytes``);
- :mod:`~oblr.memory_model.phases`: the step's phases and its peak (``phase_bytes``, ``step_peak_bytes``);
- :mod:`~oblr.memory_model.budget`: resident state, per-sequence cost, the largest micro-batch under a budget.
"""

from __future__ import annotations

from .activations import (
    CHECKPOINTED,
    LOGIT_MULT,
    PLANS,
    act_per_token_layer,
    activation_bytes,
    chunked,
    logits_bytes,
    recompute_bytes,
)
from .assembly import (
    CHUNK_ELEMS,
    SLAB_ELEMS,
    _entries,
    _entry_shapes,
    _numel,
    assembly_bytes,
    assembly_items,
    entry_work_units,
    slab_lists,
)
from .budget import GIB, max_micro_batch, per_sequence_bytes, resident_bytes
from .kept import KEEP_DENSE_SLACK, _outer_kept, keep_dense, kept_bytes
from .phases import (
    _GRADS_FORMED,
    _plain_phases,
    _recompute_phases,
    _working_copies,
    phase_bytes,
    step_peak_bytes,
)
from .shapes import LORA_TARGETS, QWEN3, Shape, _lora_modules, layer_params, linears, lora_params, n_params

__all__ = ["CHECKPOINTED", "CHUNK_ELEMS", "GIB", "KEEP_DENSE_SLACK", "LOGIT_MULT", "LORA_TARGETS", "PLANS", "QWEN3",
           "SLAB_ELEMS", "Shape", "act_per_token_layer", "activation_bytes", "assembly_bytes", "assembly_items",
           "chunked", "entry_work_units", "keep_dense", "kept_bytes", "layer_params", "linears", "logits_bytes",
           "lora_params", "max_micro_batch", "n_params", "per_sequence_bytes", "phase_bytes", "recompute_bytes",
           "resident_bytes", "slab_lists", "step_peak_bytes",
           # private helpers the tests read (the entries' order, the phases' bookkeeping)
           "_GRADS_FORMED", "_entries", "_entry_shapes", "_lora_modules", "_numel", "_outer_kept", "_plain_phases",
           "_recompute_phases", "_working_copies"]
