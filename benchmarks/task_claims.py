"""The method's claims re-measured per task: method comparison and lr sensitivity, then one cross-task table.

    python benchmarks/task_claims.py grids --task countdown --out configs/task-claims/countdown
    oblr compare --config configs/task-claims/countdown/grid-claims.yaml \\
        --out benchmarks/results/task-claims/countdown --jobs 2 train.threads=1
    python benchmarks/task_claims.py grids --task arithmetic --steps 200 --only rloo-const,oblr-const \\
        --out configs/task-claims/arithmetic      # the comparison rows the built-in task's lr sweep lacks
    python benchmarks/task_claims.py report \\
        --task arithmetic=benchmarks/results/lr-sweep,benchmarks/results/lr-sweep-auto,benchmarks/results/task-claims/arithmetic \\
        --task countdown=benchmarks/results/task-claims/countdown \\
        --out docs/results/task-claims --results-doc docs/results.md

``grids`` writes one ``oblr compare`` grid per task (``grid-claims.yaml``) with the protocol of
:data:`PROTOCOL` (the lr sweep's, shortened to fit a CPU: fewer steps, the same evaluation) on that task's
default run (``task.name=<task>``, so its built-in model), seeds 0, 1, 2:

- the lr sensitivity: ``grpo-const``, ``oblr-snr`` and ``oblr-auto`` (as ``benchmarks/lr_sensitivity.py``
  names them) at AdamW 1e-5, 1e-4, 1e-3, 1e-2;
- the method comparison at a fixed rate, as the built-in task's paper-check grid does: ``rloo-const`` and
  ``oblr-const`` (the OBLR-PO baseline without the SNR rule) at 1e-4, beside ``grpo-const`` at 1e-4 and
  ``oblr-snr`` with eta_max 1e-3 from the sweep (the same folders, run once); and ``oblr-kl`` (the lr set
  from the policy's KL per step) from the guess 1e-3. In a report, ``oblr-kl`` is the kl schedule at the target
  that is the default now for the run's N and optimizer (the logged ``kl/target``, or the configured one); kl
  runs at other targets (earlier defaults) are listed under the task's tables as ``oblr-kl-target<T>``.

Run folders are ``OUT/<method>-adamw-lr<lr>/seed<k>/``; ``benchmarks/results/task-claims/`` keeps only each
run's ``config.yaml`` and ``summary.json`` (its ``.gitignore``): the configuration and result of every point
(``summary.json`` records the code that made it). A sweep can be run in pieces: ``oblr compare`` with the same
grid reuses the finished runs of a folder made by the same code (the same source hash: run it from the
commit that started the sweep) on the same machine (the built-in models are built per machine, and their
weights differ between machines: docs/builtin.md).

``report`` reads every run folder under each task's roots (a folder without ``summary.json`` is unfinished
and listed as missing), groups runs by (method, lr) from their ``config.yaml``, and writes per task the
lr-sensitivity table and the method table (mean ± sample std of the final held-out sampled accuracy over
the finished seeds), a PNG of accuracy against lr with one panel per task, and the cross-task table:

- best tuned fixed rate: the ``grpo-const`` lr with the highest mean final accuracy;
- ``auto`` and ``kl`` at their worst guess: the lowest mean final accuracy of ``oblr-auto`` (``oblr-kl``) over
  the initial guesses run, and how many were run (the claims grids run kl from 1e-3 only; a guess sweep of its own,
  ``configs/lr-sweep/grid-kl-guesses-n16.yaml``, adds the others on the built-in task);
- whether OBLR-PO (the baseline, fixed rate; with the SNR rule; with the kl schedule) beats RLOO and GRPO (fixed 1e-4)
  beyond seed noise: Welch's t-test, two-sided at 5 %: the difference of means against its standard error
  ``sqrt(s_a^2/n_a + s_b^2/n_b)`` times Student's t at the Welch-Satterthwaite degrees of freedom (2.8-4.3 with
  3 seeds a side, 2.3-2.8 with 5; ``beats`` / ``behind`` / ``within noise``).

A task's runs must share one protocol: runs whose ``train.steps`` differ within one task are refused with
the folders named (the built-in task's committed sweep is 200 steps, the new tasks' :data:`PROTOCOL`; each
row says its steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doc_sections  # noqa: E402
import lr_sensitivity as lrs  # noqa: E402  (the sweep's names and folder layout)

from oblr.experiments.compare import aggregate  # noqa: E402
from oblr.experiments.stats import config_value, run_config, welch  # noqa: E402
from oblr.kl_rate import default_target  # noqa: E402
from oblr.train.summary import is_finished  # noqa: E402

METHODS = {**lrs.METHODS,
           "rloo-const": {"algorithm.baseline": "rloo", "algorithm.lr_schedule": "constant"},
           "oblr-const": {"algorithm.baseline": "oblr", "algorithm.lr_schedule": "constant"}}
SWEEP_METHODS = ("grpo-const", "oblr-snr", "oblr-auto")
#: the columns of the lr-sensitivity table and the lines of the plot: the sweep's methods, and the kl schedule at
#: whatever guesses were run (the grids run it from 1e-3 only; a guess sweep is its own grid)
TABLE_METHODS = SWEEP_METHODS + ("oblr-kl",)
#: the rules that take ``optim.lr`` as a guess: their worst guess is a column of the cross-task table
GUESS_METHODS = (("oblr-auto", "auto"), ("oblr-kl", "kl"))
SWEEP_LRS = (1e-5, 1e-4, 1e-3, 1e-2)
#: the method comparison: (method, lr); the fixed-rate methods at 1e-4, the SNR rule with eta_max 1e-3, the kl
#: schedule from the guess 1e-3
COMPARISON = (("grpo-const", 1e-4), ("rloo-const", 1e-4), ("oblr-const", 1e-4), ("oblr-snr", 1e-3), ("oblr-kl", 1e-3))
OBLR_ROWS = ("oblr-const", "oblr-snr", "oblr-kl")
REFERENCE_ROWS = ("rloo-const", "grpo-const")
SEEDS = [0, 1, 2]
PROTOCOL = {"train": {"steps": 100, "eval_every": 50, "save_every": 100, "keep_checkpoints": 1}}


def grid(task: str, steps: int | None = None, only: tuple[str, ...] = ()) -> dict:
    """The ``oblr compare`` grid of one task: the comparison's points, then the rest of the sweep; ``only``:
    just these methods' points (e.g. the comparison's extra rows beside an existing sweep)."""
    base = json.loads(json.dumps(PROTOCOL))
    base["task"] = {"name": task}
    if steps is not None:
        base["train"]["steps"] = steps
    points = list(COMPARISON)  # first: the comparison, then the rest of the sweep
    points += [(m, lr) for m in SWEEP_METHODS for lr in SWEEP_LRS if (m, lr) not in points]
    runs = [{"name": lrs.point_name(m, "adamw", lr), **METHODS[m], "optim.optimizer": "adamw", "optim.lr": lr}
            for m, lr in points if not only or m in only]
    return {"description": f"claims re-measured on task {task}: lr sensitivity and method comparison (issue 27)",
            "seeds": list(SEEDS), "base": base, "runs": runs}


def write_grid(task: str, out: Path, steps: int | None = None, only: tuple[str, ...] = (),
               name: str = "grid-claims") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(grid(task, steps, only), sort_keys=False), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ reading
def kl_target_of(cfg: dict, run_dir: Path) -> float:
    """The target a ``kl`` run steered to: ``algorithm.schedule_options.target`` when given, else the ``kl/target``
    its metrics.jsonl logged (the default of the code that ran it, which has changed: 3e-3, then 3e-3 x N / 128,
    then 1.5e-3 x N / 128 with AdamW). A run that shows neither is refused with its folder named."""
    given = (config_value(cfg, "algorithm.schedule_options") or {}).get("target")
    if given is not None:
        return float(given)
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        with metrics.open(encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line) if line.strip() else {}
                if "kl/target" in row:
                    return float(row["kl/target"])
    raise SystemExit(f"task_claims: {run_dir}: a kl run with no schedule_options.target in config.yaml and no "
                     "kl/target in metrics.jsonl, so its target (which decides its column) cannot be told")


def method_of(cfg: dict, run_dir: Path | None = None) -> str:
    """The method a run's config names. ``oblr-kl`` is the kl schedule at the target that is the default now for
    the run's N and optimizer (:func:`oblr.kl_rate.default_target`); a kl run at any other target is
    ``oblr-kl-target<T>`` (listed under the tables, never mixed into the ``oblr-kl`` column)."""
    for name, ov in METHODS.items():
        if all(config_value(cfg, k) == v for k, v in ov.items()):
            if name == "oblr-kl" and run_dir is not None:
                target = kl_target_of(cfg, run_dir)
                default = default_target(int(config_value(cfg, "rollout.prompts_per_step")),
                                         adaptive=config_value(cfg, "optim.optimizer") != "sgd")
                if not math.isclose(target, default, rel_tol=1e-9):
                    return f"oblr-kl-target{target:g}"
            return name
    return f"{config_value(cfg, 'algorithm.baseline')}+{config_value(cfg, 'algorithm.lr_schedule')}"


def collect(roots: list[Path]) -> tuple[dict, int]:
    """({(method, lr): {"final": [...], "seeds": [...], "missing": [...]}}, train.steps) of AdamW runs."""
    points: dict = defaultdict(lambda: {"final": [], "seeds": [], "missing": []})
    steps: dict[int, Path] = {}
    for d in lrs.find_runs(roots):
        cfg = run_config(d)
        if config_value(cfg, "optim.optimizer") != "adamw":
            continue
        steps.setdefault(int(config_value(cfg, "train.steps")), d)
        pt = points[(method_of(cfg, d), float(config_value(cfg, "optim.lr")))]
        seed = config_value(cfg, "train.seed")
        summary = d / "summary.json"
        if not is_finished(d):  # no summary, or one of an interrupted or failed run
            pt["missing"].append(seed)
            continue
        pt["final"].append(json.loads(summary.read_text(encoding="utf-8")).get("eval_accuracy_final", math.nan))
        pt["seeds"].append(seed)
    if len(steps) > 1:
        raise SystemExit("task_claims: one task's runs mix protocols (train.steps "
                         + ", ".join(f"{s} in {d}" for s, d in sorted(steps.items())) + ")")
    return dict(points), next(iter(steps), 0)


def stats(pt: dict | None) -> tuple[float, float, int]:
    """(mean %, std %, n) of a point's final accuracies."""
    return aggregate([100 * v for v in pt["final"]]) if pt else (math.nan, math.nan, 0)


