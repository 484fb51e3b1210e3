"""Run grid rows at a pinned commit in the background, and import the finished runs into the repository.

    python scripts/pinned_runs.py run QUEUE --work DIR [--jobs 2]
    python scripts/pinned_runs.py import DIR/out/LABEL benchmarks/results/paper-regime/LABEL
    python scripts/pinned_runs.py status QUEUE --work DIR

A long grid must not move when the code does: each row trains at the commit it is pinned to, in a ``git
worktree`` of that commit, while this checkout goes on changing. ``QUEUE`` is a text file, one run per line
(``#`` starts a comment)::

    PIN LABEL CONFIG ROW SEED

``PIN`` a commit; ``LABEL`` the group the run belongs to (``countdown-sgd``: the folder it is imported into);
``CONFIG`` an ``oblr compare`` grid file, read from this checkout (the pinned code reads it as it is);
``ROW`` one of its ``runs`` names; ``SEED`` one seed (inside or outside the file's list).

``run`` checks every line before anything starts (the commit exists, the file parses, the row is in it, the seed
is an integer) and refuses the whole queue with the line number of the first bad one. Then, ``--jobs`` at a time,
it makes ``DIR/pins/PIN`` (a detached worktree, reused when there), cuts the file down to that one row and seed
(``DIR/configs``: a row trains the same whether its file holds it alone or among others, and a commit older than
``--only`` / ``--seeds`` runs it too) and calls ``python -m oblr compare --config CUT --out
DIR/out/LABEL/ROW-sSEED --jobs 1 train.threads=1`` with ``PYTHONPATH`` at the worktree's ``src``, one thread, its
output in ``DIR/logs``. It prints one line per run started and finished. Started again after an interrupt, it
resumes: ``oblr compare`` reuses a completed run and resumes one with a checkpoint.

The queue is live: each time a slot frees, ``run`` reads the file again and starts its first line whose run is not
completed, not already started by this runner and not claimed by another process, so lines can be added,
removed or reordered while it works (a file that no longer parses is said so and the last good reading kept). A
runner claims each run it starts with an OS lock on ``DIR/claims/LABEL/ROW-sSEED.claim``, held until that run
ends and released by the kernel however the runner ends; so two runners on one ``--work`` folder (two queues,
or one queue twice for more slots) never train the same run, and a runner started while another holds a run
skips it.

``status`` checks the queue as ``run`` does and prints, per line, where its run stands: completed (with its final
sampled accuracy), stopped (its summary's status; or a run with metrics that no process holds, neither a runner's
claim nor the trainer's lock: killed), in progress (training steps logged of the configured steps, and how long ago
its metrics were last written), or not started; then the counts. It starts nothing and can be called while ``run`` works.

``import`` copies each completed run under ``DIR/out/LABEL/*/ROW/seedK`` (its ``metrics.jsonl``,
``summary.json``, ``config.yaml``, ``code.json``) to ``DEST/ROW/seedK``, rewriting the run folder's absolute
path to the repository-relative destination, and refuses a file that would still name an absolute path of this
machine. A destination that exists is left alone (said so), never overwritten; an unfinished run is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import yaml

from oblr.file_lock import holder, try_lock  # oblr's one way to take and test a lock
from oblr.train.run_dir import lock_holder  # the trainer's own test of its run folder's lock

ROOT = Path(__file__).resolve().parents[1]
#: the files of a run folder that the repository keeps (plots and samples are regenerated, not committed)
KEPT = ("metrics.jsonl", "summary.json", "config.yaml", "code.json")


@dataclass(frozen=True)
class Job:
    line: int
    pin: str
    label: str
    config: Path
    row: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.row}-s{self.seed}"


def parse_queue(path: Path, root: Path = ROOT) -> list[Job]:
    """The queue's jobs, every line checked; ``ValueError`` names the first bad line."""
    jobs = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = raw.split("#", 1)[0].strip()
        if not text:
            continue
        where = f"{path}:{number}"
        parts = text.split()
        if len(parts) != 5:
            raise ValueError(f"{where}: expected 'PIN LABEL CONFIG ROW SEED', got {len(parts)} fields: {text!r}")
        pin, label, config, row, seed = parts
        if "/" in label or label in (".", ".."):
            raise ValueError(f"{where}: LABEL {label!r} must be a plain folder name")
        try:
            seed_value = int(seed)
        except ValueError:
            raise ValueError(f"{where}: SEED {seed!r} is not an integer") from None
        config_path = Path(config) if Path(config).is_absolute() else root / config
        if not config_path.is_file():
            raise ValueError(f"{where}: CONFIG {config} not found")
        try:
            grid = yaml.safe_load(config_path.read_text())
            names = [r["name"] for r in grid["runs"]]
        except (yaml.YAMLError, KeyError, TypeError) as exc:
            raise ValueError(f"{where}: CONFIG {config} is not an oblr compare grid file ({exc})") from None
        if row not in names:
            raise ValueError(f"{where}: ROW {row!r} is not in {config} (its rows: {', '.join(names)})")
        check = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{pin}^{{commit}}"],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise ValueError(f"{where}: PIN {pin!r} is not a commit of this repository")
        jobs.append(Job(number, pin, label, config_path, row, seed_value))
    if not jobs:
        raise ValueError(f"{path}: no runs in the queue")
    return jobs


