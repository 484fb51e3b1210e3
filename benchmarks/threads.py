"""Seconds per training step at train.threads = 1, 2 and the default 0, on a machine loaded by busy loops.

torch's OpenMP threads spin while they wait for each other, so a run with as many threads as cores slows
down badly when other processes keep those cores busy. The default ``train.threads=0`` takes the cores
that other work leaves free (:mod:`oblr.train.threads`); this measures it against fixed counts.

For each ``--busy`` count B: start B processes that spin (``while True: pass``), wait ``--settle`` seconds
(the 1-minute load average the rule reads needs about a minute to see them), then run a short default
``oblr train`` (``--steps`` steps, a small evaluation at the start and the end only) once per
``--threads`` value, with ``OMP_NUM_THREADS`` unset so the default rule applies. The figure is the median of
the logged ``time/step`` over the steps after the first (evaluation excluded). Each run's own line
``[oblr] torch threads: N (...)`` says what the default chose and the load it saw. Prints a table of
seconds per step and their ratio to ``train.threads=1`` at the same load and writes it to ``--out``
(default ``benchmarks/results/threads/threads.md``).

    python benchmarks/threads.py                                  # busy 0 and 2, threads 1, 2, 0
    python benchmarks/threads.py --busy 0 2 --threads 1 2 0 --steps 5 --settle 60 --model builtin

The machine's other work is not controlled: the load each run saw is in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "threads" / "threads.md"
CHOSEN = re.compile(r"\[oblr\] torch threads: (\d+) \(([^)]*)\)")
SMALL_EVAL = ["train.eval_every=0", "task.eval_size=16", "train.eval_samples=1", "train.eval_greedy=false",
              "train.plots=false", "train.save_every=0"]


def train_command(threads: int, steps: int, model: str, out_dir: Path) -> list[str]:
    return [sys.executable, "-m", "oblr", "train", f"train.threads={threads}", f"train.steps={steps}",
            f"model.name_or_path={model}", *SMALL_EVAL, "--output-dir", str(out_dir)]


def seconds_per_step(metrics_file: Path) -> float:
    """Median ``time/step`` over the steps after the first (which also warms up)."""
    times = [r["time/step"] for r in map(json.loads, metrics_file.read_text().splitlines()) if "time/step" in r]
    if len(times) < 2:
        raise RuntimeError(f"{metrics_file}: fewer than 2 steps logged")
    return statistics.median(times[1:])


def run_one(threads: int, steps: int, model: str, log) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        t0 = time.time()
        proc = subprocess.run(train_command(threads, steps, model, out), capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"train.threads={threads}: oblr train exited {proc.returncode}: "
                               f"{proc.stderr.strip()[-2000:]}")
        sps = seconds_per_step(out / "metrics.jsonl")
    m = CHOSEN.search(proc.stdout + proc.stderr)
    row = {"threads": threads, "used": int(m.group(1)) if m else threads, "seen": m.group(2) if m else "",
           "load_avg_1min": round(load_before, 2), "s_per_step": sps, "wall_s": round(time.time() - t0, 1)}
    log(f"  train.threads={threads}: {sps:.2f} s/step with {row['used']} thread(s)"
        + (f" (default chose it: {row['seen']})" if m else "") + f", {row['wall_s']:.0f} s in all")
    return row


def spin() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def measure(busy_counts: list[int], thread_values: list[int], steps: int, settle: float, model: str,
            log=print) -> list[dict]:
    rows = []
    for busy in busy_counts:
        procs = [spin() for _ in range(busy)]
        try:
            if busy:
                log(f"{busy} busy loop(s) started; waiting {settle:.0f} s for the load average to see them")
                time.sleep(settle)
            else:
                log("no busy loops")
            for threads in thread_values:
                rows.append({"busy": busy, **run_one(threads, steps, model, log)})
        finally:
            for p in procs:
                p.kill()
                p.wait()
    return rows


def table(rows: list[dict]) -> list[str]:
    out = ["| busy loops | train.threads | threads used | load the default saw | s/step | ratio to threads=1 |",
           "|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        one = next((x["s_per_step"] for x in rows if x["busy"] == r["busy"] and x["threads"] == 1), None)
        ratio = f"{r['s_per_step'] / one:.2f}" if one else "-"
        name = "0 (default)" if r["threads"] == 0 else str(r["threads"])
        out.append(f"| {r['busy']} | {name} | {r['used']} | {r['seen'] or '-'} | {r['s_per_step']:.2f} | {ratio} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2], help="busy-loop processes per phase")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 0], help="train.threads values (0: default)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--settle", type=float, default=60.0, help="seconds between starting busy loops and the runs")
    ap.add_argument("--model", default="builtin", help="model.name_or_path of the runs")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    if args.steps < 2 or any(b < 0 for b in args.busy) or any(t < 0 for t in args.threads):
        ap.error("--steps must be >= 2, --busy and --threads >= 0")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    t0 = time.time()
    rows = measure(args.busy, args.threads, args.steps, args.settle, args.model)
    lines = table(rows)
    print("\n".join(lines))
    model = ("the built-in arithmetic model" if args.model == "builtin" else
             f"the model folder `{Path(args.model).name}` (DIR)")
    doc = ["# Seconds per step against train.threads on a loaded machine\n",
           f"Written by `python benchmarks/threads.py --busy {' '.join(map(str, args.busy))} --threads "
           f"{' '.join(map(str, args.threads))} --steps {args.steps} --settle {args.settle:g}"
           f"{'' if args.model == 'builtin' else ' --model DIR'}` on "
           f"{time.strftime('%Y-%m-%d')}: {cores} cores ({platform.machine()}), Python {platform.python_version()}, "
           f"{model}, default `oblr train` settings with {args.steps} steps and a small evaluation; "
           f"{time.time() - t0:.0f} s in all. s/step: median `time/step` over the steps after the first. "
           "The machine's other work was not controlled; `load the default saw` is the rule's estimate of the "
           "cores busy with other work when the run started (`train.threads=0` only).\n",
           *lines, ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(doc), encoding="utf-8")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
