"""Held-out accuracy gain of ``oblr train task.name=<task>`` with the default settings, per generated task.

    python benchmarks/task_gains.py                                   # countdown and word_problems
    python benchmarks/task_gains.py --tasks countdown --runs runs/task-gains
    python benchmarks/task_gains.py --cache-dir EMPTY_FOLDER         # build the models here (OBLR_BUILTIN=build),
                                                                      # the build inside the command

For each task it runs ``python -m oblr train task.name=<task> train.output_dir=<runs>/<task>`` (nothing
else is set: ``train.output_dir`` only names the run folder) and times the whole command. From the run's
``metrics.jsonl`` it reads the held-out sampled accuracy (``eval/accuracy_sampled``: ``task.eval_size``
prompts x ``train.eval_samples`` samples at T=1) at every evaluation, and from ``summary.json`` the
training wall time. Whether the task's built-in model was built during the command (first use, or an
outdated cache) is recorded with its build time and build-time accuracy (``oblr_builtin.json``). The load
average before and after each run and the CPU count are recorded too: the machine may be shared.

Writes ``<out>/task_gains.json`` and ``<out>/task_gains.md`` (a table); prints the table. Rows of tasks not
run this time are kept from an existing ``task_gains.json`` (``--tasks word_problems`` leaves the countdown row
as it was measured); a task run again replaces its own row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def loop_seconds(run_dir: Path) -> float | None:
    """Seconds from the step-0 evaluation's log row to the last row of ``metrics.jsonl``: the training loop
    without the model load or build (``summary.json``'s ``wall_seconds`` includes a first-use build)."""
    times = []
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            t = json.loads(line).get("time")
            if t is not None:
                times.append(float(t))
    return round(times[-1] - times[0], 1) if len(times) > 1 else None


def read_curve(run_dir: Path) -> list[tuple[int, float, float | None]]:
    """``(step, accuracy_sampled, accuracy_greedy)`` of every evaluation logged in ``run_dir``."""
    out = []
    with open(run_dir / "metrics.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if row.get("eval/accuracy_sampled") is not None:
                out.append((int(row["step"]), float(row["eval/accuracy_sampled"]), row.get("eval/accuracy_greedy")))
    return out


def run_task(task: str, runs: Path, env: dict) -> dict:
    from oblr.models import task_model_dir
    from oblr.models.builtin import METADATA_FILE
    from oblr.models.shipped import source, verified_dir
    from oblr.models.task_builtins import TASK_MODELS, is_current

    spec = TASK_MODELS[task]
    if source() == "shipped":  # the shipped bytes: nothing is built
        model_dir, built_here = verified_dir(spec.dirname), False
    else:
        model_dir = task_model_dir(spec)
        built_here = not is_current(model_dir, spec)
    run_dir = runs / task
    if run_dir.exists():
        raise SystemExit(f"task_gains: run folder {run_dir} exists; remove it or pass another --runs")
    cmd = [sys.executable, "-m", "oblr", "train", f"task.name={task}", f"train.output_dir={run_dir}"]
    load_before = os.getloadavg()
    t0 = time.monotonic()
    log = runs / f"{task}.log"
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"task_gains: {' '.join(cmd)} failed (exit {proc.returncode}); see {log}")
    summary = json.loads((run_dir / "summary.json").read_text())
    meta = json.loads((model_dir / METADATA_FILE).read_text())
    curve = read_curve(run_dir)
    first, last = curve[0], curve[-1]
    return {
        "task": task, "command": f"oblr train task.name={task}", "model": spec.name,
        "model_built_in_command": built_here, "model_build_seconds": meta.get("build_seconds"),
        "model_accuracy_sampled_at_build": meta.get("accuracy_sampled_t1"),
        "model_accuracy_greedy_at_build": meta.get("accuracy_greedy"),
        "steps": summary["steps"],
        "accuracy_sampled_initial": first[1], "accuracy_sampled_final": last[1],
        "gain_points": round(100 * (last[1] - first[1]), 2),
        "accuracy_greedy_initial": first[2], "accuracy_greedy_final": last[2],
        "curve": [{"step": s, "sampled": a, "greedy": g} for s, a, g in curve],
        "train_wall_seconds": summary.get("wall_seconds"), "train_loop_seconds": loop_seconds(run_dir),
        "command_wall_seconds": round(wall, 1),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(), "omp_num_threads": env.get("OMP_NUM_THREADS"),
    }


def previous_rows(path: Path) -> list[dict]:
    """The rows of an earlier ``task_gains.json`` (none if there is no such file); a broken one is one line."""
    if not path.is_file():
        return []
    try:
        rows = json.loads(path.read_text())
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "task" in r for r in rows):
            raise ValueError("not a list of rows with a 'task'")
    except ValueError as e:
        raise SystemExit(f"task_gains: cannot keep the earlier rows of {path}: {e}; move it away") from None
    return rows


