"""Operators one update step dispatches, per plan: the launch overhead a GPU pays per operator, counted on CPU.

    PYTHONPATH=src python benchmarks/op_count.py                 # 28 layers (Qwen3-0.6B's depth), tiny width
    PYTHONPATH=src python benchmarks/op_count.py --layers 4 --plans grpo_ckpt,oblr_ckpt
    PYTHONPATH=src python benchmarks/op_count.py --gpu-paths    # the engine's CUDA choices, emulated on CPU

On a GPU a step whose layers are small is bound by the host dispatching operators, not by the device
(Qwen3-0.6B on an H200: docs/performance.md). The count follows the depth; the width changes it only
where a layer takes another product or more chunks, so a model of Qwen3-0.6B's depth with a tiny width
counts nearly what the real one dispatches, in seconds on CPU. Counted:
top-level ``aten::`` operators of one step (``step_methods``' method of the plan, i.e.
:func:`oblr.update.accumulate_policy_gradient`, after one warm-up call) under ``torch.profiler``: those not called from inside another ``aten::`` operator. Views
(reshape, transpose, detach) are counted; they launch no kernel but are dispatched on the host.
``--gpu-paths`` makes the exact-norm engine take the branches it takes on CUDA (each Gram one product,
``strips.gram_strips``; no token windows, which exist on CPU only), so the count is the GPU step's.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PLANS = ("grpo", "oblr", "grpo_ckpt", "oblr_ckpt", "oblr_recompute")


def count(layers: int = 28, plans=PLANS, response_len: int = 224, top: int = 8, gpu_paths: bool = False) -> dict[str, dict]:
    """{plan: {"total": n, "top": [(op, n), ...]}} for ``step_methods``' method of each plan on a random-init
    Qwen3-shaped model of ``layers`` layers (hidden 64, MLP 192, 4/2 heads of 16, vocab 512, tied), 2 prompts
    x 2 samples, 32 + ``response_len`` tokens. ``gpu_paths``: the engine's CUDA branches (module docstring)."""
    from oblr.gradnorm import strips, windows

    saved = strips.GRAM_STRIPS, windows.TRIM_MIN_FRACTION
    if gpu_paths:  # one Gram product as on CUDA; token windows never pay (they are a CPU path)
        strips.GRAM_STRIPS, windows.TRIM_MIN_FRACTION = strips.GRAM_STRIPS_OTHER, 2.0
    try:
        return _count(layers, plans, response_len, top)
    finally:
        strips.GRAM_STRIPS, windows.TRIM_MIN_FRACTION = saved


def _count(layers: int, plans, response_len: int, top: int) -> dict[str, dict]:
    from step_methods import Case, Ctx, build_batch, build_model, methods

    case = Case(hidden=64, layers=layers, vocab=512, prompt_len=32, response_len=response_len, n_prompts=2,
                group_size=2, heads=4, kv_heads=2, head_dim=16, intermediate=192, tied=True)
    model = build_model(case)
    batch, rewards = build_batch(case)
    ctx = Ctx(model, batch, rewards, max_len=case.response_len)
    by_name = {m.name: m for m in methods()}
    out = {}
    for plan in plans:
        m = by_name[plan]
        if m.setup:
            m.setup(ctx)
        try:
            m.fn(ctx)  # warm-up
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                m.fn(ctx)
        finally:
            if m.teardown:
                m.teardown(ctx)
        for prm in ctx.params():
            prm.grad = None
        ops = collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::")
                                  and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
        out[plan] = dict(total=sum(ops.values()), top=ops.most_common(top))
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, of {', '.join(PLANS)}")
    ap.add_argument("--gpu-paths", action="store_true", help="the exact-norm engine's CUDA branches, emulated on CPU")
    args = ap.parse_args(argv)
    plans = [p for p in args.plans.split(",") if p]
    bad = [p for p in plans if p not in PLANS]
    if bad or not plans:
        ap.error(f"--plans: unknown {bad or plans}; known: {', '.join(PLANS)}")
    if args.layers < 1:
        ap.error("--layers must be >= 1")
    res = count(args.layers, plans, gpu_paths=args.gpu_paths)
    for plan, r in res.items():
        print(f"{plan:10s} {r['total']:6d} operators; most dispatched: "
              + ", ".join(f"{op.removeprefix('aten::')} {n}" for op, n in r["top"]))
    return res


if __name__ == "__main__":
    main()
