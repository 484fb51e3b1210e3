"""Cost of one OBLR-PO update step relative to one GRPO update step, measured in the same run.

    python benchmarks/step_cost.py            # the full table (4 cases, ~10 minutes on 2 shared CPU cores)
    python benchmarks/step_cost.py --quick    # one small case, well under a minute
    python benchmarks/step_cost.py --markdown docs/perf_table.md
    python benchmarks/step_cost.py --model prepared:smollm2-135m-instruct --methods oblr   # a real checkpoint
    python benchmarks/step_cost.py --real all --device cuda --json out.json   # real micro-batches (step_cost_real.py)

For each case (a random-init Qwen3-shaped model, or with ``--model`` a real checkpoint, fully fine-tuned
and with LoRA adapters of ``--lora-rank``; and a batch of N*G sequences) every method of
``step_methods.py`` runs one update step: ``zero_grad``, gradient accumulation, ``AdamW.step`` (learning
rate 0, so the model is identical for every call and every method); no generation. Per method:

- **time**: median over ``--repeats`` timed calls, after one untimed warm-up call; repeats are
  interleaved across methods (round r runs every method once, in a rotated order) so that drift on a shared
  machine hits all methods alike. The ratio is the method's median divided by GRPO's median of the same run.
- **peak memory**: the warm-up call runs under ``torch.profiler`` with ``profile_memory=True``; the peak is
  the largest amount of CPU tensor memory (torch's allocator: activations, saved tensors, gradients,
  book-keeping records, optimizer temporaries) live at any point of the call beyond what was live when it
  started (model, optimizer state and batch excluded). Memory outside torch's allocator (Python objects,
  BLAS scratch) is not counted.
- **grad err**: ``||grad - grad_oblr|| / ||grad_oblr||`` of the warm-up call against the ``oblr`` method
  (all OBLR-PO variants must compute the same gradient; GRPO uses another baseline, so "-").

Allocator: by default the C library's malloc runs with its defaults, as ``oblr train`` runs (nothing in
``src/`` calls ``mallopt``): freed heap tops and large blocks go back to the OS and the next step faults them
in again. ``--malloc retain`` keeps freed memory in the process instead (:func:`retain_freed_memory`).

On CUDA (``--device cuda``: bf16 weights) the times are taken between ``torch.cuda.synchronize`` calls and the
peak is ``torch.cuda.max_memory_allocated`` during a timed call minus what was allocated when it started.

Results go to stdout as a table (and to ``--markdown FILE``); the last line is
``oblr/grpo step-time ratio: X.XX`` (the first case's ratio). ``--real NAMES`` runs the real-micro-batch cases
of ``step_cost_real.py`` instead (Qwen3-0.6B / 4B shapes, T = 1024 / 4096, 4 / 16 sequences; ``--json FILE``).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_methods import Case, Ctx, Method, build_batch, build_model, methods

QUICK_CASES = [Case(hidden=128, layers=2, vocab=2048, prompt_len=16, response_len=64, n_prompts=4, group_size=4)]
FULL_CASES = [
    Case(hidden=128, layers=4, vocab=4096, prompt_len=32, response_len=64, n_prompts=8, group_size=4),
    Case(hidden=128, layers=4, vocab=4096, prompt_len=32, response_len=256, n_prompts=8, group_size=4),
    Case(hidden=256, layers=6, vocab=4096, prompt_len=32, response_len=64, n_prompts=8, group_size=4, tied=False),
    Case(hidden=256, layers=6, vocab=4096, prompt_len=32, response_len=256, n_prompts=8, group_size=4, tied=False),
    Case(hidden=128, layers=4, vocab=4096, prompt_len=32, response_len=64, n_prompts=8, group_size=4,
         micro_batch_groups=2),
    # deep and long: where activation checkpointing matters (--methods grpo,oblr,grpo_ckpt,oblr_ckpt --cases 5)
    Case(hidden=128, layers=8, vocab=4096, prompt_len=32, response_len=480, n_prompts=2, group_size=4),
    # the same model at T = 1024 (issue 26: peak memory with checkpointing; --cases 6, same methods)
    Case(hidden=128, layers=8, vocab=4096, prompt_len=32, response_len=992, n_prompts=2, group_size=4),
    # real shapes, deep and narrow with short responses: a Qwen3-architecture model shaped like SmolLM2-135M
    # (30 layers, hidden 576, 9/3 heads of 64, MLP 1536, vocab 49152 tied); --methods grpo,oblr --cases 7
    Case(hidden=576, layers=30, vocab=49152, prompt_len=32, response_len=128, n_prompts=2, group_size=4,
         heads=9, kv_heads=3, head_dim=64, intermediate=1536),
    # a large vocabulary at T = 1024, where the logits dominate a checkpointed step's memory: the output layer
    # whole or in chunks (--methods grpo_ckpt,oblr_ckpt,grpo_ckpt_chunk,oblr_ckpt_chunk --cases 8; the recompute
    # engine: oblr_recompute, oblr_recompute_chunk)
    Case(hidden=128, layers=8, vocab=16384, prompt_len=32, response_len=992, n_prompts=2, group_size=4),
    # the recompute engine at case 7's real shape with a longer response, checkpointing on: full fine-tuning
    # (case 9), then LoRA r = 8 on q/k/v/o (case 10); --methods grpo_ckpt,oblr_ckpt,oblr_recompute --cases 9,10
    Case(hidden=576, layers=30, vocab=49152, prompt_len=32, response_len=224, n_prompts=2, group_size=2,
         heads=9, kv_heads=3, head_dim=64, intermediate=1536),
    Case(hidden=576, layers=30, vocab=49152, prompt_len=32, response_len=224, n_prompts=2, group_size=2,
         heads=9, kv_heads=3, head_dim=64, intermediate=1536, lora_rank=8),
]


#: with --model: prompt tokens, response tokens, prompts N, samples G (the shape of
#: configs/real-model/smollm2-arith-chat-lora.yaml: its chat prompts are about 40-45 tokens)
MODEL_SHAPE = (48, 48, 4, 4)


def model_cases(model: str, lora_rank: int, shape: tuple[int, int, int, int] = MODEL_SHAPE) -> list[Case]:
    """A real checkpoint at one batch shape: full fine-tuning, then LoRA of ``lora_rank`` (0: only full)."""
    P, L, N, G = shape
    base = dict(hidden=0, layers=0, vocab=0, prompt_len=P, response_len=L, n_prompts=N, group_size=G, model=model)
    return [Case(**base)] + ([Case(**base, lora_rank=lora_rank)] if lora_rank else [])


@dataclass
class Row:
    method: str
    what: str
    times: list[float] = field(default_factory=list)
    sys_times: list[float] = field(default_factory=list)  # system time of each timed call
    peak_bytes: float = math.nan
    grad_err: float = math.nan
    peaks: list[float] = field(default_factory=list)  # CUDA: the peak of each timed call
    error: str | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.nan


@dataclass
class CaseResult:
    case: Case
    rows: list[Row]
    n_params: int
    baseline: str = "grpo"  # the denominator of the ratios

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.method == name)

    def ratio(self, name: str) -> float:
        return self.row(name).median / self.row(self.baseline).median

    def mem_ratio(self, name: str) -> float:
        return self.row(name).peak_bytes / self.row(self.baseline).peak_bytes


def _peak_bytes(prof) -> float:
    """Largest live CPU tensor memory during the profiled region, relative to its start."""
    cur = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        if e.device_type() == torch.autograd.DeviceType.CPU:
            cur += e.nbytes()
            peak = max(peak, cur)
    return float(peak)


def retain_freed_memory() -> bool:
    """glibc only: keep freed memory in the process (fixed 32 MiB mmap threshold, no heap trimming, the heap
    grown 256 MiB at a time); ``--malloc retain``.

    By default glibc returns freed heap tops and large blocks to the OS, and the next step faults the pages
    in again (zero-filled): a per-step cost that grows with how much memory a step holds at once, paid in
    system time. ``oblr train`` on CPU pays it (it runs with the defaults, so ``--malloc default`` is this
    script's default); a training process on a GPU keeps freed blocks in PyTorch's caching allocator instead.
    This applies to every method alike. Returns True if applied.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
    return (bool(libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
            and bool(libc.mallopt(M_TOP_PAD, 256 << 20)))


def _call(m: Method, ctx: Ctx, opt, sys_times: list[float] | None = None, peaks: list[float] | None = None) -> float:
    """One update step of method ``m``; returns its wall time (setup/teardown excluded) and appends the
    process's system time during it to ``sys_times`` (page faults, mostly: where the allocator differs); on CUDA
    the times are between synchronizations and the call's peak allocated memory beyond its start goes to
    ``peaks``."""
    cuda = ctx.batch.input_ids.is_cuda
    if m.setup is not None:
        m.setup(ctx)
    try:
        if cuda:
            opt.zero_grad(set_to_none=True)  # the previous call's gradients do not count in this call's peak
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        s0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        m.fn(ctx)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if sys_times is not None:
            sys_times.append(resource.getrusage(resource.RUSAGE_SELF).ru_stime - s0)
        if cuda and peaks is not None:
            peaks.append(float(torch.cuda.max_memory_allocated() - base))
        return wall
    finally:
        if m.teardown is not None:
            m.teardown(ctx)


def _grads(ctx: Ctx) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                      for p in ctx.params()])


