"""Check that a change leaves a short ``oblr train`` run's numbers bit for bit as they were.

    python scripts/same_numbers.py                      # HEAD against the working tree
    python scripts/same_numbers.py --base 699cf0d       # a commit against the working tree
    python scripts/same_numbers.py --base A --head B    # two commits
    python scripts/same_numbers.py --jobs 2             # two runs at a time

For each source tree (``--base``: a temporary ``git worktree`` of that commit; ``--head``: another worktree,
or by default this checkout as it is, uncommitted edits included) it runs ``python -m oblr train`` with
``PYTHONPATH`` at that tree's ``src`` -- the default config (built-in arithmetic task and model), one
thread, a fixed seed, ``train.steps`` steps with an evaluation every ``train.eval_every`` -- once per
case of :data:`CASES`, each into its own temporary run folder, and compares the two ``metrics.jsonl`` line
by line: the same steps, the same keys, and every value equal as parsed from JSON (NaN equals NaN), except
the keys in :data:`SKIPPED` (the wall-clock timestamp and durations). It prints one table row per case and exits 1 on any
difference (the first few differing values are listed), 2 when a run fails. Nothing printed names a path
of this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: every case runs with these settings (short, one thread, seeded; no plots or intermediate checkpoints)
COMMON = ("train.threads=1", "train.seed=0", "train.steps=12", "train.eval_every=6", "task.eval_size=50",
          "train.plots=false", "train.save_every=0")
#: name -> extra overrides; every case names its schedule, so a commit before the default changed (snr until
#: 959ed72, kl since) compares like for like: "default" is the default config, whatever it is at each commit
CASES = {
    "default": (),
    "snr": ("algorithm.lr_schedule=snr",),
    "kl": ("algorithm.lr_schedule=kl",),
    "kl+clip+track_snr": ("algorithm.lr_schedule=snr", "algorithm.kl_coef=0.05", "optim.grad_clip=0.5",
                          "algorithm.track_snr=true"),
    "grpo+constant": ("algorithm.baseline=grpo", "algorithm.lr_schedule=constant"),
    "snr+warmup+floor": ("algorithm.lr_schedule=snr", "optim.warmup_steps=4", "optim.eta_min=0.0002"),
    "auto+warmup+sgd": ("algorithm.lr_schedule=auto", "optim.warmup_steps=3", "optim.optimizer=sgd", "optim.lr=0.3"),
    "cosine+warmup": ("algorithm.baseline=rloo", "algorithm.lr_schedule=cosine", "optim.warmup_steps=3"),
}
#: keys left out of the comparison, different on every run: the row's wall-clock timestamp, and (a name
#: ending in "/" stands for every key it starts) the durations time/generate, time/norms, time/step, ...
SKIPPED = ("time", "time/")


def skipped(key: str) -> bool:
    return any(key.startswith(k) if k.endswith("/") else key == k for k in SKIPPED)


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def compare(rows_a: list[dict], rows_b: list[dict]) -> tuple[int, int, list[str]]:
    """``(rows, values compared, differences)`` of two metrics.jsonl files' rows (each a dict with ``step``)."""
    diffs, n_values = [], 0
    if len(rows_a) != len(rows_b):
        diffs.append(f"{len(rows_a)} rows against {len(rows_b)}")
    for ra, rb in zip(rows_a, rows_b):
        step = ra.get("step")
        keys_a = {k for k in ra if not skipped(k)}
        keys_b = {k for k in rb if not skipped(k)}
        for k in sorted(keys_a ^ keys_b):
            diffs.append(f"step {step}: key {k} only in {'base' if k in keys_a else 'head'}")
        for k in sorted(keys_a & keys_b):
            n_values += 1
            if not same(ra[k], rb[k]):
                diffs.append(f"step {step}: {k} = {ra[k]!r} against {rb[k]!r}")
    return len(rows_a), n_values, diffs


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def run(src: Path, case: str, out: Path) -> Path:
    """One ``oblr train`` run of ``case`` on the sources in ``src``; returns its metrics.jsonl."""
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "oblr", "train", *COMMON, *CASES[case], "--output-dir", str(out), "--quiet"]
    proc = subprocess.run(cmd, cwd=out.parent, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().replace(str(out.parent), "<tmp>")[-1500:]
        raise RuntimeError(f"case {case}: oblr train exited {proc.returncode}: {tail}")
    return out / "metrics.jsonl"


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the commit the numbers must equal (default HEAD)")
    ap.add_argument("--head", default=None, help="a commit to check (default: this checkout as it is)")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each uses one thread)")
    a = ap.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    base = git("rev-parse", "--short", a.base)
    head = git("rev-parse", "--short", a.head) if a.head else "working tree"
    if not a.head:
        head += f" (on {git('rev-parse', '--short', 'HEAD')})"
    with tempfile.TemporaryDirectory(prefix="same_numbers_") as tmp:
        tmp = Path(tmp)
        trees = {}
        try:
            for label, commit in (("base", a.base), ("head", a.head)):
                if commit is None:
                    trees[label] = ROOT / "src"
                    continue
                git("worktree", "add", "--detach", str(tmp / label), commit)
                trees[label] = tmp / label / "src"
            jobs = [(label, c) for c in cases for label in ("base", "head")]
            for label, c in jobs:
                (tmp / "runs" / label).mkdir(parents=True, exist_ok=True)
            with ThreadPoolExecutor(max(1, a.jobs)) as pool:
                futs = {j: pool.submit(run, trees[j[0]], j[1], tmp / "runs" / j[0] / j[1]) for j in jobs}
                try:
                    paths = {j: f.result() for j, f in futs.items()}
                except RuntimeError as e:
                    print(f"same_numbers: {e}", file=sys.stderr)
                    return 2
        finally:
            for label in ("base", "head"):
                if (tmp / label).exists():
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / label)],
                                   capture_output=True)
        print(f"base: {base}   head: {head}")
        print(f"every case: oblr train {' '.join(COMMON)}")
        print(f"compared: every key of every metrics.jsonl row except {', '.join(k + '*' if k.endswith('/') else k for k in SKIPPED)} "
              "(wall-clock timestamp and durations)")
        print()
        print("| case | extra overrides | rows | values compared | differences |")
        print("|---|---|---|---|---|")
        bad = []
        for c in cases:
            rows, n, diffs = compare(read_rows(paths[("base", c)]), read_rows(paths[("head", c)]))
            print(f"| {c} | {' '.join(CASES[c]) or '(none)'} | {rows} | {n} | {len(diffs)} |")
            bad += [f"{c}: {d}" for d in diffs]
        print()
        if bad:
            print("DIFFERENT:")
            for d in bad[:20]:
                print(f"  {d}")
            return 1
        print("identical: every compared value of every case is equal bit for bit")
        return 0


if __name__ == "__main__":
    sys.exit(main())