def cut_config(config: Path, row: str, seed: int, out: Path) -> Path:
    """Write ``config`` reduced to the one row and seed to ``out``."""
    grid = yaml.safe_load(config.read_text())
    grid["runs"] = [r for r in grid["runs"] if r["name"] == row]
    grid["seeds"] = [seed]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(grid, sort_keys=False))
    return out


_WORKTREES = threading.Lock()  # `git worktree add` of one pin from two of this runner's threads: made once


def worktree(pin: str, work: Path, root: Path = ROOT) -> Path:
    """``work/pins/PIN``, a detached worktree of the commit (made once; a folder already there is reused)."""
    path = work / "pins" / pin
    with _WORKTREES:
        if not (path / "src" / "oblr").is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(path), pin], check=True,
                           capture_output=True, text=True)
    return path


def claim(job: Job, work: Path):
    """The job's claim: an open file on ``DIR/claims/LABEL/ROW-sSEED.claim`` holding an exclusive OS lock (keep it
    open while the run trains; closing it, or the process ending, releases it), or None when another process
    holds it."""
    path = work / "claims" / job.label / f"{job.name}.claim"
    path.parent.mkdir(parents=True, exist_ok=True)
    return try_lock(path)


def claimed_elsewhere(job: Job, work: Path) -> bool:
    """Another process holds the job's claim, or trains its run (the run folder's ``.oblr.lock``, held by
    ``oblr train``: a run started by hand or by a runner from before claims); creates nothing."""
    return (holder(work / "claims" / job.label / f"{job.name}.claim") is not None
            or lock_holder(run_dir(job, work)) is not None)


def data_dir(root: Path = ROOT) -> str:
    return os.environ.get("OBLR_DATA_DIR") or str(root.parent / "shared" / "data")


