"""`python -m oblr` under torchrun, for real (CPU, gloo, one thread per process, the test-sized model).

``torchrun --nproc_per_node 2 -m oblr train ...`` with the default ``distributed.strategy`` (none) trains
with ddp and says so; two torchrun launchers joined by a c10d rendezvous on localhost (``--nnodes 2``, one
process each: multi-node on one machine) train the same trajectory as the single 2-process launcher.
Every launcher runs in its own process group, killed whole at the deadline, so a hang is a failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from fault_helpers import assert_same_trajectory, env, train_args

DEADLINE = 300  # seconds; only a hung launch gets there
STEPS = 2
# the default kl schedule: its lr follows the KL every rank measured after the previous update
COMPARED = ("train/reward_mean", "optim/grad_norm", "optim/lr", "policy/step_kl", "kl/stiffness_avg",
            "train/response_length_mean", "train/entropy", "optim/loss")
COMMON = ["train.save_every=0", "train.eval_every=0", "task.eval_size=0"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(launchers: list[list[str]], args: list[str]) -> list[tuple[int, str]]:
    """Start every launcher with ``-m oblr`` + ``args``; ``(returncode, stderr)`` of each (all killed at the
    deadline)."""
    procs = [subprocess.Popen([*TORCHRUN, *launcher, "-m", "oblr", *args], env=env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for launcher in launchers]
    results = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=DEADLINE)
            results.append((proc.returncode, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return results


def test_torchrun_module_default_strategy_becomes_ddp_and_two_nodes_match_one(small_builtin, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    [(rc, err)] = _launch([["--standalone", "--nproc_per_node", "2"]], train_args(small_builtin, one, STEPS, *COMMON))
    assert rc == 0, err[-5000:]
    assert err.count("distributed.strategy none becomes ddp") == 1, err[-3000:]  # rank 0 says it, once
    port = _free_port()
    node = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_id", "oblr-test",
            "--rdzv_endpoint", f"localhost:{port}"]
    results = _launch([[*node, "--node_rank", "0"], [*node, "--node_rank", "1"]],
                      train_args(small_builtin, two, STEPS, *COMMON))
    for rc, err in results:
        assert rc == 0, err[-5000:]
    assert_same_trajectory(one, two, STEPS, COMPARED)
    assert "strategy: ddp" in (two / "config.yaml").read_text()