def cell(pt: dict | None) -> str:
    mean, std, n = stats(pt)
    if not pt:
        return "–"
    text = "missing" if n == 0 else f"{mean:.1f}" + (f" ± {std:.1f}" if math.isfinite(std) else "") + f" ({n})"
    return text + (f"; unfinished {sorted(pt['missing'])}" if pt["missing"] else "")


def verdict(a: dict | None, b: dict | None) -> str:
    """Whether ``a`` beats ``b`` beyond seed noise: Welch's t-test on the final accuracies (%), two-sided 5 %
    (:func:`oblr.experiments.stats.welch`); the text gives the difference of means ± its standard error."""
    xa = [100 * v for v in (a or {}).get("final", []) if math.isfinite(v)]  # a run that never evaluated: left out
    xb = [100 * v for v in (b or {}).get("final", []) if math.isfinite(v)]
    if not xa or not xb:
        return "not run"
    if len(xa) < 2 or len(xb) < 2:
        return "too few seeds"
    w = welch(xa, xb)
    return f"{w.word} ({w.diff:+.1f} ± {w.se:.1f})"


def best_fixed(points: dict) -> str:
    cands = [(stats(pt)[0], lr) for (m, lr), pt in points.items() if m == "grpo-const" and stats(pt)[2]]
    if not cands:
        return "missing"
    acc, lr = max(cands)
    return f"{lr:g}: {cell(points[('grpo-const', lr)])}"


