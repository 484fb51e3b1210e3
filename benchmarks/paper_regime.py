"""OBLR-PO in the paper's regime (128 prompts x 8 samples per step): the grids, and what the SNR rule does with N.

    python benchmarks/paper_regime.py grids --out configs/paper-regime       # one grid per task and optimizer
    oblr compare --config configs/paper-regime/arithmetic/grid-sgd.yaml \\
        --out benchmarks/results/paper-regime/arithmetic --jobs 2 train.threads=1
    oblr compare --config configs/paper-regime/n-sweep-arithmetic.yaml \\
        --out benchmarks/results/paper-regime/n-sweep --jobs 2 train.threads=1
    python benchmarks/paper_regime.py nsweep --runs benchmarks/results/paper-regime/n-sweep \\
        --out docs/results/paper-regime

``grids`` writes the grid of item 1 of the paper-regime study for each built-in task and each optimizer
(``<out>/<task>/grid-<optimizer>.yaml``, seeds 0, 1, 2, ``rollout.prompts_per_step=128 rollout.group_size=8``,
:data:`STEPS` steps, every row the same rollout budget): GRPO and RLOO at a fixed rate by half-decades
(:data:`FIXED_RATES`), the OBLR-PO baseline at a fixed rate (the same rates: the best one is read off GRPO's
row afterwards), the SNR rule with the paper's current-batch estimate (``optim.snr_ema=0``) and with the EMA
default, each over three decades of ``eta_max`` (:data:`ETA_MAX`), with AdamW also ``snr_adam`` (oblr's rule
for Adam, the EMA default) over the same decades, and ``auto`` at four initial guesses (:data:`AUTO_GUESSES`).

``nsweep`` reads the runs of ``configs/paper-regime/n-sweep-arithmetic.yaml`` (the SNR rule at N = 16, 32, 64,
128 prompts per step, the same rollout budget N x steps, the current-batch rule and the EMA default, one seed)
from their ``metrics.jsonl`` and ``summary.json``: per run the logged factor ``snr/factor`` (mean and std over
steps), the share of steps whose learning rate was 0 (``snr/lr == 0``: the signal estimate clamped at 0), the
mean of ``N x SNR`` (``snr/n_snr``), the mean learning rate, and the final held-out accuracy (sampled, greedy).
Writes ``nsweep.md`` (the table) and ``nsweep.png`` (factor, clamped share and accuracy against N) into
``--out``; unfinished runs are listed as such.

Cost on a CPU (one torch thread a run, a 2-core machine shared with other jobs): a step at N = 128 took 21.7 s
(median) in the N sweep under a heavy load and 8.9 s (median) in the pilot of the SGD grid
(``configs/paper-regime/arithmetic/pilot-sgd.yaml``, two or three runs at a time), so one grid row (100 steps at
N = 128) is 13-20 minutes there, and the six grids (3 tasks x 2 optimizers x 30 or 32 rows x 3 seeds, about 560 runs)
about 60 hours with two runs at a time: a GPU's job (``benchmarks/gpu/paper_regime.sh`` runs one task's grid,
one seed, in under 10 minutes of device time), or many CPU sessions reusing finished runs (``oblr compare``
reuses a run folder of the same code and start model). ``benchmarks/paper_regime_report.py`` makes the grid's
tables, verdicts and plot.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_sections  # noqa: E402  (the marked sections of docs/results.md)

from oblr.train.summary import is_finished  # noqa: E402

TASKS = ("arithmetic", "countdown", "word_problems")
SEEDS = [0, 1, 2]
#: steps of a paper-regime run (128 x 8 sequences a step): the rollout budget of 800 steps at N = 16
STEPS = 100
PAPER = {"rollout": {"prompts_per_step": 128, "group_size": 8}}
#: fixed rates by half-decades, per optimizer (GRPO, RLOO and the OBLR-PO baseline); AdamW's 3e-3 and SGD's 10: on
#: countdown the pilot's best fixed rates were the grid's largest (1e-3, 3), so the sweep goes a half-decade above
FIXED_RATES = {"adamw": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3], "sgd": [0.03, 0.1, 0.3, 1.0, 3.0, 10.0]}
#: eta_max of the SNR rule: three decades per optimizer (SGD's 10: the half-decade between the 3 that held the
#: best fixed rate's accuracy and the 30 that collapsed in the arithmetic pilot)
ETA_MAX = {"adamw": [1e-4, 1e-3, 1e-2, 1e-1], "sgd": [0.3, 3.0, 10.0, 30.0, 300.0]}
#: initial guesses of the auto schedule
AUTO_GUESSES = {"adamw": [1e-5, 1e-4, 1e-3, 1e-2], "sgd": [0.01, 0.1, 1.0, 10.0]}


def _row(name: str, optimizer: str, lr: float, **keys) -> dict:
    return {"name": f"{name}-{optimizer}-lr{lr:g}", "optim.optimizer": optimizer, "optim.lr": lr, **keys}


def grid(task: str, optimizer: str, steps: int = STEPS, seeds: list[int] | None = None) -> dict:
    """The paper-regime grid of one task and optimizer (every row: 128 x 8 sequences a step, ``steps`` steps)."""
    if optimizer not in FIXED_RATES:
        raise SystemExit(f"paper_regime: optimizer must be one of {', '.join(FIXED_RATES)}, got {optimizer!r}")
    runs = []
    for lr in FIXED_RATES[optimizer]:
        runs.append(_row("grpo-const", optimizer, lr, **{"algorithm.baseline": "grpo",
                                                         "algorithm.lr_schedule": "constant"}))
        runs.append(_row("rloo-const", optimizer, lr, **{"algorithm.baseline": "rloo",
                                                         "algorithm.lr_schedule": "constant"}))
        runs.append(_row("oblr-const", optimizer, lr, **{"algorithm.baseline": "oblr",
                                                         "algorithm.lr_schedule": "constant"}))
    for eta in ETA_MAX[optimizer]:
        for tag, ema in (("batch", 0.0), ("ema", 0.9)):
            runs.append(_row(f"oblr-snr-{tag}", optimizer, eta, **{"algorithm.baseline": "oblr",
                                                                    "algorithm.lr_schedule": "snr",
                                                                    "optim.snr_ema": ema}))
    if optimizer == "adamw":  # oblr's own rule for Adam (issue 38 item 3): the EMA default over the same decades
        for eta in ETA_MAX[optimizer]:
            runs.append(_row("oblr-snradam-ema", optimizer, eta, **{"algorithm.baseline": "oblr",
                                                                     "algorithm.lr_schedule": "snr_adam",
                                                                     "optim.snr_ema": 0.9}))
    for guess in AUTO_GUESSES[optimizer]:
        runs.append(_row("oblr-auto", optimizer, guess, **{"algorithm.baseline": "oblr",
                                                            "algorithm.lr_schedule": "auto"}))
    base = {"task": {"name": task}, **json.loads(json.dumps(PAPER)),
            "train": {"steps": steps, "eval_every": max(1, steps // 4), "save_every": steps, "keep_checkpoints": 1}}
    return {"description": f"the paper's regime on {task} with {optimizer}: N = 128 prompts x G = 8 samples a step, "
                           f"{steps} steps (issue 38)", "seeds": list(seeds or SEEDS), "base": base, "runs": runs}


def write_grids(out: Path, steps: int = STEPS, seeds: list[int] | None = None, tasks=TASKS,
                optimizers=tuple(FIXED_RATES)) -> list[Path]:
    paths = []
    for task in tasks:
        for opt in optimizers:
            d = out / task
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"grid-{opt}.yaml"
            p.write_text(yaml.safe_dump(grid(task, opt, steps, seeds), sort_keys=False), encoding="utf-8")
            paths.append(p)
    return paths


# ------------------------------------------------------------------------------------------ the N sweep
def read_metrics(run: Path) -> list[dict]:
    rows = []
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    return rows


def run_stats(run: Path) -> dict:
    """The SNR rule's statistics of one run (its training rows) and its final accuracy (``summary.json``)."""
    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    rows = [r for r in read_metrics(run) if "snr/lr" in r]
    factors = [r["snr/factor"] for r in rows if "snr/factor" in r]
    lrs = [r["snr/lr"] for r in rows]
    nsnr = [r["snr/n_snr"] for r in rows if "snr/n_snr" in r]
    summary = run / "summary.json"
    done = is_finished(run)  # a summary of an interrupted or failed run is not a finished one
    s = json.loads(summary.read_text(encoding="utf-8")) if done else {}
    return {"run": run.name if run.name.startswith("seed") is False else run.parent.name,
            "n": int(cfg["rollout"]["prompts_per_step"]), "ema": float(cfg["optim"]["snr_ema"]),
            "steps": len(rows), "planned_steps": int(cfg["train"]["steps"]), "finished": done,
            "factor_mean": statistics.fmean(factors) if factors else math.nan,
            "factor_std": statistics.stdev(factors) if len(factors) > 1 else math.nan,
            "lr0_share": (sum(1 for x in lrs if x == 0.0) / len(lrs)) if lrs else math.nan,
            "n_snr_mean": statistics.fmean(nsnr) if nsnr else math.nan,
            "lr_mean": statistics.fmean(lrs) if lrs else math.nan,
            "start_sampled": s.get("eval_accuracy_initial", math.nan), "final_sampled": s.get("eval_accuracy_final", math.nan),
            "final_greedy": s.get("eval_accuracy_greedy_final", math.nan), "wall_seconds": s.get("wall_seconds", math.nan)}


