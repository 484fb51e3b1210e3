"""Peak memory of one update step measured on CPU against ``oblr.memory_model``, then projected to Qwen3.

    python benchmarks/memory.py            # 7 cases x 5 methods, 4 of them also 3 chunked (~30 s) + projections
    python benchmarks/memory.py --quick    # 2 small cases, measured vs predicted (a few seconds)
    python benchmarks/memory.py --out benchmarks/results/memory --doc docs/scale.md   # write both

Measurement (:func:`measure`): ``step_cost.run_case``'s warm-up call, one per method, under ``torch.profiler``
with memory events; the peak is torch's CPU tensor memory above what was live at the call's start, so the
model, optimizer state and batch are excluded and gradients are included (the previous method's gradients
are freed before the profiler starts). Methods of ``step_methods``: ``grpo``, ``oblr`` (one-pass
book-keeping), ``grpo_ckpt``, ``oblr_ckpt`` (activation checkpointing; two-pass engine) and
``oblr_recompute`` (checkpointing; recompute engine), and on :data:`CHUNK_CASES` also ``grpo_ckpt_chunk`` /
``oblr_ckpt_chunk`` / ``oblr_recompute_chunk`` (the output layer in chunks). Cases are random-init
Qwen3-shaped float32 models (4 heads, 2 KV heads, MLP 3x hidden, tied embeddings), B = 2 prompts x 2
samples, a 16-token prompt. Prediction: ``oblr.memory_model.step_peak_bytes`` for the same shape, B and
padded length. Projections are the model only (no GPU was used): per-sequence peak and the largest
micro-batch per 80 GB GPU under FSDP2 over 8 GPUs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flop_ratios  # noqa: E402

from oblr import memory_model as mm  # noqa: E402

PROMPT = 16
FULL = [(64, 2, 128), (64, 2, 512), (128, 2, 512), (128, 4, 512), (128, 2, 1024), (256, 2, 256), (256, 2, 1024)]
QUICK = [(64, 2, 128), (128, 2, 256)]
VOCAB = 2048
BAND = 0.15
# the planner's section of docs/scale.md (oblr.train.plan), kept after the generated tables
DOC_FOOTER = """## Choosing a plan under a budget

`oblr train algorithm.memory_plan=auto algorithm.memory_budget_gb=80` lets the trainer choose, from this
memory model and before the weights load, whether activation checkpointing is on (for the exact-norm path:
the one-pass `BookKeeper`, the recompute `RecomputeBookKeeper` or the two-pass `TwoPassBookKeeper`) and the
micro-batch
(`algorithm.micro_batch_groups`), and logs it once at the start of the run (also in `summary.json` as
`memory_plan`). For Qwen3-4B in bf16 with AdamW in one process (N = 8 prompts of up to 256 tokens, G = 8,
`rollout.max_new_tokens=1024`) the planner's output (computed, not run) is

    [oblr] <<PLAN_1024>>

and with 4096 new tokens it refuses: `<<REFUSAL_4096>>`
(the hint appears when chunking is off and would fit). The micro-batch is counted in whole prompt groups (a group's G sequences share one backward, for
its norm `||g_k||^2`), and at such lengths the float32 logit-sized tensors of one group dominate. With the
output layer in chunks (`model.logit_chunk_tokens=512`, below) the same run is planned:

    [oblr] <<PLAN_4096_CHUNKED>>

and with 8192 new tokens (8448 per sequence) the prediction is <<PEAK_8192_CHUNKED>> GB (computed, not run; tests/train/test_plan.py
checks the 4096-token case). These lines are the planner's own output, computed when this file is written. A
micro-batch of one group out of eight: the later micro-batches hold the earlier ones' gradients (8 GB here),
and the prediction counts them.

### Chunked logits: `model.logit_chunk_tokens`