def merge(rows: list[dict], row: dict) -> list[dict]:
    """``rows`` with ``row`` in place of the row of the same task (or appended), in task order."""
    from oblr.models.task_builtins import TASK_MODELS

    order = list(TASK_MODELS)
    kept = [r for r in rows if r["task"] != row["task"]] + [row]
    return sorted(kept, key=lambda r: order.index(r["task"]) if r["task"] in order else len(order))


def markdown(rows: list[dict]) -> str:
    lines = ["| command | sampled acc. step 0 -> end | gain (points) | greedy | run s (summary) | loop s (step 0 "
             "to end) | command s (build incl.) | model built in it | load avg 1m before/after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        greedy = ("-" if r["accuracy_greedy_initial"] is None
                  else f"{100 * r['accuracy_greedy_initial']:.1f} % -> {100 * r['accuracy_greedy_final']:.1f} %")
        loop = "-" if r.get("train_loop_seconds") is None else f"{r['train_loop_seconds']:.0f}"
        build = f"yes ({r['model_build_seconds']:.0f} s)" if r["model_built_in_command"] else "no (cached)"
        lines.append(f"| `{r['command']}` | {100 * r['accuracy_sampled_initial']:.1f} % -> "
                     f"{100 * r['accuracy_sampled_final']:.1f} % | {r['gain_points']:+.1f} | {greedy} | "
                     f"{r['train_wall_seconds']:.0f} | {loop} | {r['command_wall_seconds']:.0f} | {build} | "
                     f"{r['load_avg_before'][0]:.1f} / {r['load_avg_after'][0]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", default=["countdown", "word_problems"])
    p.add_argument("--runs", type=Path, default=Path("runs/task-gains"), help="parent of the run folders")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/tasks"))
    p.add_argument("--cache-dir", default=None, help="OBLR_CACHE_DIR for the runs, with OBLR_BUILTIN=build (models "
                                                      "built on this machine; an empty one includes the build)")
    args = p.parse_args(argv)
    from oblr.models.task_builtins import TASK_MODELS

    bad = [t for t in args.tasks if t not in TASK_MODELS]
    if bad:
        p.error(f"--tasks: no built-in model for {', '.join(bad)}; choose from {', '.join(TASK_MODELS)}")
    env = dict(os.environ)
    if args.cache_dir:  # models built on this machine into that cache, not the shipped ones
        env["OBLR_CACHE_DIR"] = os.path.abspath(args.cache_dir)
        os.environ["OBLR_CACHE_DIR"] = env["OBLR_CACHE_DIR"]  # task_model_dir() here must see the same cache
        env["OBLR_BUILTIN"] = os.environ["OBLR_BUILTIN"] = "build"
    args.runs.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = previous_rows(args.out / "task_gains.json")
    for task in args.tasks:  # the summary is rewritten after each task, so a stopped benchmark keeps its rows
        rows = merge(rows, run_task(task, args.runs, env))
        (args.out / "task_gains.json").write_text(json.dumps(rows, indent=2) + "\n")
        (args.out / "task_gains.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