def run_case(case: Case, *, repeats: int = 3, only: list[str] | None = None, log=None, device: str = "cpu",
             model=None, baseline: str = "grpo") -> CaseResult:
    """A warm-up call of every method (and the gradient it computes), ``repeats`` interleaved timed calls, then
    (CPU) one profiled call of each for its peak memory; on CUDA the peak is the timed calls' largest.

    ``device``: ``cpu`` (float32) or ``cuda`` (bf16); ``model``: a model already built for this case's shape
    (kept across cases of one shape); ``baseline``: the method every ratio divides by (always run, first).

    The profiled calls come last: after torch's profiler has recorded memory in a process, later steps were
    seen to fault in several times more pages (system time) than before it, more so for the engines that
    make many small allocations (case 7 on 2 CPU cores: OBLR-PO's system time per step 0.6-0.9 s before a
    profiled call, 1.4-2.9 s after it; GRPO's 0.6-1.1 s), which a training process never pays."""
    from types import SimpleNamespace

    cuda = device.startswith("cuda")
    if model is None:
        model = build_model(case, dtype=torch.bfloat16 if cuda else torch.float32, device=device)
    batch, rewards = build_batch(case, vocab=model.config.vocab_size if case.model else None)
    if cuda:
        batch = SimpleNamespace(**{k: v.to(device) for k, v in vars(batch).items()})
        rewards = rewards.to(device)
    ctx = Ctx(model, batch, rewards, max_len=case.response_len, micro_batch_groups=case.micro_batch_groups)
    opt = torch.optim.AdamW(ctx.params(), lr=0.0)
    opt.zero_grad(set_to_none=False)
    for p in ctx.params():
        p.grad = torch.zeros_like(p)
    opt.step()  # create the optimizer state outside every measurement
    ms = [m for m in methods() if m.name == baseline] + [m for m in methods()
                                                         if m.name != baseline and (only is None or m.name in only)]
    if not ms or ms[0].name != baseline:
        raise ValueError(f"run_case: unknown baseline method {baseline!r}")
    rows = {m.name: Row(m.name, m.what) for m in ms}
    # the gradient comparison (a flat copy of every gradient) only where a method is compared with oblr
    compare = "oblr" in rows and any(n not in ("grpo", "oblr", "grpo_ckpt", "grpo_ckpt_chunk") for n in rows)
    ref = None
    for m in ms:  # warm-up: the gradient each method computes
        r = rows[m.name]
        try:
            _call(m, ctx, opt)
            if compare:
                g = _grads(ctx)
                if m.name == "oblr":
                    ref = g
                if ref is not None and m.name not in ("grpo", "oblr"):
                    r.grad_err = float((g - ref).norm() / ref.norm())
        except Exception as e:  # noqa: BLE001 -- a peer that cannot handle the model is reported, not fatal
            r.error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            if cuda:  # an out-of-memory error: what it held goes before the next method
                opt.zero_grad(set_to_none=True)
                del e
                import gc

                gc.collect()
                torch.cuda.empty_cache()
        if log:
            log(f"  warm-up {m.name}: {'failed: ' + r.error if r.error else 'ok'}")
    live = [m for m in ms if rows[m.name].error is None]
    for rep in range(repeats):
        shift = rep % len(live)
        for m in live[shift:] + live[:shift]:
            rows[m.name].times.append(_call(m, ctx, opt, rows[m.name].sys_times, rows[m.name].peaks))
        if log:
            log(f"  repeat {rep + 1}/{repeats}: " + ", ".join(f"{m.name} {rows[m.name].times[-1]:.2f}s" for m in live))
    for m in live:  # peak memory, after every timed call
        if cuda:
            rows[m.name].peak_bytes = max(rows[m.name].peaks, default=math.nan)
            continue
        # the previous method's gradients are freed before the profiler starts: freed inside it, they would
        # lower this method's peak by their size (the profiler counts the free of a block it saw allocated)
        opt.zero_grad(set_to_none=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            _call(m, ctx, opt)
        rows[m.name].peak_bytes = _peak_bytes(prof)
    opt.zero_grad(set_to_none=True)
    return CaseResult(case, [rows[m.name] for m in ms], sum(p.numel() for p in ctx.params()), baseline)


def _fmt(x: float, spec: str) -> str:
    return "-" if not math.isfinite(x) else format(x, spec)


def markdown_table(res: CaseResult) -> str:
    lines = [f"**{res.case.name}** ({res.n_params / 1e6:.2f}M trainable parameters)", "",
             "| method | step time (s, median) | time / GRPO | peak memory (MiB) | memory / GRPO | grad err vs oblr | what |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in res.rows:
        if r.error:
            lines.append(f"| {r.method} | - | - | - | - | - | not measured: {r.error.replace('|', '/')} |")
            continue
        lines.append(f"| {r.method} | {_fmt(r.median, '.3f')} | {_fmt(res.ratio(r.method), '.2f')} | "
                     f"{_fmt(r.peak_bytes / 2**20, '.1f')} | {_fmt(res.mem_ratio(r.method), '.2f')} | "
                     f"{_fmt(r.grad_err, '.1e')} | {r.what} |")
    sys_med = [(r.method, statistics.median(r.sys_times)) for r in res.rows if r.sys_times]
    if sys_med:
        lines += ["", "System time per step (s, median; part of the step time, mostly page faults): "
                  + ", ".join(f"{m} {t:.2f}" for m, t in sys_med)]
    return "\n".join(lines)


def run_real(cases, shrink, *, device: str, repeats: int, budget_s: float, json_path: Path | None,
             md_path: Path | None, header: str, log) -> list[dict]:
    """The real-micro-batch cases of ``step_cost_real.py``, one model built per model and LoRA setting; the JSON
    (and markdown) files are rewritten after every case, so a run cut short keeps what it did."""
    import gc
    import json

    import step_cost_real as real

    cuda = device.startswith("cuda")
    dtype, param_bytes = (torch.bfloat16, 2) if cuda else (torch.float32, 4)
    budget, source = real.available_bytes(device)
    rate = real.GPU_FLOPS if cuda else real.CPU_FLOPS
    done_flops = done_s = 0.0
    t_start, records, model, key = time.perf_counter(), [], None, None

    def write():
        if json_path:
            json_path.write_text(json.dumps({"header": header, "budget_bytes": budget, "budget_source": source,
                                             "cases": records}, indent=1) + "\n")
        if md_path:
            md_path.write_text(real.markdown(records, header) + "\n")

    for rc in cases:
        case = real.case_of(rc, shrink)
        plan = real.plan_case(rc, case, budget=budget, param_bytes=param_bytes)
        skip = plan.get("skip", "")
        if not skip:
            est = real.estimate_s(case, plan, repeats=repeats, device=device,
                                  rate=done_flops / done_s if done_s > 0 else rate)
            left = budget_s - (time.perf_counter() - t_start) if budget_s else math.inf
            if not cuda and est > real.CPU_LIMIT_S:
                skip = (f"would not finish: ~{est / 60:.0f} min on this CPU (estimated); run it on a GPU "
                        "(benchmarks/gpu/step_cost.sh) or shrink it with --layers/--tokens/--vocab")
            elif est > left:
                skip = f"not started: ~{est:.0f} s estimated, {max(left, 0):.0f} s left of --budget-s {budget_s:g}"
        if skip:
            log(f"{rc.name}: {skip}")
            records.append(real.case_record(rc, case, shrink, plan, device=device, dtype=str(dtype), skipped=skip))
            write()
            continue
        try:
            if key != rc.group_key:  # one model per model and LoRA setting, built for the longest case
                model, key = None, None
                gc.collect()
                if cuda:
                    torch.cuda.empty_cache()
                longest = real.case_of(replace(rc, tokens=max(real.TOKENS)), shrink)
                model, key = build_model(longest, dtype=dtype, device=device), rc.group_key
            log(f"case {rc.name}: {plan['baseline']} against {plan['method']}")
            t0 = time.perf_counter()
            res = run_case(case, repeats=repeats, only=[plan["method"]], log=log, device=device, model=model,
                           baseline=plan["baseline"])
        except Exception as e:  # noqa: BLE001 -- e.g. out of memory: recorded, and the next case runs
            skip = f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            log(f"{rc.name}: {skip}")
            del e
            model, key = None, None
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            records.append(real.case_record(rc, case, shrink, plan, device=device, dtype=str(dtype), skipped=skip))
            write()
            continue
        done_s += time.perf_counter() - t0
        done_flops += real.estimate_s(case, plan, repeats=repeats, device=device, rate=1.0)
        records.append(real.case_record(rc, case, shrink, plan, res, device=device, dtype=str(dtype)))
        r = records[-1]
        log(f"{rc.name}: update ratio {r['update_ratio']}, peak ratio {r['peak_ratio']}")
        write()
    return records


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one small case (under a minute)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per method (default 3; quick 3)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier on a shared machine)")
    ap.add_argument("--methods", default=None, help="comma-separated subset (grpo is always run)")
    ap.add_argument("--cases", default=None, help="comma-separated indices into the full case list (default all)")
    ap.add_argument("--malloc", choices=("retain", "default"), default="default",
                    help="default: the C library's defaults, as `oblr train` runs; retain: keep freed memory in "
                         "the process (glibc mallopt, see retain_freed_memory)")
    ap.add_argument("--device", default="cpu", help="cpu (float32) or cuda (bf16; times between synchronizations)")
    ap.add_argument("--real", default=None, help="real-micro-batch cases of step_cost_real.py: names, shell patterns "
                                                 "or 'all' (instead of the random-init cases)")
    ap.add_argument("--layers", type=int, default=0, help="with --real: truncate the model to K layers (smoke check)")
    ap.add_argument("--tokens", type=int, default=0, help="with --real: T tokens per sequence instead (smoke check)")
    ap.add_argument("--vocab", type=int, default=0, help="with --real: a vocabulary of V instead (smoke check)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="with --real: cases whose estimated time exceeds what is left of this are not started")
    ap.add_argument("--json", type=Path, default=None, help="with --real: the records, rewritten after each case")
    ap.add_argument("--model", default=None,
                    help="a real checkpoint (what model.name_or_path takes, e.g. prepared:smollm2-135m-instruct) "
                         "instead of the random-init cases: full fine-tuning and LoRA, in one run")
    ap.add_argument("--lora-rank", type=int, default=8, help="with --model: the LoRA case's rank (0 = no LoRA case)")
    ap.add_argument("--shape", default=",".join(map(str, MODEL_SHAPE)),
                    help="with --model: prompt tokens, response tokens, N, G (default %(default)s)")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the tables as markdown to FILE")
    args = ap.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: CUDA is not available on this machine (torch {torch.__version__})")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        ap.error(f"--device takes cpu or cuda, got {args.device!r}")
    if not args.real and (args.layers or args.tokens or args.vocab or args.json or args.budget_s):
        ap.error("--layers, --tokens, --vocab, --json and --budget-s go with --real")
    if min(args.layers, args.tokens, args.vocab, args.budget_s) < 0 or 0 < args.tokens < 4:
        ap.error("--layers, --vocab and --budget-s must be >= 0, --tokens 0 or >= 4")
    torch.set_num_threads(args.threads)
    malloc = "C library malloc defaults (as oblr train)"
    if args.malloc == "retain":
        malloc = "freed memory retained (mallopt)" if retain_freed_memory() else "malloc defaults (mallopt unavailable)"
    only = args.methods.split(",") if args.methods else None
    known = {m.name for m in methods()}
    if only and set(only) - known:
        ap.error(f"unknown methods {sorted(set(only) - known)}; known: {sorted(known)}")
    if args.lora_rank < 0:
        ap.error(f"--lora-rank must be >= 0, got {args.lora_rank}")
    try:
        shape = tuple(int(x) for x in args.shape.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        ap.error(f"--shape takes four positive integers P,L,N,G, got {args.shape!r}")
    if args.model and args.quick:
        ap.error("--quick and --model exclude each other")
    cases = model_cases(args.model, args.lora_rank, shape) if args.model else QUICK_CASES if args.quick else FULL_CASES
    if args.cases:
        try:
            cases = [cases[int(i)] for i in args.cases.split(",")]
        except (ValueError, IndexError):
            ap.error(f"--cases takes indices 0..{len(cases) - 1}, got {args.cases!r}")
    repeats = args.repeats or 3
    log = lambda s: print(s, file=sys.stderr, flush=True)
    if args.real:
        import step_cost_real as real

        if args.model or args.quick or args.cases or args.methods:
            ap.error("--real picks its own cases and methods: no --model, --quick, --cases or --methods with it")
        try:
            chosen = real.select(args.real)
        except ValueError as e:
            ap.error(str(e))
        shrink = real.Shrink(args.layers, args.tokens, args.vocab)
        header = (f"step_cost.py --real on {args.device} "
                  f"({torch.cuda.get_device_name(0) if args.device.startswith('cuda') else f'{os.cpu_count()} CPU cores'}), "
                  f"torch {torch.__version__}, {args.threads} thread(s), {malloc}, median of {repeats} interleaved "
                  f"repeats after 1 warm-up" + (f"; truncated: {shrink.as_dict()}" if shrink else ""))
        records = run_real(chosen, shrink, device=args.device, repeats=repeats, budget_s=args.budget_s,
                           json_path=args.json, md_path=args.markdown, header=header, log=log)
        print(real.markdown(records, header))
        return 0
    t0 = time.perf_counter()
    results = []
    for case in cases:
        log(f"case: {case.name}")
        results.append(run_case(case, repeats=repeats, only=only, log=log))
    tables = "\n\n".join(markdown_table(r) for r in results)
    header = (f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPU cores, {malloc}, "
              f"median of {repeats} interleaved repeats after 1 warm-up; total {time.perf_counter() - t0:.0f} s")
    print(header + "\n\n" + tables)
    if args.markdown:
        args.markdown.write_text(header + "\n\n" + tables + "\n")
    if any(r.method == "oblr" and r.times for r in results[0].rows):
        print(f"oblr/grpo step-time ratio: {results[0].ratio('oblr'):.2f}")
    pairs = [("oblr_ckpt", "grpo_ckpt", "with activation checkpointing"),
             ("oblr_recompute", "grpo_ckpt", "with activation checkpointing"),
             ("oblr_recompute", "oblr_ckpt", "recompute against two-pass"),
             ("grpo_ckpt_chunk", "grpo_ckpt", "output layer in chunks"),
             ("oblr_ckpt_chunk", "oblr_ckpt", "output layer in chunks"),
             ("oblr_ckpt_chunk", "grpo_ckpt_chunk", "both chunked"),
             ("oblr_recompute_chunk", "grpo_ckpt_chunk", "both chunked")]
    for res in results:
        names = {r.method for r in res.rows if r.error is None and r.times}
        for num, den, what in pairs:
            if {num, den} <= names:
                t = statistics.median(res.row(num).times) / statistics.median(res.row(den).times)
                mem = res.row(num).peak_bytes / res.row(den).peak_bytes
                print(f"{what}, {res.case.name}: {num}/{den} step time {t:.2f}, peak memory {mem:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
