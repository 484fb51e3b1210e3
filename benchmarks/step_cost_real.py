"""Real-micro-batch cases of ``step_cost.py`` (issue 41): one GRPO update against one OBLR-PO update at the
shapes a user trains.

    python benchmarks/step_cost.py --real all --device cuda --json real.json --markdown real.md --budget-s 480
    python benchmarks/step_cost.py --real qwen3-0.6b-T1024-b4-full-plain --layers 1 --tokens 32 --vocab 512  # CPU smoke

Cases (:func:`all_cases`): a random-init Qwen3-0.6B- or Qwen3-4B-shaped model (``oblr.memory_model.QWEN3``,
built from a config), one micro-batch of 4 or 16 sequences (2 prompts x G = 2, as the H200 runs of
``benchmarks/gpu/memory_check.py``, or 4 x 4; the SNR needs N >= 2 prompts) of T = 1024 or 4096 tokens
(32 prompt + the rest response), full fine-tuning or LoRA (rank 16 on q/k/v/o), activation checkpointing off
or on. Named ``{model}-T{T}-b{sequences}-{full|lora}-{plain|ckpt}``; ``--real`` takes names, shell patterns
(``qwen3-4b-*``) or ``all``.

Each case times GRPO against OBLR-PO, interleaved (``step_cost.run_case``):

- ``plain``: ``grpo`` against ``oblr`` (the one-pass engine);
- ``ckpt``: ``grpo_ckpt`` against the engine the planner picks (:func:`oblr.train.plan.choose_plan` between the
  recompute and the two-pass engine, the whole micro-batch, the budget below), and when no plan fits with the
  whole output layer, both with the output layer in chunks (``*_chunk`` methods, as the planner's refusal
  suggests).

Before a case runs it is refused in one line (and recorded as skipped) when it would obviously not fit or
not finish: a predicted peak (resident state plus :func:`oblr.memory_model.step_peak_bytes`; for LoRA the
memory model counts the full model's gradients, so it errs high) above the budget (CUDA: the device's total
memory less 2 GB; CPU: the available memory), or on CPU an estimated time (FLOPs at 50 GFLOP/s) above
``CPU_LIMIT_S``; with ``--budget-s`` (the GPU script's) a case whose estimate exceeds what is left of the
budget, the throughput calibrated on the cases already run. ``--layers K``, ``--tokens T``, ``--vocab V``
shrink a case (a truncated smoke check that runs on a CPU in seconds; marked ``truncated`` in the output).
"""

from __future__ import annotations

import fnmatch
import math
import os
from dataclasses import dataclass, replace

from step_methods import LOGIT_CHUNK, LORA_TARGETS, Case

from oblr import memory_model as mm

MODELS = {"qwen3-0.6b": "Qwen3-0.6B", "qwen3-4b": "Qwen3-4B"}
TOKENS = (1024, 4096)
SEQUENCES = (4, 16)

def group_size(sequences: int) -> int:
    """Samples per prompt G of a micro-batch of ``sequences``: 2 for 4 sequences (N = 2), else 4."""
    return 2 if sequences < 8 else 4

PROMPT = 32
LORA_RANK = 16
CPU_FLOPS = 5e10  # an optimistic single-thread CPU rate: a case refused at it would not finish anyway
GPU_FLOPS = 1.5e14  # bf16 on one H100/H200 before any case has run (then calibrated)
CPU_LIMIT_S = 900.0
#: calls per method and case: the warm-up, the repeats, and on CPU the profiled call
EXTRA_CALLS = {"cpu": 2, "cuda": 1}
#: cost of a call relative to GRPO's forward + backward (checkpointing: one more forward; two-pass: another backward)
COST = {"grpo": 1.0, "oblr": 1.2, "grpo_ckpt": 1.35, "oblr_recompute": 1.5, "oblr_ckpt": 2.4}


@dataclass(frozen=True)
class RealCase:
    model: str  # a key of MODELS
    tokens: int
    sequences: int
    lora: bool
    ckpt: bool

    @property
    def name(self) -> str:
        return (f"{self.model}-T{self.tokens}-b{self.sequences}-{'lora' if self.lora else 'full'}-"
                f"{'ckpt' if self.ckpt else 'plain'}")

    @property
    def group_key(self) -> tuple[str, bool]:
        """Cases with the same key share one built model."""
        return self.model, self.lora


def all_cases() -> list[RealCase]:
    """Every case: the micro-batches of 4 sequences first (the issue's goal cases), then those of 16; within each,
    grouped by model (0.6B full, 4B full, 0.6B LoRA, 4B LoRA: one model built per group) and cheapest first."""
    groups = (("qwen3-0.6b", False), ("qwen3-4b", False), ("qwen3-0.6b", True), ("qwen3-4b", True))
    return [RealCase(model, t, b, lora, ckpt) for b in SEQUENCES for model, lora in groups for t in TOKENS
            for ckpt in (False, True)]


