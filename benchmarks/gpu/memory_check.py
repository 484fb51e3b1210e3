"""Issue 26 on one GPU: exact OBLR-PO under activation checkpointing, and measured step peaks against the memory model.

    PYTHONPATH=src python3 benchmarks/gpu/memory_check.py --out memory_check.json     # CUDA: the full check
    PYTHONPATH=src python3 benchmarks/gpu/memory_check.py --dry-run --out x.json      # = --device cpu --tiny (tested)

1. **exactness** -- on a small Qwen3-shaped model (``EXACT_CASE``: 4 layers, hidden 256, vocab 4096, N = 3
   prompts x G = 4, float32) with Hugging Face non-reentrant activation checkpointing on, one update
   (:func:`oblr.update.accumulate_policy_gradient`, baseline ``oblr``, SNR on) with the two-pass engine
   (``norms_method=auto``: :class:`oblr.gradnorm.TwoPassBookKeeper`), and with the recompute engine
   (:class:`oblr.gradnorm.RecomputeBookKeeper`, ``algorithm.checkpointed_engine=recompute``), against the loop reference
   (``norms_method=loop``: one backward per sequence), whole batch and with micro-batches of one group.
   Compared, as max relative error: ``w_i``, advantages, ``.grad``, per-prompt norms, V; S relative to
   ``||gbar||^2 = S + V/N`` (S is the difference ``||gbar||^2 - V/N`` and loses the digits that cancel; the
   plain relative errors are written too); the SNR learning rate ``eta_max * snr_factor(S, V, N)`` relative
   to ``eta_max``. Passes at 1e-5 (float32). The same with the output layer in chunks of 16 positions
   (``model.logit_chunk_tokens``; 4 with ``--tiny``) against the same loop reference.
2. **memory** -- random-init models built from Qwen3 configs (``oblr.memory_model.QWEN3``), bf16, one
   micro-batch of ``--seqs`` sequences (2 prompts x 2) of 32 + 992 = 1024 tokens: Qwen3-0.6B shape with
   ``grpo``, ``oblr`` (one pass), ``grpo_ckpt``, ``oblr_ckpt`` (two-pass) and ``oblr_recompute`` (recompute
   engine; both checkpointing on); Qwen3-4B shape with the checkpointed plans only; both also with the output
   layer in chunks of ``LOGIT_CHUNK`` (``grpo_ckpt_chunk``, ``oblr_ckpt_chunk``, ``oblr_recompute_chunk``). Measured: ``torch.cuda.max_memory_allocated`` during the
   gradient accumulation (gradients created inside it, no optimizer) minus what was allocated before;
   predicted: :func:`oblr.memory_model.step_peak_bytes` (bf16 activations and gradients). On CPU the peak
   is torch's CPU allocator's, as ``benchmarks/memory.py`` measures it.

Options for a lent GPU's short time: ``--models`` (shapes of ``oblr.memory_model.QWEN3``) and ``--plans`` pick
the cases, ``--response-len`` the length; ``--time-repeats N`` adds each plan's median step time over N
interleaved calls and the ratio to its GRPO twin; ``--fp32-compare`` runs each OBLR-PO plan also with the norm
engine's products in full float32 instead of TF32 (time and differences); ``--profile`` adds the top operators
of one call; ``--lora-rank R`` puts LoRA adapters of rank R on the memory cases' models. The results file is rewritten after each case, so a run cut by a time limit keeps what it did.
Run on one H200 (``bash benchmarks/gpu/scale_checks.sh``): ``benchmarks/results/gpu/h200_scale/summary.md``.

The tiny CPU mode runs the same code on small shapes so that the script cannot rot; its memory rows are
not a test of the model at scale. Needs torch, transformers and this checkout's ``src/`` on ``PYTHONPATH``;
no network, no weights. Everything is written as JSON to ``--out`` and summarised on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_methods import Case, build_batch, build_model  # noqa: E402

from oblr import memory_model as mm  # noqa: E402

RTOL = 1e-5
ETA_MAX = 1e-3
EXACT_CASE = Case(hidden=256, layers=4, vocab=4096, prompt_len=32, response_len=64, n_prompts=3, group_size=4,
                  heads=4, kv_heads=2, head_dim=64, intermediate=768, tied=True)
EXACT_TINY = Case(hidden=64, layers=2, vocab=256, prompt_len=6, response_len=10, n_prompts=3, group_size=4)
CKPT_PLANS = ("grpo_ckpt", "oblr_ckpt", "oblr_recompute")
#: the checkpointed plans with the output layer in chunks of LOGIT_CHUNK positions (model.logit_chunk_tokens)
CHUNK_PLANS = ("grpo_ckpt_chunk", "oblr_ckpt_chunk", "oblr_recompute_chunk")
LOGIT_CHUNK = 512
TINY_CHUNK = 8  # --tiny: T = 32, so several chunks as well
# (label, shape, plans); tiny: small shapes of the same structure
MEMORY_CASES = [("Qwen3-0.6B", mm.QWEN3["Qwen3-0.6B"], mm.PLANS + CHUNK_PLANS),
                ("Qwen3-4B", mm.QWEN3["Qwen3-4B"], CKPT_PLANS + CHUNK_PLANS)]
MEMORY_TINY = [("tiny tied", mm.Shape(2, 64, 192, 4, 2, 16, 512, True), mm.PLANS),
               ("tiny untied", mm.Shape(2, 96, 288, 4, 2, 24, 512, False), CKPT_PLANS + CHUNK_PLANS)]


def case_of(shape: mm.Shape, prompt_len: int, response_len: int, n_prompts: int, group_size: int) -> Case:
    return Case(hidden=shape.hidden, layers=shape.layers, vocab=shape.vocab, prompt_len=prompt_len,
                response_len=response_len, n_prompts=n_prompts, group_size=group_size, tied=shape.tied,
                heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim, intermediate=shape.intermediate)


def _batch(case: Case, device: torch.device):
    batch, rewards = build_batch(case)
    return SimpleNamespace(**{k: v.to(device) for k, v in vars(batch).items()}), rewards.to(device)


def _checkpointing(model, on: bool) -> None:
    from oblr.models import disable_activation_checkpointing, enable_activation_checkpointing

    (enable_activation_checkpointing if on else disable_activation_checkpointing)(model)


def _update(model, batch, rewards, case: Case, **kw):
    from oblr.update import UpdateSettings, accumulate_policy_gradient

    for p in model.parameters():
        p.grad = None
    settings = UpdateSettings(aggregation="seq_sum_const", max_len=case.response_len, **kw)
    return accumulate_policy_gradient(model, batch, rewards, settings)


def _rel(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def check_exactness(case: Case, device: torch.device, chunk: int = 16) -> dict:
    """The two-pass and the recompute engines vs the loop, checkpointing on, float32; whole batch and
    micro-batches of one group; whole and chunked logits."""
    from oblr.distributed.step import step_statistics
    from oblr.snr import snr_factor

    model = build_model(case, dtype=torch.float32, device=str(device))
    _checkpointing(model, True)
    batch, rewards = _batch(case, device)
    params = [p for p in model.parameters() if p.requires_grad]
    out = {}
    for micro in (0, 1):
        runs = {}
        for method, c, engine in (("loop", 0, "two_pass"), ("auto", 0, "two_pass"), ("auto_chunked", chunk, "two_pass"),
                                  ("recompute", 0, "recompute"), ("recompute_chunked", chunk, "recompute")):
            res = _update(model, batch, rewards, case, baseline="oblr", norms_method=method.split("_")[0].replace(
                "recompute", "auto"), micro_batch_groups=micro, logit_chunk_tokens=c, checkpointed_engine=engine)
            st = step_statistics(params, res.per_prompt_sq_norms, float64=False)[1]  # as oblr train's step
            lr = ETA_MAX * snr_factor(float(st.S), float(st.V), case.n_prompts)
            runs[method] = dict(w=res.estimate.weights.detach(), adv=res.advantages, gk=res.per_prompt_sq_norms,
                                grad=torch.cat([p.grad.reshape(-1).float() for p in params]),
                                S=st.S, V=st.V, lr=lr)
        ref = runs["loop"]
        for name, tag in (("auto", ""), ("auto_chunked", f", output layer in chunks of {chunk}"),
                          ("recompute", ", recompute engine"),
                          ("recompute_chunked", f", recompute engine, output layer in chunks of {chunk}")):
            got = runs[name]
            errs = {k: _rel(got[k], ref[k]) for k in ("w", "adv", "grad", "gk")}
            # S = ||gbar||^2 - V/N is a difference: its error is measured on the scale of ||gbar||^2 = S + V/N,
            # and the learning rate's on the scale of eta_max (the factor S / (S + V/N) lies in [0, 1])
            scale = float(ref["S"] + ref["V"] / case.n_prompts)
            errs["S"] = abs(float(got["S"] - ref["S"])) / scale
            errs["V"] = _rel(got["V"], ref["V"])
            errs["lr"] = abs(got["lr"] - ref["lr"]) / ETA_MAX
            raw = {k: _rel(got[k], ref[k]) for k in ("S", "lr")}
            out[f"micro_batch_groups={micro}{tag}"] = dict(
                errors=errs, plain_relative_errors=raw, max_error=max(errs.values()), passed=max(errs.values()) <= RTOL,
                values=dict(S=float(ref["S"]), V=float(ref["V"]), lr=ref["lr"]))
    return out


def _peak_cpu(fn) -> float:
    from step_cost import _peak_bytes

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return _peak_bytes(prof)


def _peak_cuda(fn, device: torch.device) -> tuple[float, float]:
    """(peak allocated above what was allocated before, the allocator's peak reserved bytes: the process's)"""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (float(torch.cuda.max_memory_allocated(device) - before), float(torch.cuda.max_memory_reserved(device)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fp32_products(step, params, device: torch.device, repeats: int) -> dict:
    """One OBLR-PO step with the engine's TF32 products (the default for a half-precision model on CUDA) and
    the same step with full float32 products (``precision.TF32_HALF_PRODUCTS = False``): their relative
    differences (w_i, per-prompt norms, the gradient) and, with ``repeats``, the median times."""
    from oblr.gradnorm import precision

    out, runs = {}, {}
    for name, flag in (("tf32", True), ("fp32", False)):
        precision.TF32_HALF_PRODUCTS = flag
        try:
            ts = []
            step()  # a warm-up per setting: its products take other kernels
            for _ in range(max(1, repeats)):
                for p in params:
                    p.grad = None
                _sync(device)
                t0 = time.perf_counter()
                res = step()
                _sync(device)
                ts.append(time.perf_counter() - t0)
            runs[name] = dict(w=res.estimate.weights.detach().float(), gk=res.per_prompt_sq_norms.float(),
                              grad=[p.grad.clone() for p in params])  # model dtype: no float64 copy of 4B
            out[f"{name}_seconds"] = statistics.median(ts)
        finally:
            precision.TF32_HALF_PRODUCTS = True
    for p in params:
        p.grad = None
    out.update({f"{k}_rel_diff": _rel(runs["tf32"][k], runs["fp32"][k]) for k in ("w", "gk")})
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(runs["tf32"]["grad"], runs["fp32"]["grad"]))
    out["grad_rel_diff"] = diff / max(max(float(b.float().abs().max()) for b in runs["fp32"]["grad"]), 1e-300)
    out["fp32_over_tf32_time"] = out["fp32_seconds"] / out["tf32_seconds"]
    return out


def _profile(step, device: torch.device, top: int = 12) -> str:
    """One call of ``step`` under torch.profiler: the ``top`` operators by device time (CPU time on CPU)."""
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        step()
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=60)


def check_memory(label: str, shape: mm.Shape, plans, case: Case, device: torch.device,
                 logit_chunk: int = LOGIT_CHUNK, time_repeats: int = 0, fp32_compare: bool = False,
                 profile: bool = False, lora_rank: int = 0) -> list[dict]:
    """Measured step peak above the resident model and batch vs ``memory_model.step_peak_bytes`` (bf16);
    with ``time_repeats``, each plan's step time as well: the median of that many calls, the plans
    interleaved (plan a, plan b, ..., then again), the device synchronised around each call, after the
    peak-measuring call that served as the warm-up. ``fp32_compare``: each OBLR-PO plan also with the
    norm engine's products in full float32 (:func:`_fp32_products`); ``profile``: the top operators of one
    call of each OBLR-PO plan. ``lora_rank`` > 0: LoRA adapters of that rank on ``memory_model.LORA_TARGETS``
    (bf16, as the model; only they train), the rows labelled ``<label>+LoRA<rank>``; the memory model prices
    LoRA for ``oblr_recompute`` only (``lora_modelled``), the other plans with the full model's gradients."""
    model = build_model(case, dtype=torch.bfloat16, device=str(device))
    n = sum(p.numel() for p in model.parameters())
    if n != mm.n_params(shape):
        raise RuntimeError(f"{label}: memory model counts {mm.n_params(shape)} parameters, the model has {n}")
    if lora_rank:
        from oblr.models import wrap_lora

        model = wrap_lora(model, rank=lora_rank, alpha=2 * lora_rank, targets=list(mm.LORA_TARGETS)).to(torch.bfloat16)
        label = f"{label}+LoRA{lora_rank}"
    batch, rewards = _batch(case, device)
    B, T = case.n_prompts * case.group_size, case.prompt_len + case.response_len
    rows, steps = [], {}
    for plan in plans:
        chunk = logit_chunk if plan.endswith("_chunk") else 0
        model_plan = plan.removesuffix("_chunk")
        base = "grpo" if plan.startswith("grpo") else "oblr"
        engine = "recompute" if model_plan == "oblr_recompute" else "two_pass"
        steps[plan] = (model_plan.endswith(("_ckpt", "_recompute")),
                       partial(_update, model, batch, rewards, case, baseline=base, need_snr=base == "oblr",
                               logit_chunk_tokens=chunk, checkpointed_engine=engine))
        _checkpointing(model, steps[plan][0])
        for p in model.parameters():
            p.grad = None
        predicted = mm.step_peak_bytes(shape, model_plan, B, T, act_bytes=2, grad_bytes=2, logit_chunk=chunk,
                                       head_trainable=not lora_rank, lora_rank=lora_rank, groups=case.n_prompts)
        t0 = time.perf_counter()
        try:
            if device.type == "cuda":
                measured, reserved = _peak_cuda(steps[plan][1], device)
            else:
                measured, reserved = _peak_cpu(steps[plan][1]), None
        except torch.OutOfMemoryError:  # recorded, and the next plan runs: one case does not end the check
            del steps[plan]
            for p in model.parameters():
                p.grad = None
            gc.collect()
            torch.cuda.empty_cache()
            print(f"  {label} {plan}: out of memory (predicted {predicted / 2**30:.3f} GiB)", file=sys.stderr, flush=True)
            rows.append(dict(model=label, plan=plan, batch=B, tokens=T, out_of_memory=True, predicted_bytes=predicted))
            continue
        seconds = time.perf_counter() - t0
        rows.append(dict(model=label, plan=plan, batch=B, tokens=T, measured_bytes=measured,
                         predicted_bytes=predicted, ratio=measured / predicted, seconds=seconds))
        if lora_rank:
            rows[-1].update(lora_rank=lora_rank, lora_modelled=model_plan == "oblr_recompute")
        if reserved is not None:
            rows[-1]["process_reserved_peak_bytes"] = reserved
        print(f"  {label} {plan}: measured {measured / 2**30:.3f} GiB, predicted {predicted / 2**30:.3f} GiB "
              f"({measured / predicted:.3f})", file=sys.stderr, flush=True)
        for p in model.parameters():
            p.grad = None
    times = {plan: [] for plan in steps}
    for _ in range(time_repeats):
        for plan in steps:
            ckpt, step = steps[plan]
            _checkpointing(model, ckpt)
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times[plan].append(time.perf_counter() - t0)
            for p in model.parameters():
                p.grad = None
    for row in (r for r in rows if r["plan"] in steps) if time_repeats else ():
        row["step_seconds"] = statistics.median(times[row["plan"]])
        row["step_seconds_all"] = times[row["plan"]]
        twin = "grpo" + row["plan"].removeprefix("oblr").replace("_recompute", "_ckpt")  # oblr_ckpt_chunk -> grpo_ckpt_chunk
        if row["plan"].startswith("oblr") and twin in times:
            row["time_vs_grpo"] = row["step_seconds"] / statistics.median(times[twin])
    params = [p for p in model.parameters() if p.requires_grad]
    for row in rows:
        if not row["plan"].startswith("oblr") or not (fp32_compare or profile) or row["plan"] not in steps:
            continue
        ckpt, step = steps[row["plan"]]
        _checkpointing(model, ckpt)
        if fp32_compare:
            row["norm_products"] = _fp32_products(step, params, device, time_repeats)
            print(f"  {label} {row['plan']}: {row['norm_products']}", file=sys.stderr, flush=True)
        if profile:
            row["profile"] = _profile(step, device)
            print(f"  {label} {row['plan']} profile:\n{row['profile']}", file=sys.stderr, flush=True)
        for p in params:
            p.grad = None
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results file")
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU path the tests run)")
    ap.add_argument("--dry-run", action="store_true", help="= --device cpu --tiny")
    ap.add_argument("--response-len", type=int, default=None, help="response tokens of the memory cases "
                                                                      "(default 992, i.e. T = 1024; tiny 30)")
    ap.add_argument("--skip", default="", help="comma-separated: exactness, memory")
    ap.add_argument("--models", default=None, help="comma-separated Qwen3 shapes of oblr.memory_model.QWEN3 for the "
                                                   "memory check (default: Qwen3-0.6B,Qwen3-4B; not with --tiny)")
    ap.add_argument("--plans", default=None, help="comma-separated plans to keep (default: each model's plans: "
                                                  f"{', '.join(mm.PLANS + CHUNK_PLANS)})")
    ap.add_argument("--time-repeats", type=int, default=0, help="also time each plan: median of this many "
                                                                "interleaved calls (default 0: peaks only)")
    ap.add_argument("--fp32-compare", action="store_true", help="each OBLR-PO plan also with the norm engine's "
                    "products in full float32 instead of TF32: differences and times")
    ap.add_argument("--profile", action="store_true", help="the top operators of one call of each OBLR-PO plan")
    ap.add_argument("--lora-rank", type=int, default=0, help="memory cases with LoRA adapters of this rank on "
                    f"{', '.join(mm.LORA_TARGETS)} (default 0: full fine-tuning)")
    ap.add_argument("--gram-strips", type=int, default=None, help="strips per symmetric Gram on this run's device "
                    "(oblr.gradnorm.strips.gram_strips; 1: one full product; default: the engine's own, 16 on CPU, 1 on CUDA)")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    if args.device not in ("auto", "cuda", "cpu"):
        ap.error(f"--device must be auto, cuda or cpu, got {args.device!r}")
    skip = {s for s in args.skip.split(",") if s}
    if skip - {"exactness", "memory"}:
        ap.error(f"--skip takes exactness and/or memory, got {sorted(skip)}")
    if args.response_len is not None and args.response_len < 1:
        ap.error("--response-len must be >= 1")
    if args.time_repeats < 0:
        ap.error("--time-repeats must be >= 0")
    if args.lora_rank < 0:
        ap.error("--lora-rank must be >= 0")
    if args.gram_strips is not None and args.gram_strips < 1:
        ap.error("--gram-strips must be >= 1")
    cases = MEMORY_TINY if args.tiny else MEMORY_CASES
    if args.models is not None:
        if args.tiny:
            ap.error("--models names full-size shapes; it does not go with --tiny or --dry-run")
        names = [m for m in args.models.split(",") if m]
        unknown = [m for m in names if m not in mm.QWEN3]
        if unknown or not names:
            ap.error(f"--models: unknown {unknown or names}; known: {', '.join(mm.QWEN3)}")
        cases = [(m, mm.QWEN3[m], mm.PLANS + CHUNK_PLANS) for m in names]
    if args.plans is not None:
        keep = [p for p in args.plans.split(",") if p]
        unknown = [p for p in keep if p not in mm.PLANS + CHUNK_PLANS]
        if unknown or not keep:
            ap.error(f"--plans: unknown {unknown or keep}; known: {', '.join(mm.PLANS + CHUNK_PLANS)}")
        cases = [(label, shape, tuple(p for p in plans if p in keep)) for label, shape, plans in cases]
        cases = [c for c in cases if c[2]]
    dev_name = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if dev_name == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --dry-run for the CPU path)")
    if dev_name == "cpu" and not args.tiny:
        ap.error("the full-size check needs a CUDA GPU; on CPU run --tiny (or --dry-run)")
    device = torch.device(dev_name)
    if dev_name == "cuda":  # the exactness check is float32: no TF32 products
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    from oblr.gradnorm import strips

    if args.gram_strips is not None:  # for this process only, on the device it runs on: an A/B of the strips
        setattr(strips, "GRAM_STRIPS" if dev_name == "cpu" else "GRAM_STRIPS_OTHER", args.gram_strips)
    torch.manual_seed(0)
    report = dict(gram_strips=strips.gram_strips(dev_name), device=torch.cuda.get_device_name(device) if dev_name == "cuda" else "cpu",
                  torch=torch.__version__, tiny=args.tiny, rtol=RTOL)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if "exactness" not in skip:
        case = EXACT_TINY if args.tiny else EXACT_CASE
        log(f"exactness: {case.name}")
        report["exactness"] = dict(case=case.name, **check_exactness(case, device, chunk=4 if args.tiny else 16))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    if "memory" not in skip:
        resp = args.response_len or (30 if args.tiny else 992)
        report["memory"] = []
        for label, shape, plans in cases:
            case = case_of(shape, 2 if args.tiny else 32, resp, 2, 2)
            log(f"memory: {label}, T = {case.prompt_len}+{resp}, plans {', '.join(plans)}")
            report["memory"] += check_memory(label, shape, plans, case, device, TINY_CHUNK if args.tiny else LOGIT_CHUNK,
                                             time_repeats=args.time_repeats, fp32_compare=args.fp32_compare,
                                             profile=args.profile, lora_rank=args.lora_rank)
            args.out.parent.mkdir(parents=True, exist_ok=True)  # what is done so far survives a later crash
            args.out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=float) + "\n")
    for k, v in report.get("exactness", {}).items():
        if isinstance(v, dict):
            print(f"exactness {k}: max rel error {v['max_error']:.2e} ({'ok' if v['passed'] else 'FAILED'} at {RTOL:g})")
    for r in report.get("memory", []):
        if r.get("out_of_memory"):
            print(f"memory {r['model']} {r['plan']}: B={r['batch']} T={r['tokens']} out of memory, predicted "
                  f"{r['predicted_bytes'] / 2**30:.3f} GiB")
            continue
        print(f"memory {r['model']} {r['plan']}: B={r['batch']} T={r['tokens']} measured {r['measured_bytes'] / 2**30:.3f} "
              f"GiB, predicted {r['predicted_bytes'] / 2**30:.3f} GiB, measured/predicted {r['ratio']:.3f}"
              + (f", step {r['step_seconds']:.3f} s" if "step_seconds" in r else "")
              + (f" ({r['time_vs_grpo']:.2f}x its GRPO twin)" if "time_vs_grpo" in r else "")
              + (f"; norm products in float32: {r['norm_products']['fp32_over_tf32_time']:.2f}x the time, w_i "
                 f"differs by {r['norm_products']['w_rel_diff']:.1e}" if "norm_products" in r else ""))
    return report


if __name__ == "__main__":
    rep = main()
    raise SystemExit(0 if all(v["passed"] for v in rep.get("exactness", {}).values() if isinstance(v, dict)) else 1)