def worst_guess(points: dict, method: str = "oblr-auto") -> str:
    """The guess (``optim.lr``) of ``method`` with the lowest mean final accuracy, and of how many guesses run."""
    cands = [(stats(pt)[0], lr) for (m, lr), pt in points.items() if m == method and stats(pt)[2]]
    if not cands:
        return "missing"
    acc, lr = min(cands)
    return f"guess {lr:g} of {len(cands)}: {cell(points[(method, lr)])}"


def task_tables(task: str, points: dict, steps: int) -> str:
    lr_rows = sorted({lr for (m, lr) in points if m in TABLE_METHODS})
    out = [f"### {task} ({steps} steps per run)", "",
           "Learning-rate sensitivity, AdamW (final held-out sampled accuracy %, mean ± std (finished seeds); "
           "oblr-auto and oblr-kl: the lr is their initial guess):", "",
           "| lr | " + " | ".join(TABLE_METHODS) + " |", "|---|" + "---|" * len(TABLE_METHODS)]
    out += [f"| {lr:g} | " + " | ".join(cell(points.get((m, lr))) for m in TABLE_METHODS) + " |" for lr in lr_rows]
    out += ["", "Method comparison (fixed rate 1e-4; the SNR rule with eta_max 1e-3; the kl schedule from the guess 1e-3):",
            "",
            "| method | lr | final sampled acc. (%) |", "|---|---|---|"]
    out += [f"| {m} | {lr:g} | {cell(points.get((m, lr)))} |" for m, lr in COMPARISON]
    others = sorted((m, lr) for (m, lr) in points if m not in TABLE_METHODS and (m, lr) not in set(COMPARISON))
    if others:
        out += ["", "Also under these roots, not in the tables above (another method, or the kl schedule at a target "
                "that is not the default now): " + "; ".join(f"{m} at {lr:g}: {cell(points[(m, lr)])}"
                                                            for m, lr in others) + "."]
    return "\n".join(out) + "\n"