def select(spec: str) -> list[RealCase]:
    """The cases a ``--real`` value names (comma-separated names or shell patterns, or ``all``), in
    :func:`all_cases` order; ValueError (one line) for a name or pattern that matches none."""
    cases = all_cases()
    if spec.strip() == "all":
        return cases
    chosen = set()
    for part in (p.strip() for p in spec.split(",")):
        hit = [c.name for c in cases if fnmatch.fnmatchcase(c.name, part)]
        if not part or not hit:
            raise ValueError(f"--real: {part!r} names no case; names look like {cases[0].name} "
                             f"({len(cases)} cases: models {'/'.join(MODELS)}, T {'/'.join(map(str, TOKENS))}, "
                             f"b {'/'.join(map(str, SEQUENCES))}, full/lora, plain/ckpt) or 'all'")
        chosen.update(hit)
    return [c for c in cases if c.name in chosen]


@dataclass(frozen=True)
class Shrink:
    """A smoke check's truncation (0 = as the case has it)."""

    layers: int = 0
    tokens: int = 0
    vocab: int = 0

    def __bool__(self) -> bool:
        return bool(self.layers or self.tokens or self.vocab)

    def as_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v}


def shape_of(rc: RealCase, shrink: Shrink = Shrink()) -> mm.Shape:
    s = mm.QWEN3[MODELS[rc.model]]
    return replace(s, layers=shrink.layers or s.layers, vocab=shrink.vocab or s.vocab)


