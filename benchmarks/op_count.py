"""Operators one update step dispatches, per plan: the launch overhead a GPU pays per operator, counted on CPU.

    PYTHONPATH=src python benchmarks/op_count.py                 # 28 and 36 layers (Qwen3-0.6B/4B depths), tiny width
    PYTHONPATH=src python benchmarks/op_count.py --layers 4 --plans grpo_ckpt,oblr_ckpt
    PYTHONPATH=src python benchmarks/op_count.py --gpu-paths    # the engine's CUDA choices, emulated on CPU
    PYTHONPATH=src python benchmarks/op_count.py --gpu-paths --before 9471b73 \
        --out benchmarks/results/op_count/op_count.md           # and the same counts at another commit's src/

On a GPU a step whose layers are small is bound by the host dispatching operators, not by the device
(Qwen3-0.6B on an H200: docs/performance.md). The count follows the depth; the width changes it only
where a layer takes another product or more chunks, so a model of Qwen3-0.6B's depth with a tiny width
counts nearly what the real one dispatches, in seconds on CPU. Counted:
top-level ``aten::`` operators of one step (``step_methods``' method of the plan, i.e.
:func:`oblr.update.accumulate_policy_gradient`, after one warm-up call) under ``torch.profiler``: those not called from inside another ``aten::`` operator. Views
(reshape, transpose, detach) are counted; they launch no kernel but are dispatched on the host.
``--gpu-paths`` makes the exact-norm engine take the branches it takes on CUDA (each Gram one product,
``strips.gram_strips``; no token windows looked for, which exist on CPU only), so the count is the GPU step's.
At the narrow default width every linear is kept dense (``assembly.keep_dense``); ``--wide`` counts at
Qwen3-0.6B's width, where most keep their factors as at 1024 bf16 tokens (slow on CPU: use few layers and read
the count per layer).
``--before REV`` counts the same plans again with ``src/`` as it is at git revision ``REV`` (extracted with
``git archive`` into a temporary directory, run in a subprocess); ``--out FILE`` writes the table (each plan's
count, its ratio to its GRPO twin -- ``grpo`` for ``oblr``, ``grpo_ckpt`` for the checkpointed plans -- and the
before column) with the command that made it. Operator counts only: no GPU time is measured.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PLANS = ("grpo", "oblr", "grpo_ckpt", "oblr_ckpt", "oblr_recompute")


#: the narrow default shape (counts follow the depth) and Qwen3-0.6B's width (``--wide``): float32 at 32 + 480 tokens
#: keeps the same linears dense as bf16 at 1024 tokens (``assembly.keep_dense`` compares ``4 R C`` with
#: ``T (R + C)`` times the factors' bytes); the ghost/materialise choices are those of 512 tokens
SHAPES = {"narrow": dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=192, response_len=224),
          "wide": dict(hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, response_len=480)}


def count(layers: int = 28, plans=PLANS, top: int = 8, gpu_paths: bool = False, wide: bool = False) -> dict[str, dict]:
    """{plan: {"total": n, "top": [(op, n), ...]}} for ``step_methods``' method of each plan on a random-init
    Qwen3-shaped model of ``layers`` layers (:data:`SHAPES`: narrow, hidden 64, MLP 192, 4/2 heads of 16, 32 + 224
    tokens; ``wide``: Qwen3-0.6B's width, 32 + 480 tokens), vocab 512, tied, 2 prompts x 2 samples. ``gpu_paths``:
    the engine's CUDA branches (module docstring): one Gram product per row, and no token windows looked for
    (``StoredBook._add`` looks for them on CPU only)."""
    from oblr.gradnorm import stored, strips

    # the windows' hook in StoredBook._add: trim_windows (returns the contribution), or token_windows at a --before
    # revision that predates it (returns the windows)
    name, off = ("trim_windows", lambda c: c) if hasattr(stored, "trim_windows") else ("token_windows", lambda c: None)
    saved = strips.GRAM_STRIPS, getattr(stored, name)
    if gpu_paths:
        strips.GRAM_STRIPS = strips.GRAM_STRIPS_OTHER
        setattr(stored, name, off)
    try:
        return _count(layers, plans, top, SHAPES["wide" if wide else "narrow"])
    finally:
        strips.GRAM_STRIPS = saved[0]
        setattr(stored, name, saved[1])


def _count(layers: int, plans, top: int, shape: dict) -> dict[str, dict]:
    from step_methods import Case, Ctx, build_batch, build_model, methods

    case = Case(layers=layers, vocab=512, prompt_len=32, n_prompts=2, group_size=2, tied=True, **shape)
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


#: the plan each plan's count is divided by: the GRPO step with the same checkpointing
TWIN = {"grpo": "grpo", "oblr": "grpo", "grpo_ckpt": "grpo_ckpt", "oblr_ckpt": "grpo_ckpt",
        "oblr_recompute": "grpo_ckpt"}


def counts_at(rev: str, layers: list[int], plans, gpu_paths: bool, wide: bool = False) -> dict[int, dict[str, dict]]:
    """:func:`count` for each of ``layers`` with ``src/`` as at git revision ``rev`` (``git archive`` into a temporary
    directory; this script run there in a subprocess, ``PYTHONPATH`` pointing at it)."""
    import json
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as d:
        tar = subprocess.run(["git", "archive", rev, "src"], cwd=root, capture_output=True, check=False)
        if tar.returncode != 0:
            raise SystemExit(f"op_count.py: --before {rev}: git archive failed: {tar.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", d], input=tar.stdout, check=True)
        out = Path(d) / "counts.json"
        cmd = [sys.executable, __file__, "--layers", ",".join(map(str, layers)), "--plans", ",".join(plans),
               "--json", str(out)] + (["--gpu-paths"] if gpu_paths else []) + (["--wide"] if wide else [])
        env = {**__import__("os").environ, "PYTHONPATH": str(Path(d) / "src")}
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        return {int(k): v for k, v in json.loads(out.read_text()).items()}


def table(res: dict[int, dict[str, dict]], before: dict[int, dict[str, dict]] | None = None) -> str:
    """Markdown: per layer count and plan, the operators, the ratio to the GRPO twin (:data:`TWIN`), the before
    count and ratio when given, and the most dispatched operators."""
    head = "| layers | plan | operators | / GRPO twin |" + (" before | before / twin |" if before else "") \
        + " most dispatched |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for L, by_plan in res.items():
        for plan, r in by_plan.items():
            twin = by_plan.get(TWIN[plan])
            ratio = f"{r['total'] / twin['total']:.2f}" if twin else ""
            cells = [str(L), plan, f"{r['total']:,}", ratio]
            if before:
                b = before[L][plan]
                bt = before[L].get(TWIN[plan])
                cells += [f"{b['total']:,}", f"{b['total'] / bt['total']:.2f}" if bt else ""]
            cells.append(", ".join(f"{op.removeprefix('aten::')} {n}" for op, n in r["top"]))
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _layers(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--layers must be >= 1 (a comma-separated list), got {text!r}")
    return out


def main(argv=None) -> dict[int, dict[str, dict]]:
    """Counts ``{layers: {plan: {"total", "top"}}}``; printed, and written as markdown with ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=_layers, default=[28, 36], help="comma-separated depths (default 28,36)")
    ap.add_argument("--plans", default=",".join(PLANS), help=f"comma-separated, of {', '.join(PLANS)}")
    ap.add_argument("--gpu-paths", action="store_true", help="the exact-norm engine's CUDA branches, emulated on CPU")
    ap.add_argument("--wide", action="store_true", help="Qwen3-0.6B's width, 32 + 480 float32 tokens (slow)")
    ap.add_argument("--before", metavar="REV", help="also count with src/ as at this git revision")
    ap.add_argument("--out", type=Path, help="write the table, with this command, as markdown to this file")
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)  # --before's subprocess hands its counts back
    args = ap.parse_args(argv)
    plans = [p for p in args.plans.split(",") if p]
    bad = [p for p in plans if p not in PLANS]
    if bad or not plans:
        ap.error(f"--plans: unknown {bad or plans}; known: {', '.join(PLANS)}")
    res = {L: count(L, plans, gpu_paths=args.gpu_paths, wide=args.wide) for L in args.layers}
    if args.json:
        import json

        args.json.write_text(json.dumps(res))
        return res
    before = counts_at(args.before, args.layers, plans, args.gpu_paths, args.wide) if args.before else None
    for L, by_plan in res.items():
        for plan, r in by_plan.items():
            was = f" (before: {before[L][plan]['total']})" if before else ""
            print(f"{L:3d} layers {plan:15s} {r['total']:6d} operators{was}; most dispatched: "
                  + ", ".join(f"{op.removeprefix('aten::')} {n}" for op, n in r["top"]))
    if args.out:
        cmd = "PYTHONPATH=src python benchmarks/op_count.py " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            "# Operators per update step, counted on CPU\n\n"
            f"Written by `{cmd.strip()}`.\n\n"
            "Top-level `aten::` operators of one `oblr.update.accumulate_policy_gradient` step (after a warm-up call) on "
            "a random-init Qwen3-shaped model of the given depth ("
            + ("Qwen3-0.6B's width: hidden 1024, MLP 3072, 16/8 heads of 128; 32 + 480 float32 tokens, which keep the "
               "same linears dense as 1024 bf16 tokens" if args.wide else "hidden 64, MLP 192, 4/2 heads of 16; 32 + 224 "
               "tokens: every linear kept dense")
            + "; vocab 512, tied; 2 prompts x 2 samples)"
            + (", the exact-norm engine on its CUDA branches (`--gpu-paths`)" if args.gpu_paths else "")
            + ". `/ GRPO twin`: divided by the GRPO step with the same checkpointing (`grpo` for `oblr`, `grpo_ckpt` for "
            "`oblr_ckpt` and `oblr_recompute`)"
            + (f"; `before`: the same count with `src/` as at `{args.before}`" if args.before else "")
            + ". Operator counts only: GPU times are not measured here.\n\n" + table(res, before))
    return res


if __name__ == "__main__":
    main()
