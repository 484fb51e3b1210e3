"""Helpers of tests/faults: short `oblr train` runs on the test-sized built-in model, as real subprocesses
that get real signals, and in-process; file-system faults made with real mounts in a private namespace.

Nothing here waits a fixed time: a signal is sent once the run has logged what the test needs (polled
from metrics.jsonl), and every wait has a generous deadline that only a hung process reaches.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# the stub task with non-zero rewards (signal_task.py), so steps really move the weights and the SNR state
TINY = ["task.name=_test_signal_stub", "rollout.prompts_per_step=2", "rollout.group_size=4",
        "rollout.max_new_tokens=16", "train.threads=1", "train.plots=false", "task.eval_size=4",
        "train.eval_samples=1", "optim.optimizer=adamw", "optim.lr=3e-3", "optim.snr_ema=0.9"]
DEADLINE = 300  # seconds; only a hung run gets there


def train_args(model, out, steps, *extra, quiet=True):
    return ["train", "--plugin", "signal_task", f"model.name_or_path={model}", f"train.steps={steps}", *TINY,
            *extra, "--output-dir", str(out), *(["--quiet"] if quiet else [])]


def env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1"}


def start(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "oblr.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(), preexec_fn=sigint_default)


def sigint_default() -> None:
    """In the child before exec: SIGINT back to its default, so Python turns it into KeyboardInterrupt even
    when the test runner itself ignores SIGINT (a shell starts background jobs with SIGINT ignored, and
    children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def rows(out) -> list[dict]:
    path = Path(out) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def train_rows(out) -> dict[int, dict]:
    return {r["step"]: r for r in rows(out) if "train/reward_mean" in r}


def assert_same_trajectory(a, b, steps: int, keys) -> None:
    """Runs ``a`` and ``b`` logged steps 1..``steps`` with the same ``keys`` at every step (rel 1e-6)."""
    ra, rb = train_rows(a), train_rows(b)
    assert sorted(ra) == sorted(rb) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        for key in keys:
            assert ra[step][key] == pytest.approx(rb[step][key], rel=1e-6, abs=1e-12), (step, key)


def wait_for(proc: subprocess.Popen, ready) -> None:
    """Poll until ``ready()``; fails with the process's output if it ended first or the deadline passed."""
    end = time.time() + DEADLINE
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"process ended (rc {proc.returncode}) before it was ready:\n{proc.stderr.read()[-3000:]}")
        if time.time() > end:
            proc.kill()
            pytest.fail("process never got ready")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, sig=signal.SIGINT) -> tuple[int, str, str]:
    """Send ``sig`` and wait for the process; (returncode, stdout, stderr)."""
    try:
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def in_namespace(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) as root in a private mount namespace (``unshare -rm``), so it may mount a tmpfs
    and remount it read-only without touching the machine. Skips with the reason when that is impossible."""
    if not shutil.which("unshare"):
        pytest.skip("needs unshare(1) to make file-system faults with real mounts")
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {tmp_path}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount in a private namespace here (not root, no user namespaces): "
                    f"{probe.stderr.strip()[:200]}")
    return subprocess.run(["unshare", "-rm", "sh", "-c", "set -u\n" + script], capture_output=True, text=True,
                          env=env(), timeout=DEADLINE)