def case_of(rc: RealCase, shrink: Shrink = Shrink()) -> Case:
    """The ``step_methods.Case`` (model shape and batch) of a case, shrunk by ``shrink``."""
    s, tokens = shape_of(rc, shrink), shrink.tokens or rc.tokens
    prompt = min(PROMPT, tokens // 2)
    return Case(hidden=s.hidden, layers=s.layers, vocab=s.vocab, prompt_len=prompt, response_len=tokens - prompt,
                n_prompts=rc.sequences // group_size(rc.sequences), group_size=group_size(rc.sequences), tied=s.tied, heads=s.heads, kv_heads=s.kv_heads,
                head_dim=s.head_dim, intermediate=s.intermediate, lora_rank=LORA_RANK if rc.lora else 0)


def flops(case: Case) -> float:
    """FLOPs of one forward + backward of GRPO on ``case`` (linears, output layer, causal attention)."""
    s = mm.Shape(case.layers, case.hidden, case.intermediate or 3 * case.hidden, case.heads, case.kv_heads,
                 case.head_dim or case.hidden // case.heads, case.vocab, case.tied)
    B, T = case.n_prompts * case.group_size, case.prompt_len + case.response_len
    linear = s.layers * mm.layer_params(s) + s.hidden * s.vocab
    attention = 2 * s.layers * s.heads * s.head_dim * T  # per token: QK^T and AV over half the positions, x2
    return 6.0 * B * T * (linear + attention)


def available_bytes(device: str) -> tuple[float, str]:
    """(budget, where it comes from): CUDA the total memory less 2 GB, CPU the available memory."""
    if device.startswith("cuda"):
        import torch

        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        return float(total - 2 * 10**9), "the device's total memory less 2 GB"
    try:
        with open("/proc/meminfo") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kb * 1024.0, "MemAvailable"
    except (OSError, StopIteration, ValueError):
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "physical memory"


def plan_case(rc: RealCase, case: Case, *, budget: float, param_bytes: int) -> dict:
    """The methods a case runs (``baseline``, ``method``), the engine, the output-layer chunk and the predicted
    peaks, or ``skip`` (one line) when no plan fits ``budget``."""
    from oblr.train.plan import PlanError, choose_plan, optimizer_state_bytes, predicted_peak, resident

    s = mm.Shape(case.layers, case.hidden, case.intermediate, case.heads, case.kv_heads, case.head_dim, case.vocab,
                 case.tied)
    n_groups, G = case.n_prompts, case.group_size
    optim = 0 if rc.lora else optimizer_state_bytes("adamw", 0.0, param_bytes)  # LoRA's own state is small
    res = resident(s, param_bytes=param_bytes, optim_bytes=optim)
    T = case.prompt_len + case.response_len
    lora = {"lora_rank": LORA_RANK if rc.lora else 0, "lora_targets": tuple(LORA_TARGETS),
            "head_trainable": not rc.lora}
    gb = lambda x: f"{x / 1e9:.1f} GB"  # noqa: E731
    if not rc.ckpt:
        peaks = {k: predicted_peak(s, exact_norms=k == "oblr", checkpointing=False, sequences=n_groups * G,
                                   tokens=T, param_bytes=param_bytes, resident_bytes=res, groups=n_groups, **lora)
                 for k in ("grpo", "oblr")}
        if max(peaks.values()) > budget:
            return {"skip": f"would not fit: predicted peak GRPO {gb(peaks['grpo'])}, one-pass OBLR-PO "
                            f"{gb(peaks['oblr'])} > budget {gb(budget)}"}
        return {"baseline": "grpo", "method": "oblr", "engine": "one_pass", "logit_chunk": 0,
                "predicted_peak_bytes": peaks}
    for chunk in (0, LOGIT_CHUNK):
        try:
            plan = choose_plan(s, budget_bytes=budget, exact_norms=True, allowed=("recompute", "two_pass"),
                               groups=n_groups, group_size=G, tokens=T, param_bytes=param_bytes,
                               resident_bytes=res, max_groups=n_groups, logit_chunk=chunk, **lora)
        except PlanError:
            continue
        if plan.groups < n_groups:
            continue
        grpo = predicted_peak(s, exact_norms=False, checkpointing=True, sequences=n_groups * G, tokens=T,
                              param_bytes=param_bytes, resident_bytes=res, logit_chunk=chunk, groups=n_groups, **lora)
        if grpo > budget:
            continue
        suffix = "_chunk" if chunk else ""
        method = {"recompute": "oblr_recompute", "two_pass": "oblr_ckpt"}[plan.checkpointed_engine] + suffix
        return {"baseline": "grpo_ckpt" + suffix, "method": method, "engine": plan.checkpointed_engine,
                "logit_chunk": chunk, "predicted_peak_bytes": {"grpo_ckpt": grpo, "oblr": plan.peak_bytes}}
    return {"skip": f"would not fit: no checkpointed plan (recompute, two-pass; whole or chunked output layer) "
                    f"fits {n_groups * G} sequences of {T} tokens in {gb(budget)}"}


def estimate_s(case: Case, plan: dict, *, repeats: int, device: str, rate: float) -> float:
    """Seconds a case's calls take at ``rate`` FLOP/s (GRPO-equivalent)."""
    calls = repeats + EXTRA_CALLS["cuda" if device.startswith("cuda") else "cpu"]
    cost = sum(COST.get(plan[k].removesuffix("_chunk"), 2.4) for k in ("baseline", "method"))
    return calls * cost * flops(case) / rate


def case_record(rc: RealCase, case: Case, shrink: Shrink, plan: dict, res=None, *, device: str, dtype: str,
                skipped: str = "") -> dict:
    """The JSON record of one case (``res``: a ``step_cost.CaseResult``; None when skipped)."""
    rec = {"name": rc.name, "model": MODELS[rc.model], "tokens": case.prompt_len + case.response_len,
           "sequences": case.n_prompts * case.group_size, "lora_rank": case.lora_rank, "checkpointing": rc.ckpt,
           "layers": case.layers, "vocab": case.vocab, "truncated": shrink.as_dict(), "device": device,
           "dtype": dtype, "skipped": skipped or plan.get("skip", "")}
    for k in ("baseline", "method", "engine", "logit_chunk", "predicted_peak_bytes"):
        if k in plan:
            rec[k] = plan[k]
    if res is not None:
        rows = {r.method: r for r in res.rows}
        rec["n_trainable"] = res.n_params
        rec["runs"] = {m: {"times_s": r.times, "median_s": _num(r.median), "peak_bytes": _num(r.peak_bytes),
                           "error": r.error} for m, r in rows.items()}
        ok = all(r.error is None and r.times for r in rows.values())
        rec["update_ratio"] = _num(res.ratio(plan["method"])) if ok else None
        rec["peak_ratio"] = _num(res.mem_ratio(plan["method"])) if ok else None
    return rec


def _num(x: float):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def markdown(records: list[dict], header: str) -> str:
    """One table row per case (measured or skipped)."""
    lines = [header, "", "| case | trainable | baseline | OBLR-PO plan | baseline s | OBLR-PO s | update ratio | "
             "baseline peak GiB | OBLR-PO peak GiB | peak ratio | note |", "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in records:
        if r.get("skipped") or "runs" not in r:
            lines.append(f"| {r['name']} | | {r.get('baseline', '')} | {r.get('method', '')} | | | | | | | "
                         f"not run: {r.get('skipped') or 'no result'} |")
            continue
        b, m = r["runs"][r["baseline"]], r["runs"][r["method"]]
        f = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
        gib = lambda x: None if x is None else x / 2**30  # noqa: E731
        err = "; ".join(f"{k}: {v['error']}" for k, v in r["runs"].items() if v["error"])
        trunc = ", ".join(f"{k} {v}" for k, v in r["truncated"].items())
        note = "; ".join(x for x in (f"truncated: {trunc}" if trunc else "", err.replace("|", "/")) if x)
        lines.append(f"| {r['name']} | {r['n_trainable'] / 1e6:.1f}M | {r['baseline']} | {r['method']} | "
                     f"{f(b['median_s'], '.3f')} | {f(m['median_s'], '.3f')} | {f(r['update_ratio'], '.2f')} | "
                     f"{f(gib(b['peak_bytes']), '.2f')} | {f(gib(m['peak_bytes']), '.2f')} | "
                     f"{f(r['peak_ratio'], '.2f')} | {note} |")
    return "\n".join(lines)
