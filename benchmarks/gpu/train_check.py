"""`oblr train` end to end on a device: each exact-norm engine, the memory planner, LoRA; the first step compared.

    PYTHONPATH=src python3 benchmarks/gpu/train_check.py --device cuda --out runs/train_check   # a lent GPU
    PYTHONPATH=src python3 benchmarks/gpu/train_check.py --device cpu --steps 1 --out x         # the CPU path (tested)

Runs ``python -m oblr train`` (the built-in task and tiny model, no evaluation: ``task.eval_size=0``) once per
variant, each in its own process and run folder under ``--out``:

- ``one_pass``: the defaults (float32, no checkpointing: the one-pass engine);
- ``two_pass``: ``model.activation_checkpointing=true`` (the two-pass engine);
- ``recompute``: the same with ``algorithm.checkpointed_engine=recompute``;
- ``lora_one_pass`` / ``lora_recompute``: LoRA rank 8 (the default targets), without and with checkpointing
  and the recompute engine;
- ``auto_bf16``: ``algorithm.memory_plan=auto``, ``model.dtype=bfloat16``; on CUDA without a budget, so the
  planner's budget is the device's free memory (on CPU ``algorithm.memory_budget_gb=1``). Its ``plan:`` line
  is recorded.

The runs of one group draw the same first rollouts (same seed, same model, same device), so their first
step's logged numbers differ only by the engine's arithmetic: the reward must be equal, and ``snr/V``,
``snr/lr``, ``weights/mean``, ``weights/std``, ``optim/grad_norm`` and ``optim/loss`` must agree with the
group's first variant to ``--rtol`` (relative; ``snr/S`` relative to ``S + V/N``, since S is a
difference; ``snr/lr`` relative to ``optim.lr``). Written: ``<out>/train_check.json`` and each run's log.
Exit status 1 when a run fails or a comparison does not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["task.eval_size=0", "train.save_every=0", "algorithm.lr_schedule=snr"]  # S, V and the SNR lr compared
CKPT = ["model.activation_checkpointing=true"]
LORA = ["model.lora_rank=8"]
#: (name, group, keys): the first variant of a group is the reference of the others in it
VARIANTS = [
    ("one_pass", "full", []),
    ("two_pass", "full", CKPT),
    ("recompute", "full", CKPT + ["algorithm.checkpointed_engine=recompute"]),
    ("lora_one_pass", "lora", LORA),
    ("lora_recompute", "lora", LORA + CKPT + ["algorithm.checkpointed_engine=recompute"]),
    ("auto_bf16", None, ["algorithm.memory_plan=auto", "model.dtype=bfloat16"]),
]
COMPARED = ("snr/V", "snr/lr", "weights/mean", "weights/std", "optim/grad_norm", "optim/loss")
RTOL = 1e-4


def first_step(run_dir: Path) -> dict:
    """The metrics logged for step 1 of a run folder."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("step") == 1:
            return rec
    raise RuntimeError(f"{run_dir}/metrics.jsonl has no step 1")


def compare(ref: dict, got: dict, n_prompts: int, lr: float) -> dict:
    """Relative differences of ``got``'s first step against ``ref``'s (see the module docstring)."""
    out = {k: abs(got[k] - ref[k]) / max(abs(ref[k]), 1e-30) for k in COMPARED if k != "snr/lr"}
    out["snr/lr"] = abs(got["snr/lr"] - ref["snr/lr"]) / lr
    out["snr/S"] = abs(got["snr/S"] - ref["snr/S"]) / max(ref["snr/S"] + ref["snr/V"] / n_prompts, 1e-30)
    out["reward_equal"] = got["train/reward_mean"] == ref["train/reward_mean"]
    return out


def run_variant(name: str, keys: list[str], device: str, steps: int, out: Path) -> dict:
    run_dir = out / name
    argv = [sys.executable, "-m", "oblr", "train", f"model.device={device}", f"train.steps={steps}", *COMMON, *keys]
    if device == "cpu" and "algorithm.memory_plan=auto" in keys:
        argv.append("algorithm.memory_budget_gb=1")  # the free memory is read on CUDA only
    argv += ["--output-dir", str(run_dir)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.log").write_text(" ".join(argv[1:]) + "\n" + log)
    rec = dict(name=name, keys=keys, rc=proc.returncode, seconds=seconds,
               plan=next((ln.split("plan: ", 1)[1] for ln in log.splitlines() if "] plan: " in ln), None))
    if proc.returncode == 0:
        rec["step1"] = first_step(run_dir)
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        rec["lr"], rec["n_prompts"] = float(cfg["optim"]["lr"]), int(cfg["rollout"]["prompts_per_step"])
    else:
        rec["tail"] = log[-2000:]
    print(f"[train_check] {name}: rc {proc.returncode}, {seconds:.1f} s" + (f", plan: {rec['plan']}" if rec["plan"]
                                                                          else ""), flush=True)
    return rec


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default cuda)")
    ap.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    ap.add_argument("--variants", default=None, help="comma-separated subset of: "
                    + ", ".join(v[0] for v in VARIANTS))
    ap.add_argument("--rtol", type=float, default=RTOL, help=f"tolerance of the first-step comparison ({RTOL:g})")
    ap.add_argument("--out", type=Path, required=True, help="folder for the run folders, logs and train_check.json")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        ap.error(f"--device must be cpu, cuda or cuda:N, got {args.device!r}")
    variants = VARIANTS
    if args.variants is not None:
        keep = [v for v in args.variants.split(",") if v]
        unknown = [v for v in keep if v not in {n for n, _, _ in VARIANTS}]
        if unknown or not keep:
            ap.error(f"--variants: unknown {unknown or keep}; known: {', '.join(n for n, _, _ in VARIANTS)}")
        variants = [v for v in VARIANTS if v[0] in keep]
    if args.out.exists() and any(args.out.iterdir()):
        ap.error(f"--out {args.out} is not empty (each run needs a new folder)")
    report = dict(device=args.device, steps=args.steps, rtol=args.rtol, runs=[], comparisons=[])
    refs = {}
    for name, group, keys in variants:
        rec = run_variant(name, keys, args.device, args.steps, args.out)
        report["runs"].append(rec)
        if rec["rc"] == 0 and group is not None:
            if group not in refs:
                refs[group] = rec
            else:
                ref = refs[group]
                diffs = compare(ref["step1"], rec["step1"], ref["n_prompts"], ref["lr"])
                worst = max(v for k, v in diffs.items() if k != "reward_equal")
                ok = diffs["reward_equal"] and worst <= args.rtol
                report["comparisons"].append(dict(ref=ref["name"], run=name, diffs=diffs, max_rel=worst, passed=ok))
                print(f"[train_check] step 1, {name} against {ref['name']}: same reward {diffs['reward_equal']}, "
                      f"max relative difference {worst:.2e} ({'ok' if ok else 'FAILED'} at {args.rtol:g})", flush=True)
        (args.out / "train_check.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    rep = main()
    bad = [r["name"] for r in rep["runs"] if r["rc"]] + [c["run"] for c in rep["comparisons"] if not c["passed"]]
    raise SystemExit(1 if bad else 0)