def cross_table(tasks: dict[str, tuple[dict, int]]) -> str:
    cmp_ = dict(COMPARISON)
    head = ["task", "steps", "best tuned fixed rate (GRPO)"] + [f"{n} at its worst guess" for _, n in GUESS_METHODS]
    head += [f"{o} vs {r}" for o in OBLR_ROWS for r in REFERENCE_ROWS]
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for task, (points, steps) in tasks.items():
        vs = [verdict(points.get((o, cmp_[o])), points.get((r, cmp_[r]))) for o in OBLR_ROWS for r in REFERENCE_ROWS]
        worst = [worst_guess(points, m) for m, _ in GUESS_METHODS]
        rows.append(f"| {task} | {steps} | {best_fixed(points)} | " + " | ".join(worst + vs) + " |")
    return "\n".join(rows) + "\n"


def plot(tasks: dict[str, tuple[dict, int]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4), squeeze=False)
    for ax, (task, (points, steps)) in zip(axes[0], tasks.items()):
        for m in TABLE_METHODS:
            pts = sorted((lr, pt) for (mm, lr), pt in points.items() if mm == m and stats(pt)[2])
            if pts:
                line, = ax.plot([lr for lr, _ in pts], [stats(pt)[0] for _, pt in pts], "-o", ms=4, label=m)
                for lr, pt in pts:
                    ax.scatter([lr] * len(pt["final"]), [100 * v for v in pt["final"]], s=8, alpha=0.6,
                               color=line.get_color())
        ax.set_xscale("log")
        ax.set_title(f"{task} ({steps} steps)")
        ax.set_xlabel("AdamW peak lr (auto, kl: initial guess)")
        ax.set_ylabel("final held-out sampled accuracy (%)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


BEGIN, END = "<!-- task-claims: generated by benchmarks/task_claims.py; begin -->", "<!-- task-claims: end -->"


def report(task_roots: dict[str, list[Path]], out: Path) -> str:
    tasks = {t: collect(roots) for t, roots in task_roots.items()}
    cmd = " ".join(f"--task {t}={','.join(map(str, r))}" for t, r in task_roots.items())
    text = ["## The claims per task (generated)", "",
            f"Generated by `python benchmarks/task_claims.py report {cmd} --out {out}` from run folders' "
            "config.yaml and summary.json (and a kl run's logged target). 'oblr-kl': the kl schedule at the target that "
            f"is the default now ({default_target(16):g} at N = 16 with AdamW); kl runs at earlier targets are listed "
            "under each task's tables. 'beats'/'behind': Welch's t-test on the final accuracies over seeds, "
            "two-sided at 5 % (the difference of means beyond its standard error times Student's t at the "
            "Welch-Satterthwaite degrees of freedom: 2.8-4.3 with 3 seeds a side); otherwise 'within noise'. "
            "The numbers in brackets: the difference of means ± its standard error.", "",
            "![accuracy against lr per task](task_claims.png)", "", cross_table(tasks)]
    text += [task_tables(t, p, s) for t, (p, s) in tasks.items()]
    md = "\n".join(text)
    out.mkdir(parents=True, exist_ok=True)
    plot(tasks, out / "task_claims.png")
    (out / "task_claims.md").write_text(md, encoding="utf-8")
    return md


def splice(doc: Path, md: str, image_dir: str) -> None:
    """The report ``md`` as the marked section of ``doc``, its plot's path taken relative to ``doc``."""
    doc_sections.splice(doc, BEGIN, END, md.replace("](task_claims.png)", f"]({image_dir}/task_claims.png)"))


def parse_task(value: str) -> tuple[str, list[Path]]:
    name, sep, roots = value.partition("=")
    if not sep or not name or not roots:
        raise argparse.ArgumentTypeError(f"--task {value!r}: expected NAME=ROOT[,ROOT...]")
    return name, [Path(r) for r in roots.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grids", help="write the oblr compare grid of one task")
    g.add_argument("--task", required=True)
    g.add_argument("--steps", type=int, default=None, help=f"train.steps (default {PROTOCOL['train']['steps']})")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--only", default="", help="comma-separated methods: only their points (e.g. rloo-const,oblr-const "
                   "beside the built-in task's committed lr sweep)")
    g.add_argument("--name", default="grid-claims", help="the grid file's name without .yaml (default grid-claims; "
                   "e.g. grid-claims-kl for --only oblr-kl beside a grid already run)")
    r = sub.add_parser("report", help="per-task tables, the cross-task table and a PNG from run folders")
    r.add_argument("--task", type=parse_task, action="append", required=True, metavar="NAME=ROOT[,ROOT...]")
    r.add_argument("--out", type=Path, default=Path("outputs/task_claims"))
    r.add_argument("--results-doc", type=Path, help="also put the section into this markdown file, between markers")
    args = ap.parse_args(argv)
    if args.cmd == "grids":
        from oblr.tasks import TASKS

        if args.task not in TASKS:
            raise SystemExit(f"task_claims: --task {args.task!r} is not a registered task ({', '.join(TASKS)})")
        only = tuple(m for m in args.only.split(",") if m)
        unknown = [m for m in only if m not in METHODS]
        if unknown:
            raise SystemExit(f"task_claims: --only {', '.join(unknown)}: not a method ({', '.join(METHODS)})")
        print(write_grid(args.task, args.out, args.steps, only, args.name))
        return 0
    md = report(dict(args.task), args.out)
    print(md)
    if args.results_doc:
        splice(args.results_doc, md, os.path.relpath(args.out, args.results_doc.parent))
        print(f"updated the task-claims section of {args.results_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
