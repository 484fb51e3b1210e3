"""A short OBLR-PO vs GRPO LoRA run on a real checkpoint (default: SmolLM2-135M-Instruct), and its reading.

    oblr models prepare smollm2-135m-instruct
    OMP_NUM_THREADS=1 python benchmarks/real_model_rl.py                  # both runs in sequence, then the report
    python benchmarks/real_model_rl.py --skip-train                       # the report from finished run folders

Both runs use one config (``--config``, default ``configs/real-model/smollm2-arith-chat-lora.yaml``: LoRA,
one-operation arithmetic in the model's chat template, free-form answers graded like GSM8K, 20 steps of
4 prompts x 4 samples) and the same seed, so the same prompts per step; they differ only in the method
(:data:`METHODS`):

- ``oblr-snr``: ``algorithm.baseline=oblr algorithm.lr_schedule=snr`` (OBLR-PO as shipped; ``optim.lr`` is
  eta_max of the SNR rule);
- ``grpo-const``: ``algorithm.baseline=grpo algorithm.lr_schedule=constant`` (GRPO at the fixed ``optim.lr``).

Each run is ``oblr train`` in a subprocess with its folder at ``--runs/<method>``, in sequence, or
``--jobs 2`` at once (interleaved by the OS: on a loaded machine the wall time of each suffers alike); a
folder holding ``summary.json`` is finished and not run again. Both runs evaluate the held-out set at step
0 with the same weights, problems and seed, so their start accuracies must agree (a check of the setup). The report reads each folder's ``metrics.jsonl`` (per step:
``train/reward_mean``, ``optim/lr``, ``train/response_length_mean``, ``time/step``, and for the SNR rule
``snr/S``, ``snr/V``, ``snr/factor``; the held-out
``eval/accuracy_greedy`` and ``eval/accuracy_sampled`` at the start and the end) and writes
``<out>/results.json``, ``<out>/summary.md`` and a PNG of the reward and lr curves (``--figure``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml

METHODS = {
    "oblr-snr": ["algorithm.baseline=oblr", "algorithm.lr_schedule=snr"],
    "grpo-const": ["algorithm.baseline=grpo", "algorithm.lr_schedule=constant"],
}
STEP_KEYS = ("train/reward_mean", "optim/lr", "train/response_length_mean", "train/truncated_share",
             "optim/grad_norm", "time/step", "snr/S", "snr/V", "snr/factor")
EVAL_KEYS = ("eval/accuracy_greedy", "eval/accuracy_sampled")


def train_command(config: Path, run_dir: Path, method: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "oblr.cli", "train", "--config", str(config), "--output-dir", str(run_dir),
            "--quiet", *METHODS[method], *extra]


def run_all(config: Path, runs: Path, methods: list[str], extra: list[str], jobs: int = 1) -> dict[str, float]:
    """Each method's ``oblr train`` (finished folders skipped), ``jobs`` at a time; wall seconds per method."""
    todo = []
    for m in methods:
        run_dir = runs / m
        if (run_dir / "summary.json").exists():
            print(f"[real_model_rl] {m}: finished run in {run_dir}, not run again", file=sys.stderr, flush=True)
        else:
            todo.append((m, train_command(config, run_dir, m, extra)))
    walls, failed, running = {}, [], []
    while todo or running:
        while todo and len(running) < jobs:
            m, cmd = todo.pop(0)
            print(f"[real_model_rl] {m}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
            running.append((m, subprocess.Popen(cmd), time.perf_counter()))
        time.sleep(0.2)
        for item in list(running):
            m, proc, t = item
            if proc.poll() is not None:
                running.remove(item)
                walls[m] = round(time.perf_counter() - t, 1)
                if proc.returncode != 0:
                    failed.append(f"{m} (exit {proc.returncode}, see {runs / m})")
    if failed:
        raise SystemExit(f"real_model_rl: oblr train failed for {', '.join(failed)}")
    return walls


def read_run(run_dir: Path) -> dict:
    """Per-step series, the held-out evaluations and the run's settings from one run folder."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise SystemExit(f"real_model_rl: {metrics} not found (run it first, without --skip-train)")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "train/reward_mean" in r]
    evals = [{"step": r.get("step"), **{k: r[k] for k in EVAL_KEYS if k in r}} for r in rows
             if any(k in r for k in EVAL_KEYS)]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["train"]["output_dir"] = os.path.relpath(run_dir)  # as given, never this machine's absolute path
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else None
    return {"run_dir": str(run_dir), "finished": summary is not None,
            "steps": [{"step": r.get("step"), **{k: r.get(k) for k in STEP_KEYS}} for r in steps],
            "evals": evals, "config": cfg}


def describe(cfg: dict) -> str:
    m, t, r, a, o, tr = (cfg[k] for k in ("model", "task", "rollout", "algorithm", "optim", "train"))
    lora = f"LoRA r={m['lora_rank']} alpha={m['lora_alpha']} on {', '.join(m['lora_targets'])}" if m["lora_rank"] \
        else "full fine-tuning"
    return (f"`{m['name_or_path']}`, {lora}; task `{t['name']}` {t['options']}; N={r['prompts_per_step']} prompts x "
            f"G={r['group_size']} samples, {r['max_new_tokens']} new tokens at most, temperature "
            f"{r['temperature']}; baseline `{a['baseline']}`, lr schedule `{a['lr_schedule']}`, {o['optimizer']} "
            f"lr {o['lr']:g}, grad clip {o['grad_clip']}; {tr['steps']} steps, seed {tr['seed']}; held-out: "
            f"{t['eval_size']} problems, greedy and {tr['eval_samples']} sample(s) each at temperature "
            f"{r['temperature']}")


def _mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def result_row(run: dict) -> dict:
    st = run["steps"]
    rew = [s["train/reward_mean"] for s in st]
    half = len(rew) // 2
    first = next((e for e in run["evals"] if e.get("step") == 0), {})
    last = run["evals"][-1] if run["evals"] and run["evals"][-1].get("step") else {}
    return {
        "steps_done": len(st), "finished": run["finished"],
        "start_greedy": first.get("eval/accuracy_greedy"), "end_greedy": last.get("eval/accuracy_greedy"),
        "start_sampled": first.get("eval/accuracy_sampled"), "end_sampled": last.get("eval/accuracy_sampled"),
        "reward_first_half": _mean(rew[:half]), "reward_second_half": _mean(rew[half:]),
        "lr_mean": _mean([s["optim/lr"] for s in st]), "lr_min": min((s["optim/lr"] for s in st), default=None),
        "lr_max": max((s["optim/lr"] for s in st), default=None),
        "length_mean": _mean([s["train/response_length_mean"] for s in st]),
        "seconds_per_step": _mean([s["time/step"] for s in st]),
    }


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _g(x, spec: str = ".3g") -> str:
    return "-" if x is None else format(x, spec)


def render_md(results: dict) -> str:
    lines = [f"# Short RL run on a real checkpoint: {', '.join(results['runs'])}", "",
             f"Written by `benchmarks/real_model_rl.py` (config `{results['config']}`); one seed per method. "
             f"torch {results['versions']['torch']}, transformers {results['versions']['transformers']}, CPU.", ""]
    for m, run in results["runs"].items():
        lines += [f"- **{m}**: {run['description']}"]
    lines += ["", "| method | steps | held-out greedy start -> end (%) | sampled start -> end (%) | "
              "train reward 1st half -> 2nd half | lr mean (min-max) | response tokens | s/step |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m, run in results["runs"].items():
        r = run["result"]
        lines.append(f"| {m} | {r['steps_done']} | {_pct(r['start_greedy'])} -> {_pct(r['end_greedy'])} | "
                     f"{_pct(r['start_sampled'])} -> {_pct(r['end_sampled'])} | {_g(r['reward_first_half'], '.3f')} -> "
                     f"{_g(r['reward_second_half'], '.3f')} | {_g(r['lr_mean'], '.2e')} ({_g(r['lr_min'], '.1e')}-"
                     f"{_g(r['lr_max'], '.1e')}) | {_g(r['length_mean'], '.1f')} | {_g(r['seconds_per_step'], '.1f')} |")
    lines += ["", "Per step (mean reward over the N x G samples; lr used; SNR factor where the rule runs):", ""]
    for m, run in results["runs"].items():
        lines.append(f"- {m} reward: " + " ".join(_g(s["train/reward_mean"], ".2f") for s in run["steps"]))
        lines.append(f"- {m} lr: " + " ".join(_g(s["optim/lr"], ".2g") for s in run["steps"]))
        if any(s.get("snr/factor") is not None for s in run["steps"]):
            lines.append(f"- {m} SNR factor: " + " ".join(_g(s.get("snr/factor"), ".2g") for s in run["steps"]))
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_lr) = plt.subplots(1, 2, figsize=(10, 3.8))
    for m, run in results["runs"].items():
        xs = [s["step"] for s in run["steps"]]
        rew = [s["train/reward_mean"] for s in run["steps"]]
        line, = ax_r.plot(xs, rew, "-o", ms=3, alpha=0.5, label=f"{m} (per step)")
        k = 5  # a trailing 5-step mean, to see through the noise of 16 samples per step
        smooth = [sum(rew[max(0, i - k + 1):i + 1]) / len(rew[max(0, i - k + 1):i + 1]) for i in range(len(rew))]
        ax_r.plot(xs, smooth, "-", lw=2.2, color=line.get_color(), label=f"{m} (trailing {k}-step mean)")
        ax_lr.plot(xs, [s["optim/lr"] for s in run["steps"]], "-o", ms=3, color=line.get_color(), label=m)
    ax_r.set_xlabel("step")
    ax_r.set_ylabel("training reward (mean of N x G samples)")
    ax_r.set_ylim(-0.02, 1.02)
    ax_r.grid(alpha=0.3)
    ax_r.legend(fontsize=7)
    ax_lr.set_xlabel("step")
    ax_lr.set_ylabel("learning rate used")
    ax_lr.set_yscale("log")
    ax_lr.grid(alpha=0.3)
    ax_lr.legend(fontsize=7)
    fig.suptitle(f"{next(iter(results['runs'].values()))['config']['model']['name_or_path']}: LoRA RL, one seed")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=Path("configs/real-model/smollm2-arith-chat-lora.yaml"))
    ap.add_argument("--runs", type=Path, default=Path("runs/real-model-rl"), help="run folders (one per method)")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/real_model_rl"))
    ap.add_argument("--figure", type=Path, default=Path("docs/figures/real_model_rl.png"))
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {', '.join(METHODS)}")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (default 1: in sequence)")
    ap.add_argument("--skip-train", action="store_true", help="only the report, from the run folders")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs (e.g. train.steps=30)")
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    if set(methods) - set(METHODS):
        ap.error(f"unknown methods {sorted(set(methods) - set(METHODS))}; known: {', '.join(METHODS)}")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    if not args.config.is_file():
        ap.error(f"--config {args.config}: no such file")
    walls = {} if args.skip_train else run_all(args.config, args.runs, methods, args.overrides, args.jobs)

    import torch
    import transformers

    results = {"config": str(args.config), "overrides": args.overrides, "runs": {},
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    for m in methods:
        run = read_run(args.runs / m)
        results["runs"][m] = {"description": describe(run["config"]), "result": result_row(run),
                              "wall_seconds": walls.get(m), **run}
        results["runs"][m]["run_dir"] = os.path.relpath(run["run_dir"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    md = render_md(results)
    md += f"\n![reward and lr curves]({os.path.relpath(args.figure, args.out)})\n"
    (args.out / "summary.md").write_text(md)
    plot(results, args.figure)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