def run_job(job: Job, work: Path, root: Path = ROOT) -> int:
    tree = worktree(job.pin, work, root)
    cut = cut_config(job.config, job.row, job.seed, work / "configs" / job.label / f"{job.name}.yaml")
    out = work / "out" / job.label / job.name
    log = work / "logs" / job.label / f"{job.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), OBLR_DATA_DIR=data_dir(root),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "oblr", "compare", "--config", str(cut), "--out", str(out), "--jobs", "1",
           "train.threads=1"]
    start = time.time()
    print(f"[pinned] start  {job.pin} {job.label}/{job.name} (queue line {job.line}; log {log})", flush=True)
    with log.open("a") as handle:
        code = subprocess.run(cmd, cwd=tree, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    status = "done" if code == 0 else f"FAILED (exit {code}; see the log)"
    print(f"[pinned] {status:6} {job.pin} {job.label}/{job.name} in {(time.time() - start) / 60:.1f} min",
          flush=True)
    return code


def run_dir(job: Job, work: Path) -> Path:
    """Where ``run_job`` has ``oblr compare`` write the job's run: ``DIR/out/LABEL/ROW-sSEED/ROW/seedSEED``."""
    return work / "out" / job.label / job.name / job.row / f"seed{job.seed}"


def job_status(job: Job, work: Path, now: float | None = None) -> tuple[str, str]:
    """``(state, text)`` of the job's run: state ``completed``, ``stopped``, ``in progress`` or ``not started``."""
    run = run_dir(job, work)
    summary = run / "summary.json"
    if summary.is_file():
        try:
            s = json.loads(summary.read_text())
        except json.JSONDecodeError:
            s = {}
        if s.get("status") == "completed":
            acc = s.get("eval_accuracy_final")
            return "completed", "completed" + ("" if acc is None else f", final sampled accuracy {100 * acc:.1f} %")
        if s.get("status") not in (None, "running"):
            return "stopped", f"stopped ({s.get('status')}; see the log)"
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        steps = sum(1 for line in metrics.read_text().splitlines() if '"optim/lr"' in line)
        total = "?"
        if (run / "config.yaml").is_file():
            total = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("train", {}).get("steps", "?")
        age = ((time.time() if now is None else now) - metrics.stat().st_mtime) / 60
        where = f"step {steps} of {total}, metrics last written {age:.0f} min ago"
        if not claimed_elsewhere(job, work):
            return "stopped", f"stopped: {where}; no process holds it (killed?): a runner resumes it from its last checkpoint"
        return "in progress", where
    return "not started", "not started"


def queue_status(jobs: list[Job], work: Path, now: float | None = None) -> list[str]:
    """One line per job (its queue line, pin, label and name, where its run stands), then the counts."""
    lines, counts = [], {}
    for job in jobs:
        state, text = job_status(job, work, now)
        counts[state] = counts.get(state, 0) + 1
        lines.append(f"line {job.line:3} {job.pin} {job.label}/{job.name}: {text}")
    order = ("completed", "in progress", "stopped", "not started")
    lines.append(f"{len(jobs)} runs: " + ", ".join(f"{counts[k]} {k}" for k in order if k in counts))
    return lines


def import_runs(source: Path, dest: Path, root: Path = ROOT) -> list[str]:
    """Copy the completed runs under ``source/*/ROW/seedK`` to ``dest/ROW/seedK``; returns one line per run."""
    dest_rel = dest.resolve().relative_to(root.resolve()).as_posix() if dest.is_absolute() else dest.as_posix()
    dest_abs = root / dest_rel
    machine = str(source.resolve().parents[1])  # DIR of DIR/out/LABEL: worktrees, cut configs, runs
    said = []
    for seed_dir in sorted(source.resolve().glob("*/*/seed*")):
        summary = seed_dir / "summary.json"
        label = f"{seed_dir.parent.name}/{seed_dir.name}"
        if not summary.is_file() or '"status": "completed"' not in summary.read_text():
            said.append(f"skipped {label}: not completed")
            continue
        rel = f"{dest_rel}/{label}"
        target = root / rel
        if target.exists():
            said.append(f"left alone {rel}: already there")
            continue
        texts = {}
        for name in KEPT:
            text = (seed_dir / name).read_text().replace(str(seed_dir), rel)
            leftover = [line for line in text.splitlines() if machine in line]
            if leftover:
                raise ValueError(f"{seed_dir / name}: still names a path of this machine: {leftover[0][:200]}")
            texts[name] = text
        staging = dest_abs / f".{seed_dir.parent.name}-{seed_dir.name}.importing"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name, text in texts.items():
            (staging / name).write_text(text)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
        said.append(f"imported {rel}")
    if not said:
        said.append(f"nothing to import under {source} (expected {source}/*/ROW/seedK)")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a queue of pinned rows in the background, --jobs at a time")
    run.add_argument("queue", type=Path)
    run.add_argument("--work", type=Path, required=True, help="folder for worktrees, cut configs, runs and logs")
    run.add_argument("--jobs", type=int, default=2)
    imp = sub.add_parser("import", help="copy completed runs into the repository, paths made relative")
    imp.add_argument("source", type=Path, help="DIR/out/LABEL of a `run`")
    imp.add_argument("dest", type=Path, help="a folder inside the repository, e.g. benchmarks/results/paper-regime/LABEL")
    stat = sub.add_parser("status", help="where each run of a queue stands (starts nothing)")
    stat.add_argument("queue", type=Path)
    stat.add_argument("--work", type=Path, required=True, help="the --work folder of `run`")
    args = parser.parse_args(argv)
    if args.command == "status":
        try:
            jobs = parse_queue(args.queue)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for line in queue_status(jobs, args.work.resolve()):
            print(line)
        return 0
    if args.command == "import":
        try:
            for line in import_runs(args.source, args.dest):
                print(line)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        jobs = parse_queue(args.queue)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = args.work.resolve()
    for pin in dict.fromkeys(job.pin for job in jobs):  # made one by one before the runs start in parallel
        worktree(pin, work)
    print(f"[pinned] {len(jobs)} runs, {args.jobs} at a time, into {work} (the queue is read again as slots "
          "free)", flush=True)
    codes = run_queue(args.queue, jobs, work, args.jobs)
    failed = sum(code != 0 for code in codes)
    print(f"[pinned] {len(codes) - failed} done, {failed} failed", flush=True)
    return 1 if failed else 0


def completed(job: Job, work: Path) -> bool:
    """The job's run has a summary that says it completed (an unreadable one: not completed)."""
    try:
        return json.loads((run_dir(job, work) / "summary.json").read_text()).get("status") == "completed"
    except (OSError, ValueError, AttributeError):
        return False


def next_job(queue: Path, last: list[Job], skip: set, work: Path) -> tuple[Job | None, list[Job]]:
    """The queue read again (``last`` kept, and said, when it no longer parses or cannot be read) and its first
    job that is not completed, not in ``skip`` (by label and name: this runner's runs, and any it could not claim
    in this pass) and not claimed by another process."""
    try:
        jobs = parse_queue(queue)
    except (ValueError, OSError) as exc:
        print(f"[pinned] the queue cannot be read now ({exc}); going on with its last good reading", flush=True)
        jobs = last
    for job in jobs:
        if (job.label, job.name) in skip or completed(job, work) or claimed_elsewhere(job, work):
            continue
        return job, jobs
    return None, jobs


def run_queue(queue: Path, jobs: list[Job], work: Path, slots: int,
              run=lambda job, work: run_job(job, work)) -> list[int]:
    """Keep ``slots`` runs going from the live queue (:func:`next_job`), each under its claim; returns the exit
    codes of the runs this runner started, in the order they ended (a run that raised counts as exit 1, said so,
    and the runner goes on). A failed run is not retried by this runner (start it again, or another, for that)."""
    started: set = set()
    running: dict = {}
    codes: list[int] = []

    def claimed_run(job: Job, handle) -> int:
        try:
            return run(job, work)
        except Exception as exc:  # noqa: BLE001 - e.g. a worktree that could not be made: this run fails, not the queue
            print(f"[pinned] FAILED {job.pin} {job.label}/{job.name}: {type(exc).__name__}: {exc}", flush=True)
            return 1
        finally:
            handle.close()

    with ThreadPoolExecutor(max_workers=slots) as pool:
        while True:
            lost: set = set()  # runs whose claim another process took in this pass
            while len(running) < slots:
                job, jobs = next_job(queue, jobs, started | lost, work)
                if job is None:
                    break
                handle = claim(job, work)
                if handle is not None and (completed(job, work) or lock_holder(run_dir(job, work)) is not None):
                    handle.close()  # finished, or taken by a trainer, between the check and the claim
                    handle = None
                if handle is None:
                    lost.add((job.label, job.name))
                    continue
                started.add((job.label, job.name))
                running[pool.submit(claimed_run, job, handle)] = job
            if not running:
                return codes
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.pop(future)
                codes.append(future.result())


if __name__ == "__main__":
    sys.exit(main())