`oblr train model.activation_checkpointing=true model.logit_chunk_tokens=512` applies the output layer 512
positions at a time, each chunk under non-reentrant checkpointing (`oblr.logprobs.chunked_response_logprobs`):
the forward keeps only each chunk's scored log-probs, and the backward recomputes one chunk's logits at a time,
so no `[B, T, vocab]` tensor is ever held (the entropy metric is computed chunk by chunk as well). The
numbers are those of the whole logits (tests/core/test_update_checkpointing.py: w_i, advantages, gradient,
group norms, S, V, loss, entropy and KL against the loop reference and the unchunked step, tied and untied,
with LoRA, micro-batches and KL; tests/core/test_logprobs.py: values with temperature and top-p, gradients;
tests/distributed: 2 FSDP2 ranks with checkpointing against one process; tests/train: an `oblr train` run's
first step against the default run's). What it costs and needs:

- time: one more output-layer product per recomputation (the chunk's forward again), measured in
  docs/performance.md (step_cost case 8);
- memory with exact norms: the checkpointed engines cannot reduce a chunk's contribution on its own (a
  row's output-layer gradient is the sum over its chunks), so each keeps one float32 per-row sum of the
  output layer's gradient, `B x vocab x hidden` (1.56 GB per sequence for Qwen3-4B) when the output layer is
  trained (not with LoRA). Below a few thousand tokens that can exceed what chunking saves: the planner
  predicts both, so compare the plan lines with and without it;
- exact norms need a checkpointed engine (two-pass or recompute): `model.logit_chunk_tokens` with the
  one-pass engine (no checkpointing, `memory_plan=one_pass`, or the loop reference
  `algorithm.norms_method=loop`) is refused in one line, and `memory_plan=auto` then plans the checkpointed
  engines only; a baseline weighted by the logits themselves
  (`otb_proxy`) is refused too;
- models: the causal-LM classes whose forward returns the output layer's result unchanged (model types
  qwen3, qwen2, llama, mistral, smollm3); any other model type is refused before the weights load, and a
  forward that changes the result anyway is caught at the first step;
- not in `OBLRGRPOTrainer` (TRL computes its own log-probs) nor in the verl recipe (verl's actor does).

| key | values | meaning |
|---|---|---|
| `algorithm.memory_plan` | `none` (default), `auto`, `one_pass`, `recompute`, `two_pass` | `none`: no planning, `model.activation_checkpointing`, `algorithm.checkpointed_engine` and `algorithm.micro_batch_groups` as given (the default run is unchanged, bit for bit). `auto`: the planner chooses the engine and the micro-batch. `one_pass` / `recompute` / `two_pass`: that engine, the micro-batch chosen; `recompute` and `two_pass` turn `model.activation_checkpointing` on themselves and set `algorithm.checkpointed_engine` |
| `algorithm.memory_budget_gb` | unset (default) or > 0 | memory per device (per rank), decimal GB. Unset with a plan: the free memory of the CUDA device before the model loads; on CPU a plan needs it |
| `algorithm.checkpointed_engine` | `two_pass` (default), `recompute` | the exact-norm engine when `model.activation_checkpointing` is on and no plan chooses it (`memory_plan: none`): two-pass keeps nothing per layer and runs a second backward; recompute runs one backward and keeps each layer's per-row gradients. Refused with checkpointing off and no plan, against a `memory_plan` that names the other engine or `auto` (which chooses the engine itself), and `recompute` with `algorithm.norms_method=loop` (the loop reference runs on the one-pass engine) |

The names are the registry `oblr.train.plan.MEMORY_PLANS` (the one registry pattern, so `oblr train --help`,
`oblr tasks` and the refusals list them). `one_pass`/`recompute`/`two_pass` name the three exact-norm engines of
docs/gradnorm.md; the key is `memory_plan` rather than `plan` because it decides memory only, never the
numbers: every engine and every micro-batch split give the same step (the tests compare them).

**The rule.** The predicted peak of a device is its resident state plus `step_peak_bytes` of one
micro-batch of `groups x G` sequences of `longest prompt + rollout.max_new_tokens` tokens (the prompts are
counted with the model's tokenizer, every training prompt). Resident: the parameters in `model.dtype` and the
optimizer's state (AdamW two moments in that dtype, SGD with momentum one), twice the parameters with a KL
reference model; under `distributed.strategy=fsdp` their `1/world` share plus the gathered layers of
`resident_bytes`. Among the allowed engines the planner takes the **largest micro-batch that fits** (at most
the rank's `N / world` groups, and at most a `micro_batch_groups` the user set), and on a tie **the
cheaper engine**: one-pass (no recomputation), then recompute (one recomputation, no second backward), then
two-pass (a recomputation and a second backward). So a generous budget gives the one-pass engine on the
whole batch, a tighter one the recompute engine (its kept per-row gradients are small for LoRA and small
models, `B x` the trainable weights in float32 per rank at long responses otherwise), a tighter one the
two-pass engine, a tighter one a smaller micro-batch. That order (fewer micro-batches before fewer passes)
is a rule, not a measured optimum: the two-pass engine costs about one more backward (docs/performance.md),
a halved micro-batch on a GPU usually less than that, unless the micro-batches are small.

- **Methods without exact norms** (a baseline without exact weights and a schedule without S, V, e.g.
  `algorithm.baseline=grpo algorithm.lr_schedule=constant`): only the micro-batch is chosen; checkpointing
  stays as `model.activation_checkpointing` says (`one_pass`/`recompute`/`two_pass` are refused for them).
- **Checkpointing.** `recompute` and `two_pass` turn checkpointing on; `one_pass` with
  `model.activation_checkpointing=true` is refused (a contradiction); `auto` with
  `model.activation_checkpointing=true` chooses among the checkpointed engines (recompute, two-pass) only. A
  model class whose `supports_gradient_checkpointing` is false is refused for
  `model.activation_checkpointing=true`, `recompute` and `two_pass`, read off the class that its
  `config.json` names (no weights); `auto` leaves the checkpointed engines out for it.
- **Distributed.** The budget is per rank. Under `fsdp` the resident state is the rank's shard plus the
  gathered layers, and every engine is planned (checkpointing works with FSDP2: docs/distributed.md; the
  recompute engine's kept per-row gradients are whole on every rank, not sharded);
  under `ddp` each rank holds the whole resident state.
- **Refusals** (one line, exit status 2, before the weights load): a plan name that does not exist; a
  budget of 0 or below; a budget with `memory_plan: none`; a budget below the model's own resident state
  ("... is below the model's own resident size, 24.1 GB"); a budget no plan meets, with the smallest budget
  (rounded up to 0.1 GB) at which the planner then returns a plan; a plan on CPU without a budget; a model
  whose `config.json` lacks the shape keys (`num_hidden_layers`, `hidden_size`, ...).
- **What the plan does not see**: generation (the rollout engine's KV cache and, for vllm, its
  `memory_fraction`), LoRA's smaller optimizer state (the full model's is counted: conservative), allocator
  fragmentation, CUDA context and NCCL buffers, and what the memory model itself leaves out (above). Leave
  headroom: a budget of 90 % of the device is a reasonable start. On a GPU the planner ran once, on the
  built-in tiny model: with no budget set it took the H200's free memory (150 GB) as the budget and logged its
  plan (`benchmarks/gpu/train_check.py`, `benchmarks/results/gpu/h200_scale/summary.md`); not at Qwen3 sizes.
- The saved `config.yaml` keeps the keys as written (`memory_plan`, `memory_budget_gb`), not the resolved
  checkpointing and micro-batch, so a resume plans again from the same keys (like `micro_batch_groups`,
  they are not among the keys a resume may change).
"""
DOC_HEADER = """# Memory at scale: measured on CPU, projected to Qwen3

Generated by `python benchmarks/memory.py --out benchmarks/results/memory --doc docs/scale.md`; do not edit
the tables by hand. The first table is a measurement (torch's CPU
allocator, float32, small random-init Qwen3-shaped models) against the memory model
`oblr.memory_model`; the second is the model's projection only.

The exact-norm plans: `oblr`, the one-pass `BookKeeper` (no checkpointing; keeps each hooked module's
activations); with activation checkpointing, `oblr_ckpt`, the two-pass `TwoPassBookKeeper` (a norm pass and
a gradient pass; keeps nothing per layer), and `oblr_recompute`, the `RecomputeBookKeeper` (one
activation-gradient backward; keeps each recomputed layer's per-row gradients, or their factors where
smaller, until the assembly: up to B x the trainable weights in float32, not sharded under FSDP2). The
planner (`algorithm.memory_plan=auto`, last section) chooses among them from this model.

What is measured: the peak of one update step (`step_cost.run_case`'s profiled warm-up call, one per method)
above what was live before it (model, AdamW state, batch excluded; gradients included), for `grpo`, `oblr`,
`grpo_ckpt`, `oblr_ckpt` and `oblr_recompute` (Hugging Face non-reentrant activation checkpointing for the
last three), B = 2 prompts x 2 samples, a 16-token prompt, 4 heads / 2 KV heads, MLP 3x hidden, vocab 2048,
tied embeddings. The previous method's gradients are freed before the profiler starts: freed inside it,
their release was counted (the profiler knew their size from the previous profiled call) and lowered every
row after `grpo` by the gradients' size, `4 P` bytes (0.8-8 MiB here), in the tables before this one.

The `*_chunk` rows are `grpo_ckpt` / `oblr_ckpt` / `oblr_recompute` with the output layer in chunks of 128
positions (`model.logit_chunk_tokens`, section below), measured on four of the cases.

What the model assumes (docstring of `oblr/memory_model/__init__.py`): activations per token per layer counted from
the tensors a Hugging Face Qwen3 layer saves (GRPO `6h + 7q + 6kv + 4I`; one pass `10h + 5q + 4kv + 4I`, of
which `4h` is calibrated on these measurements; checkpointed: the layer input `h` plus one recomputed
layer), the `[B, 1, T, T]` attention mask Hugging Face builds for a padded batch (once: every layer's sdpa
attention keeps the same tensor; found by listing the tensors a layer saves), attention kernels that keep
no other `T x T` matrix, 5 float32 logit-sized tensors at the start of the backward (4 for the one pass
and the recompute engine; the two-pass norm pass keeps 4 when tied), and the larger of the step's phases.
For `oblr_recompute` (all terms derived, not calibrated): the kept contributions per trainable weight, the
smaller of the float32 per-row gradients `4 B R C` and the factors `B T (R + C)` in the activation dtype
(`assembly.keep_dense`; the input shared by q/k/v and by gate/up counted once), the norm weights' per-row
gradients, the output layer's (tied: with the embedding's token ids) or, in chunks, its float32 per-row sum
`4 B V h`; its phases are the start of the backward (4 logit-sized tensors), the bottom layer's backward (one
recomputed layer, the logits, the contributions of the layers above), the entropy after the backward (the
logits and 3 temporaries, the contributions; the activations freed) and the assembly (the contributions and
the gradients). It leaves out the one-pass engine's kept-dense conversion (never larger than the factors it
replaces), fragmentation and memory outside torch's allocator. The assembly (the weighted gradient and the
group norms, entry by entry) is counted with its float32 working set (`memory_model.assembly_bytes`: each
entry's group sums and running total over the gradients formed before it), checked against
`assembly.grouped_sums` measured alone.

Projection assumptions (not measured): Qwen3 shapes from the public Hugging Face configs as remembered
here (0.6B: 28 layers, hidden 1024, MLP 3072, 16/8 heads; 1.7B: 28, 2048, 6144, 16/8; 4B: 36, 2560,
9728, 32/8; 8B: 36, 4096, 12288, 32/8; head_dim 128, vocab 151936; tied embeddings for 0.6B/1.7B/4B,
untied for 8B -- check against the config before relying on it); bf16 activations with the same element
counts as float32 on CPU; float32 logits with the same multiplicity as measured (a GPU run keeps a bf16
copy too, not counted); FSDP2 over 8 GPUs with bf16 sharded parameters and gradients, fp32 AdamW state
(master copy + two moments) sharded, two gathered layers and the gathered embedding (and `lm_head`)
resident; 80 GB (decimal) per GPU; no CUDA allocator overhead, no NCCL buffers, no rollout engine sharing
the GPU. A micro-batch of 0 means one sequence does not fit without checkpointing.

On one GPU (an H200, lent twice; `bash benchmarks/gpu/scale_checks.sh`, results and their generated summary
in `benchmarks/results/gpu/h200_scale/summary.md`): `benchmarks/gpu/memory_check.py` checked the two-pass
and the recompute engines with checkpointing against the loop reference in float32 (w_i, advantages,
gradient, group norms, S, V, learning rate; whole logits and chunks of 16; largest error 1.2e-6) and measured
`torch.cuda.max_memory_allocated` of a step against this model on Qwen3-0.6B-, 4B- and 8B-shaped models
(random init, bf16, 4 sequences of 1024 or 4096 tokens; every plan, and Qwen3-4B with LoRA rank 16):
**25 of 28 peaks within 15 %** of the current model (two more LoRA rows, of GRPO, are not counted: the model
prices a LoRA run's gradients as the full model's for every plan but `oblr_recompute`, conservatively; they
measure 0.62-0.89). The misses are three over-predictions (0.82-0.84, checkpointed GRPO or OBLR-PO with chunked
logits). Two under-predictions of the model of the day led to two terms: Qwen3-4B `grpo_ckpt_chunk` at 1024
tokens (1.16: 1.44 GiB above, the size of two bf16 `vocab x hidden` tensors: at the end of the backward
autograd holds `lm_head`'s weight gradient until the tied embedding's arrives and sums the two, the `tied_sum`
phase; 1.07 now -- read off this row, so not an independent check) and Qwen3-0.6B `oblr_recompute_chunk` at
1024 tokens (1.21: 1.7 GiB above; the assembly's float32 group sums of the output layer,
`memory_model.assembly_bytes`, derived and checked against `assembly.grouped_sums` on CPU; 1.09 now; the engine
since frees each chunk before the next and adds into the running total in place, not measured on the GPU).
Measured there: Qwen3-4B with 4 x 4096 tokens,
checkpointing on, 45 GiB above the model with whole logits and 11.1 (GRPO) / 13.0 (OBLR-PO, two-pass) GiB with
chunks of 512, 91.4 / 67.8 GiB for the recompute engine (its kept per-row gradients), and with LoRA 35.5 / 8.3
GiB for the recompute engine against 44.8 / 8.3 for GRPO; Qwen3-8B, two-pass, 46.8 / 46.9 and 19.9 / 26.2
GiB. The FSDP2 projection over 8 GPUs below was not run. The script's CPU path (`--dry-run`, tiny shapes)
runs in the test suite (tests/scripts/test_gpu_memory_check.py).

Where the model misses: every row is within 15 %. The largest over-predictions are the two-pass rows with
whole logits at hidden 128 (0.88-0.89: fewer than the 5 logit-sized tensors assumed are live at once at the
start of the backward); before the previous method's gradients were freed outside the profiler, the widest
short case (hidden 256, T = 16+256) read ~18 % below the prediction for the checkpointed plans, most of which
was that gradient term. The `oblr_recompute` rows measure 0.92-1.02 (chunked 0.97-1.02); its bf16 factor
path and its LoRA terms are not in this table: compared once ad hoc on CPU (bf16 random-init models with
factors kept for the MLP and the output layer, and LoRA r = 8 on q/k/v/o in float32 and bf16, 3-4 cases
each), they measured 0.85-1.15. With the output layer in chunks the logits no longer hide
the backward of the recomputed layers: profiled (torch.profiler memory events), the peak is then inside the
top layer's MLP backward, where the gradients of its `B x T x intermediate` tensors coexist with the
recomputed layer; the model does not count those (about `3 x B x T x intermediate` elements, ~2 GB in bf16
for Qwen3-4B at 8 sequences of 4352 tokens), and it counts the attention mask, which a flash-attention run on
a GPU does not hold (0.3 GB there); on these CPU cases `grpo_ckpt_chunk` measures 0.95-1.02 and
`oblr_ckpt_chunk` 1.09-1.11 (under-predicted; not profiled). Before the mask was counted, the
chunked rows at hidden 128, T = 16+1024 measured 1.22-1.32x the prediction. The projected checkpointed peaks
with whole logits are dominated by the float32 logit-sized tensors (5 x T x 151936 x 4 bytes: 12.4 GB per
sequence at 4k tokens), so `oblr_ckpt` projects equal to `grpo_ckpt`; with the output layer in chunks of 512
the per-sequence figures drop to 2-7 GB, and `oblr_ckpt_chunk` pays `vocab x hidden x 4` bytes per sequence
(1.56 GB for Qwen3-4B) for its per-row sum of the output layer's gradient. `oblr_recompute` pays its kept
per-row gradients per sequence, whole on every rank: at 1024 tokens in bf16 most weights keep their factors
(smaller than the float32 per-row gradients below `T = 2RC/(R+C)`, 3150 for Qwen3-4B's q_proj) and it
projects between the two-pass and one-pass figures; at 4096-8192 tokens its kept per-row gradients approach
4 bytes per trainable weight per sequence, so at Qwen3-4B and 8B full fine-tuning one or two sequences fit
per 80 GB GPU (with the output layer in chunks one to four) -- less than one group of G = 8, i.e. no plan
with whole groups: the two-pass engine (nothing
kept per layer) is the one that fits there, and the planner prices both.
"""


def case_of(hidden: int, layers: int, response_len: int, vocab: int = VOCAB):
    from step_methods import Case

    return Case(hidden=hidden, layers=layers, vocab=vocab, prompt_len=PROMPT, response_len=response_len,
                n_prompts=2, group_size=2)


def shape_of(case) -> mm.Shape:
    """The memory model's shape of a ``step_methods.Case`` (its defaults: MLP 3x hidden, head_dim hidden/heads)."""
    return mm.Shape(case.layers, case.hidden, case.intermediate or 3 * case.hidden, case.heads, case.kv_heads,
                    case.head_dim or case.hidden // case.heads, case.vocab, case.tied)


#: step_methods' chunked-output-layer methods -> memory-model plan
CHUNK_PLANS = {"grpo_ckpt_chunk": "grpo_ckpt", "oblr_ckpt_chunk": "oblr_ckpt", "oblr_recompute_chunk": "oblr_recompute"}
#: cases (hidden, layers, response tokens) also measured with the output layer in chunks
CHUNK_CASES = {(128, 2, 1024), (256, 2, 1024), (128, 4, 512), (128, 2, 256)}


def predicted(s: mm.Shape, method: str, b: int, t: int, grads_live: bool = False, groups: int = 0) -> int:
    """The memory model's step peak for a ``step_methods`` method name (``b``: sequences per micro-batch, of
    ``groups`` prompt groups; ``grads_live``: the batch is split, so later micro-batches hold the earlier ones'
    gradients)."""
    from step_methods import LOGIT_CHUNK

    if method in CHUNK_PLANS:
        return mm.step_peak_bytes(s, CHUNK_PLANS[method], b, t, logit_chunk=LOGIT_CHUNK, grads_live=grads_live,
                                  groups=groups)
    return mm.step_peak_bytes(s, method, b, t, grads_live=grads_live, groups=groups)


def plans_of(h: int, layers: int, resp: int) -> list[str]:
    return list(mm.PLANS) + (list(CHUNK_PLANS) if (h, layers, resp) in CHUNK_CASES else [])


def measure(case, plans=mm.PLANS) -> list[dict]:
    """One row per plan: measured and predicted peak (bytes) and their ratio.

    The warm-up call of ``step_cost.run_case`` (same model, batch, AdamW state, ``_call`` and ``_peak_bytes``)
    for each method in ``plans`` (and ``grpo``), except that the previous method's gradients are freed *before*
    the profiler starts: freed inside it, their release counts as a negative event (the profiler knows their
    size when an earlier profiled call allocated them) and lowers every later method's peak by the gradients'
    size, ``4 P`` bytes (measured: exactly that, 8.0 MiB at hidden 256)."""
    import torch
    from step_cost import _call, _peak_bytes
    from step_methods import Ctx, build_batch, build_model, methods

    torch.set_num_threads(1)
    model = build_model(case)
    batch, rewards = build_batch(case)
    ctx = Ctx(model, batch, rewards, max_len=case.response_len, micro_batch_groups=case.micro_batch_groups)
    opt = torch.optim.AdamW(ctx.params(), lr=0.0)
    for p in ctx.params():
        p.grad = torch.zeros_like(p)
    opt.step()  # the optimizer state exists before every measurement
    s, t = shape_of(case), case.prompt_len + case.response_len
    split = 0 < case.micro_batch_groups < case.n_prompts  # later micro-batches hold the earlier ones' gradients
    b = (case.micro_batch_groups if split else case.n_prompts) * case.group_size
    n = sum(p.numel() for p in ctx.params())
    if n != mm.n_params(s):
        raise RuntimeError(f"memory model counts {mm.n_params(s)} parameters, the model has {n}")
    rows = []
    for m in (m for m in methods() if m.name in plans or m.name == "grpo"):
        opt.zero_grad(set_to_none=True)
        try:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
                _call(m, ctx, opt)
        except Exception as e:  # noqa: BLE001 -- one line naming the method
            raise RuntimeError(f"{m.name} failed on {case.name}: {type(e).__name__}: {e}") from e
        peak = _peak_bytes(prof)
        pred = predicted(s, m.name, b, t, grads_live=split, groups=b // case.group_size)
        rows.append(dict(case=case, plan=m.name, measured=peak, predicted=pred, ratio=peak / pred))
    return rows


def measured_table(rows) -> str:
    out = ["| hidden | layers | T (prompt+response) | B | plan | measured MiB | predicted MiB | measured/predicted |",
           "|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        c = r["case"]
        flag = "" if abs(r["ratio"] - 1) <= BAND else " **outside 15 %**"
        out.append(f"| {c.hidden} | {c.layers} | {c.prompt_len}+{c.response_len} | {c.n_prompts * c.group_size} | "
                   f"{r['plan']} | {r['measured'] / 2**20:.1f} | {r['predicted'] / 2**20:.1f} | "
                   f"{r['ratio']:.3f}{flag} |")
    return "\n".join(out)


#: the output-layer chunk of the projection's ``*_chunk`` columns
PROJECTION_CHUNK = 512


def projection_table(tokens=(1024, 4096, 8192), budget_gb: float = 80.0, world: int = 8) -> str:
    """Per-sequence peak (GiB, bf16 activations, fp32 logits) and the largest micro-batch per GPU."""
    cols = [(p, p, 0) for p in mm.PLANS] + [(f"{p}_chunk", p, PROJECTION_CHUNK) for p in ("grpo_ckpt", "oblr_ckpt", "oblr_recompute")]
    out = ["| model | params | resident per GPU (GiB) | response tokens | "
           + " | ".join(f"{c} GiB/seq | {c} max micro-batch" for c, _, _ in cols) + " |",
           "|---|---:|---:|---:|" + "---:|" * (2 * len(cols))]
    for name, s in mm.QWEN3.items():
        res = mm.resident_bytes(s, world) / mm.GIB
        for t in tokens:
            cells = []
            for _, p, ch in cols:
                cells += [f"{mm.per_sequence_bytes(s, p, t, logit_chunk=ch) / mm.GIB:.1f}",
                          str(mm.max_micro_batch(s, p, t, budget_gb * 1e9, world, logit_chunk=ch))]
            out.append(f"| {name} | {mm.n_params(s) / 1e9:.2f}B | {res:.1f} | {t} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def planner_footer() -> str:
    """``DOC_FOOTER`` with the planner's lines for Qwen3-4B computed now (oblr.train.plan; one process, bf16,
    AdamW, N = 8 prompts of up to 256 tokens, G = 8, budget 80 GB, memory_plan=auto)."""
    from oblr.train.plan import GB, PlanError, choose_plan, optimizer_state_bytes, resident

    s4 = mm.QWEN3["Qwen3-4B"]
    res = resident(s4, param_bytes=2, optim_bytes=optimizer_state_bytes("adamw", 0.0, 2))
    kw = dict(budget_bytes=80 * GB, exact_norms=True, allowed=("one_pass", "recompute", "two_pass"), groups=8,
              group_size=8, param_bytes=2, resident_bytes=res)
    try:
        choose_plan(s4, tokens=256 + 4096, **kw)
        raise RuntimeError("the 4096-token case was expected to be refused with whole logits")
    except PlanError as e:
        refusal = str(e).split(": ", 1)[1]
    fills = {
        "<<PLAN_1024>>": choose_plan(s4, tokens=256 + 1024, **kw).line(),
        "<<REFUSAL_4096>>": refusal,
        "<<PLAN_4096_CHUNKED>>": choose_plan(s4, tokens=256 + 4096, logit_chunk=512, **kw).line(),
        "<<PEAK_8192_CHUNKED>>": f"{choose_plan(s4, tokens=256 + 8192, logit_chunk=512, **kw).peak_bytes / GB:.1f}",
    }
    out = DOC_FOOTER
    for k, v in fills.items():
        out = out.replace(k, v)
    return out


def write_doc(path: Path, tables: str) -> None:
    """docs/scale.md: ``DOC_HEADER`` and ``tables``, then the FLOP section that ``flop_ratios.py`` owns, kept
    as it is in the file, then ``DOC_FOOTER`` (choosing a plan under a budget)."""
    text = DOC_HEADER + "\n" + tables.replace("## ", "### ") + "\n"
    old = path.read_text() if path.exists() else ""
    if flop_ratios.BEGIN in old and flop_ratios.END in old:
        kept = old.split(flop_ratios.BEGIN, 1)[1].split(flop_ratios.END, 1)[0]
        text += "\n" + flop_ratios.BEGIN + kept + flop_ratios.END + "\n"
    path.write_text(text + "\n" + planner_footer())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two small cases, measured vs predicted")
    ap.add_argument("--out", type=Path, default=None, help="write summary.md (quick.md with --quick) into this folder")
    ap.add_argument("--doc", type=Path, default=None, help="write docs/scale.md: DOC_HEADER + the tables")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for h, layers, resp in (QUICK if args.quick else FULL):
        case = case_of(h, layers, resp)
        print(f"measuring {case.name}", file=sys.stderr, flush=True)
        rows += measure(case, plans_of(h, layers, resp))
    worst = max(abs(r["ratio"] - 1) for r in rows)
    text = ["## Measured on CPU vs predicted (step peak above model + optimizer state + batch; float32)", "",
            measured_table(rows), "",
            f"{sum(abs(r['ratio'] - 1) <= BAND for r in rows)}/{len(rows)} within 15 %; largest deviation "
            f"{worst:.1%}; measured in {time.perf_counter() - t0:.0f} s"]
    if not args.quick:
        text += ["", "## Projection (memory model only; not run on 8 GPUs)", "",
                 "bf16 activations, float32 logits, FSDP2 over 8 GPUs (bf16 sharded params and grads, fp32 AdamW "
                 "state), 80 GB per GPU; T = the response tokens (prompt tokens not added); per-sequence figures "
                 f"exclude the resident state; `*_chunk`: the output layer in chunks of {PROJECTION_CHUNK} positions "
                 "(for `oblr_ckpt_chunk` the per-row sum of the output layer's gradient is counted per sequence, for "
                 "`oblr_recompute` its kept per-row gradients or factors, not sharded; "
                 "a micro-batch is whole groups, so round down to a multiple of G).", "",
                 projection_table()]
    out = "\n".join(text)
    print(out)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / ("quick.md" if args.quick else "summary.md")).write_text(out + "\n")
    if args.doc:
        write_doc(args.doc, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
