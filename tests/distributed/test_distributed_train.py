"""`oblr train` on 2 processes (CPU, gloo, one thread each) on the test-sized built-in model, for real.

A run killed with SIGKILL in one rank stops as a whole (torchrun ends the other rank; a generous deadline
turns a hang into a failure), leaves a resumable run folder, and ``--resume`` with the same world size
gives the trajectory of a 2-process run that was never interrupted. The uninterrupted run and the resume
go through ``oblr train --nproc 2`` (which starts torchrun), the killed one through torchrun directly.
Only rank 0 writes: one metrics file, rows with no duplicates.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fault_helpers import assert_same_trajectory, env, rows, train_args, train_rows

from oblr.train.checkpoint import latest_checkpoint, load_trainer_state

DEADLINE = 300  # seconds; only a hung run gets there
# the deterministic quantities of a step (times are not)
COMPARED = ("train/reward_mean", "optim/grad_norm", "optim/lr", "train/response_length_mean", "train/entropy",
            "optim/loss")
SNR = ("snr/S", "snr/V", "snr/snr")  # the SNR schedules' statistics
KL = ("policy/step_kl", "kl/target", "kl/stiffness", "kl/stiffness_avg")  # the kl schedule's (the default)
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


def _killed_run(model, out: Path, strategy: str, kill_rank: int, *extra: str) -> int:
    """A 2-process run under torchrun, SIGKILL to ``kill_rank`` once a checkpoint exists (wherever the step
    then is): the whole run must stop. Returns the step of the newest intact checkpoint."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "oblr.cli"]
    proc = subprocess.Popen([*torchrun, *train_args(model, out, 500, *COMMON, *extra, f"distributed.strategy={strategy}")],
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.time() + DEADLINE
        while not (out / "checkpoints" / "LATEST").is_file():  # a checkpoint, then the kill, wherever it lands
            assert proc.poll() is None, proc.stderr.read()[-5000:]
            assert time.time() < end, "the run never saved a checkpoint"
            time.sleep(0.05)
        pids = [_rank_pid(proc.pid, 0), _rank_pid(proc.pid, 1)]
        assert all(pids)
        os.kill(pids[kill_rank], signal.SIGKILL)
        _, err = proc.communicate(timeout=DEADLINE)  # the whole run stops: never a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "SIGKILL" in err and f"rank      : {kill_rank}" in err, err[-3000:]  # torchrun names the rank and why
    assert not _alive(pids[1 - kill_rank])  # the other rank was stopped too
    k = load_trainer_state(latest_checkpoint(out, deep=True))["step"]
    assert k >= 1
    return k


def test_ddp_killed_rank_stops_the_run_and_resume_gives_the_uninterrupted_trajectory(small_builtin, tmp_path):
    """With the snr_adam schedule (its momentum count is state the resume must restore): the lr of every step
    is 3e-3 x S / (S + kappa_k V / N) from the logged (smoothed) S and V, kappa_k of AdamW's beta1 0.9."""
    from oblr.snr import momentum_noise_share

    killed, straight = tmp_path / "killed", tmp_path / "straight"
    common = [*COMMON, "algorithm.lr_schedule=snr_adam"]
    k = _killed_run(small_builtin, killed, "ddp", 1, *common[len(COMMON):])
    # the run folder resumes (same world size), and an uninterrupted 2-process run gives the same trajectory
    _assert_ok(_oblr(train_args(small_builtin, killed, k + 2, *common) + ["--resume"]))
    _assert_ok(_oblr(train_args(small_builtin, straight, k + 2, *common)))  # --nproc 2: ddp
    assert_same_trajectory(killed, straight, k + 2, (*COMPARED, *SNR, "snr/n_eff", "snr/factor"))
    for step, r in train_rows(straight).items():
        kappa = momentum_noise_share(0.9, step)
        assert r["snr/n_eff"] == pytest.approx(2 / kappa, rel=1e-12)
        assert r["optim/lr"] == pytest.approx(3e-3 * r["snr/S"] / (r["snr/S"] + kappa * r["snr/V"] / 2), rel=1e-9)
    assert any(r["snr/S"] > 0 for r in train_rows(straight).values())
    # one metrics file, written by rank 0 (rows without duplicates: train_rows would hide them)
    assert _metrics_files(straight) == _metrics_files(killed) == ["metrics.jsonl"]
    lines = (straight / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len({line.split(",")[0] for line in lines}) == k + 3  # steps 0 (start) .. k + 2
    state = load_trainer_state(latest_checkpoint(straight))
    assert state["step"] == k + 2 and len(state["rng_ranks"]) == 2 and state["world_size"] == 2


def test_fsdp_run_resumes_after_a_kill_and_ends_with_a_consolidated_checkpoint(small_builtin, tmp_path):
    """fsdp: checkpoints hold the sharded model and optimizer state (torch.distributed.checkpoint); the
    writer (rank 0) is killed; the resumed run follows the uninterrupted one; the last checkpoint also has
    the consolidated Hugging Face weights, which load in one process and equal the shards. With the default
    kl schedule: its averaged stiffness is state the resume restores, and every step's lr is the rule's lr
    from the KL that every rank measured after the previous update."""
    import math
    from oblr.models import is_sharded_checkpoint, load_model_and_tokenizer

    killed, straight = tmp_path / "killed", tmp_path / "straight"
    evals = ["task.eval_size=3", "train.eval_samples=1"]  # at the start and the end; shares of 2 and 1 prompts
    k = _killed_run(small_builtin, killed, "fsdp", 0, *evals)
    _assert_ok(_oblr(train_args(small_builtin, killed, k + 2, *COMMON, *evals) + ["--resume"]))
    _assert_ok(_oblr(train_args(small_builtin, straight, k + 2, *COMMON, *evals, "distributed.strategy=fsdp")))
    assert_same_trajectory(killed, straight, k + 2, (*COMPARED, *KL))
    rs = train_rows(straight)
    assert all(r["policy/step_kl"] > 0 for r in rs.values())  # the signal task moves the policy every step
    assert rs[1]["optim/lr"] == pytest.approx(0.1 * 3e-3, rel=1e-12)  # the probe: 0.1 x optim.lr
    for step in range(1, k + 2):  # the kl rule (AdamW, N = 2: target 1.5e-3 x 2 / 128), capped at 2x growth
        r, nxt = rs[step], rs[step + 1]
        assert r["kl/target"] == pytest.approx(1.5e-3 * 2 / 128, rel=1e-12)
        want = math.sqrt(r["kl/target"] / r["kl/stiffness_avg"])
        assert nxt["optim/lr"] == pytest.approx(want if step == 1 else min(want, 2 * r["optim/lr"]), rel=1e-9), step
    ea, eb = ([r for r in rows(run) if "eval/accuracy_greedy" in r] for run in (killed, straight))
    assert [r["step"] for r in ea] == [r["step"] for r in eb] == [0, k + 2]  # evaluated at the start and the end
    for key in ("eval/accuracy_sampled", "eval/accuracy_greedy", "eval/response_length_mean"):
        assert ea[-1][key] == pytest.approx(eb[-1][key], rel=1e-6), key
    assert _metrics_files(straight) == ["metrics.jsonl"]

    last, before = (straight / "checkpoints" / f"step_{k + 2:06d}", straight / "checkpoints" / f"step_{k + 1:06d}")
    assert [p.name for p in sorted((straight / "checkpoints").glob("step_*"))] == [before.name, last.name]
    assert (before / "sharded").is_dir() and not list(before.glob("*.safetensors"))  # shards only
    assert (last / "sharded").is_dir() and list(last.glob("*.safetensors"))  # and the consolidated weights
    assert not is_sharded_checkpoint(last) and is_sharded_checkpoint(before)
    hf, _ = load_model_and_tokenizer(str(last))  # an ordinary Hugging Face checkpoint, one process
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    sd = hf.state_dict()
    from oblr.distributed.sharded_state import load_sharded_weights

    from_shards, _ = load_model_and_tokenizer(small_builtin)
    load_sharded_weights(last / "sharded", from_shards)  # the same step's shards, read in one process
    assert all(torch.equal(v, sd[n]) for n, v in from_shards.state_dict().items())
    mid, _ = load_model_and_tokenizer(str(before))  # a sharded-only checkpoint also loads in one process
    from oblr.cli import main as oblr_main

    exported = tmp_path / "exported"  # and `oblr export` writes it as an ordinary model folder
    assert oblr_main(["export", "--model", str(before), "--out", str(exported)]) == 0
    assert json.loads((exported / "oblr_export.json").read_text())["what"] == "shards gathered"
    assert (exported / "model.safetensors").is_file() and not (exported / "sharded").exists()
    gathered = load_model_and_tokenizer(str(exported))[0].state_dict()
    assert all(torch.equal(v, gathered[n]) for n, v in mid.state_dict().items())
    start, _ = load_model_and_tokenizer(small_builtin)
    assert all(not torch.equal(v, mid.state_dict()[n]) for n, v in start.state_dict().items())  # training moved them
    resumed = load_model_and_tokenizer(str(killed / "checkpoints" / last.name))[0].state_dict()
    assert all(torch.allclose(v, resumed[n], rtol=1e-5, atol=1e-7) for n, v in sd.items())


def test_fsdp_with_activation_checkpointing_follows_the_run_without_it(small_builtin, tmp_path):
    """fsdp + activation checkpointing (the memory plan 'two_pass': the two-pass norm engine, FSDP2's own
    backward filling the sharded .grad) on 2 processes: the plan is recorded, and each step equals the fsdp run
    without checkpointing (the one-pass engine with its sharded sink): the same samples, and at step 1 (same
    parameters) every statistic within 1e-5 -- S and the lr on the scale of their terms (S is a difference,
    ||gbar||^2 - V/N, so the engines' float32 rounding of the per-prompt norms moves it by ~1e-5 of V); the
    parameters then differ by that rounding, so steps 2-3 are held to 1e-3."""
    import json

    ckpt, plain = tmp_path / "ckpt", tmp_path / "plain"
    fsdp = ["train.save_every=0", "train.eval_every=0", "task.eval_size=0", "distributed.strategy=fsdp",
            "algorithm.lr_schedule=snr"]  # S and V are compared
    _assert_ok(_oblr(train_args(small_builtin, ckpt, 3, *fsdp, "algorithm.memory_plan=two_pass",
                                "algorithm.memory_budget_gb=8")))
    _assert_ok(_oblr(train_args(small_builtin, plain, 3, *fsdp)))
    plan = json.loads((ckpt / "summary.json").read_text())["memory_plan"]
    assert plan["checkpointing"] is True and plan["exact_norms"] is True
    ra, rb = train_rows(ckpt), train_rows(plain)
    assert sorted(ra) == sorted(rb) == [1, 2, 3]
    lr_max = max(r["optim/lr"] for r in rb.values())
    assert sum(r["snr/S"] > 0 for r in rb.values()) >= 2 and lr_max > 0
    for step in (1, 2, 3):
        a, b = ra[step], rb[step]
        tol = 1e-5 if step == 1 else 1e-3
        for key in ("train/reward_mean", "train/response_length_mean"):
            assert a[key] == b[key], (step, key)
        for key in ("optim/grad_norm", "snr/V", "optim/loss", "train/entropy"):
            assert a[key] == pytest.approx(b[key], rel=tol), (step, key)
        assert abs(a["snr/S"] - b["snr/S"]) <= tol * b["snr/V"], step
        assert abs(a["optim/lr"] - b["optim/lr"]) <= tol * lr_max, step