def nsweep_rows(root: Path) -> list[dict]:
    runs = sorted({p.parent for p in root.rglob("metrics.jsonl") if "checkpoints" not in p.parts})
    if not runs:
        raise SystemExit(f"paper_regime: no run folder (metrics.jsonl) under {root}")
    return sorted((run_stats(r) for r in runs), key=lambda r: (r["ema"], r["n"]))


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.1f} %"


def nsweep_table(rows: list[dict]) -> str:
    out = ["| rule | N | steps | factor mean ± std | steps at lr 0 | mean N x SNR | mean lr | "
           "sampled start -> final | greedy final |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rule = "current batch (snr_ema 0)" if r["ema"] == 0 else f"EMA {r['ema']:g}"
        steps = f"{r['steps']}" + ("" if r["finished"] else f" of {r['planned_steps']} (unfinished)")
        out.append(f"| {rule} | {r['n']} | {steps} | {r['factor_mean']:.3f} ± {r['factor_std']:.3f} | "
                   f"{_pct(r['lr0_share'])} | {r['n_snr_mean']:.3f} | {r['lr_mean']:.2e} | "
                   f"{_pct(r['start_sampled'])} -> {_pct(r['final_sampled'])} | {_pct(r['final_greedy'])} |")
    return "\n".join(out)


def nsweep_plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    from oblr.tracking.plots import save_png

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ema, style in ((0.0, "o-"), (0.9, "s--")):
        sel = [r for r in rows if r["ema"] == ema]
        if not sel:
            continue
        label = "current batch" if ema == 0 else f"EMA {ema:g}"
        ns = [r["n"] for r in sel]
        axes[0].errorbar(ns, [r["factor_mean"] for r in sel], yerr=[r["factor_std"] for r in sel], fmt=style,
                         capsize=3, label=label)
        axes[1].plot(ns, [100 * r["lr0_share"] for r in sel], style, label=label)
        axes[2].plot(ns, [100 * r["final_sampled"] for r in sel], style, label=f"{label}, sampled")
        axes[2].plot(ns, [100 * r["final_greedy"] for r in sel], style, alpha=0.4, label=f"{label}, greedy")
    for ax, title in zip(axes, ("SNR factor S/(S+V/N): mean ± std over steps", "steps at lr 0 (%)",
                                "final held-out accuracy (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("N (prompts per step; same rollout budget)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
    return path


BEGIN = "<!-- paper-regime: generated by benchmarks/paper_regime.py; begin -->"
END = "<!-- paper-regime: end -->"


def nsweep_section(rows: list[dict], runs: Path, image: str) -> str:
    """The results-doc section of the N sweep: command, table, plot and the readings the numbers give."""
    batch = [r for r in rows if r["ema"] == 0 and r["finished"]]
    lines = ["## The paper's regime (generated)", "",
             "How the SNR rule's per-step estimate behaves as N (prompts per step) grows toward the paper's "
             "N = 128, on the built-in arithmetic task from the shipped start model, one seed per N, the same "
             "rollout budget per run (N x steps = 3200 prompts, G = 8), AdamW with eta_max = 1e-3. Generated by "
             f"`python benchmarks/paper_regime.py nsweep --runs {runs} --out <dir> --results-doc docs/results.md` "
             "from the runs of `oblr compare --config configs/paper-regime/n-sweep-arithmetic.yaml "
             "--jobs 2 train.threads=1`. 'steps at lr 0': steps whose signal estimate S was clamped at 0.", "",
             f"![SNR factor, clamped share and accuracy against N]({image})", "", nsweep_table(rows), ""]
    if len(batch) >= 2:
        lo, hi = batch[0], batch[-1]
        lines.append(f"Reading (current-batch rule, N = {lo['n']} -> {hi['n']}): the share of steps at lr 0 goes "
                     f"from {_pct(lo['lr0_share'])} to {_pct(hi['lr0_share'])}; the mean factor from "
                     f"{lo['factor_mean']:.3f} to {hi['factor_mean']:.3f} (its std over steps {lo['factor_std']:.3f} -> "
                     f"{hi['factor_std']:.3f}); the mean N x SNR from {lo['n_snr_mean']:.3f} to "
                     f"{hi['n_snr_mean']:.3f}; final sampled accuracy {_pct(lo['final_sampled'])} -> "
                     f"{_pct(hi['final_sampled'])} at the same rollout budget (one seed each: a difference under "
                     "about 4 points is within one run's evaluation noise).")
    missing = [r for r in rows if not r["finished"]]
    if missing:
        lines.append("Unfinished when this was generated: " + ", ".join(
            f"N = {r['n']} ({'EMA' if r['ema'] else 'current batch'}, {r['steps']} of {r['planned_steps']} steps)"
            for r in missing) + ".")
    return "\n".join(lines).rstrip() + "\n"


def splice(doc: Path, section: str) -> None:
    """Put ``section`` between the markers in ``doc`` (before "## Reading" the first time)."""
    doc_sections.splice(doc, BEGIN, END, section)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grids", help="write the paper-regime grids (one per task and optimizer)")
    g.add_argument("--out", type=Path, default=Path("configs/paper-regime"))
    g.add_argument("--steps", type=int, default=STEPS)
    g.add_argument("--seeds", type=int, nargs="+", default=None, help=f"default {SEEDS}")
    g.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    g.add_argument("--optimizers", nargs="+", default=list(FIXED_RATES), choices=list(FIXED_RATES))
    n = sub.add_parser("nsweep", help="the SNR rule's statistics against N: table and plot")
    n.add_argument("--runs", type=Path, required=True)
    n.add_argument("--out", type=Path, required=True)
    n.add_argument("--results-doc", type=Path, default=None, help="splice the section into this markdown file")
    args = ap.parse_args(argv)
    if args.cmd == "grids":
        for p in write_grids(args.out, args.steps, args.seeds, args.tasks, args.optimizers):
            print(p)
        return 0
    rows = nsweep_rows(args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    table = nsweep_table(rows)
    (args.out / "nsweep.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "nsweep.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    nsweep_plot(rows, args.out / "nsweep.png")
    print(table)
    if args.results_doc is not None:
        image = Path(*(Path(args.out).parts[1:])) if Path(args.out).parts[:1] == ("docs",) else args.out
        splice(args.results_doc, nsweep_section(rows, args.runs, f"{image}/nsweep.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
