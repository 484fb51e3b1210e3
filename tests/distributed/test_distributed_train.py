"""`oblr train` on 2 processes (CPU, gloo, one thread each) on the test-sized built-in model, for real.

A run killed with SIGKILL in one rank stops as a whole (torchrun ends the other rank; a generous deadline
turns a hang into a failure), leaves a resumable run folder, and ``--resume`` with the same world size
gives the trajectory of a 2-process run that was never interrupted. The uninterrupted run and the resume
go through ``oblr train --nproc 2`` (which starts torchrun), the killed one through torchrun directly.
Only rank 0 writes: one metrics file, rows with no duplicates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fault_helpers import env, train_args, train_rows

from oblr.train.checkpoint import latest_checkpoint, load_trainer_state

DEADLINE = 300  # seconds; only a hung run gets there
# the deterministic quantities of a step (times are not)
COMPARED = ("train/reward_mean", "optim/grad_norm", "optim/lr", "snr/S", "snr/V", "snr/snr",
            "train/response_length_mean", "train/entropy", "optim/loss")
COMMON = ["train.save_every=1", "train.eval_every=0", "task.eval_size=0"]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of torchrun's worker with ``RANK=rank`` (read from its environment), or None (not started)."""
    for pid in _children(launcher):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.is_file() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _oblr(args: list[str], *, nproc: int | None = 2) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "oblr.cli", *args, *(["--nproc", str(nproc)] if nproc else [])]
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=DEADLINE)


def _assert_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def _metrics_files(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*.jsonl*") if "samples" not in p.parts)


def test_killed_rank_stops_the_run_and_resume_gives_the_uninterrupted_trajectory(small_builtin, tmp_path):
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "oblr.cli"]
    proc = subprocess.Popen([*torchrun, *train_args(small_builtin, killed, 500, *COMMON,
                                                    "distributed.strategy=ddp")],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + DEADLINE
        while not (killed / "checkpoints" / "LATEST").is_file():  # a checkpoint, then the kill, wherever it lands
            assert proc.poll() is None, proc.stderr.read()[-5000:]
            assert time.time() < end, "the run never saved a checkpoint"
            time.sleep(0.05)
        rank0, rank1 = _rank_pid(proc.pid, 0), _rank_pid(proc.pid, 1)
        assert rank0 and rank1
        os.kill(rank1, signal.SIGKILL)
        _, err = proc.communicate(timeout=DEADLINE)  # the whole run stops: never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "SIGKILL" in err and "rank" in err, err[-3000:]  # torchrun names the rank that died and why
    assert not _alive(rank0)  # the other rank was stopped too
    k = load_trainer_state(latest_checkpoint(killed, deep=True))["step"]
    assert k >= 1

    # the run folder resumes (same world size), and an uninterrupted 2-process run gives the same trajectory
    _assert_ok(_oblr(train_args(small_builtin, killed, k + 2, *COMMON) + ["--resume"]))
    _assert_ok(_oblr(train_args(small_builtin, straight, k + 2, *COMMON)))
    ra, rb = train_rows(killed), train_rows(straight)
    assert sorted(ra) == sorted(rb) == list(range(1, k + 3))
    for step in range(1, k + 3):
        for key in COMPARED:
            assert ra[step][key] == pytest.approx(rb[step][key], rel=1e-6, abs=1e-12), (step, key)
    # one metrics file, written by rank 0 (rows without duplicates: train_rows would hide them)
    assert _metrics_files(straight) == _metrics_files(killed) == ["metrics.jsonl"]
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len({line.split(",")[0] for line in lines}) == k + 3  # steps 0 (start) .. k + 2
    state = load_trainer_state(latest_checkpoint(straight))
    assert state["step"] == k + 2 and len(state["rng_ranks"]) == 2
