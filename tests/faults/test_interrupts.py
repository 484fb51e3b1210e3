"""Ctrl-C and SIGTERM (real signals to a real `oblr train` process): the resumed run equals the run that was
never interrupted, and summary.json describes what metrics.jsonl holds, also when the signal lands in an
evaluation."""

from __future__ import annotations

import json
import signal
import time

import pytest
from fault_helpers import assert_same_trajectory, rows, start, stop, train_args, train_rows, wait_for

from oblr.cli import main
from oblr.train.checkpoint import latest_checkpoint, load_trainer_state

# the default kl schedule: its averaged stiffness is the state a resume must restore for the same lrs
COMPARED = ("train/reward_mean", "optim/grad_norm", "optim/lr", "policy/step_kl", "kl/stiffness_avg",
            "train/response_length_mean", "train/entropy")


@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"),
                                               (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_then_resume_equals_the_uninterrupted_run(small_builtin, tmp_path, sig, status, word):
    """SIGTERM (``kill PID``, a scheduler ending the job) takes Ctrl-C's path: checkpoint of the last completed
    step, summary written, exit status 143."""
    a, b = tmp_path / "interrupted", tmp_path / "straight"
    common = ["train.save_every=0", "train.eval_every=0", "task.eval_size=0"]
    proc = start(train_args(small_builtin, a, 500, *common))
    wait_for(proc, lambda: len(train_rows(a)) >= 1)
    # into the next step by half a step's time, so the signal most likely lands after it drew random numbers
    # (where a checkpoint with the RNG state of the moment diverges); the assertions hold wherever it lands
    time.sleep(0.5 * train_rows(a)[1]["time/step"])
    rc, _, err = stop(proc, sig)
    assert rc == status and err.strip().endswith(f"oblr: {word}"), err[-2000:]
    assert json.loads((a / "summary.json").read_text())["status"] == "interrupted"
    k = load_trainer_state(latest_checkpoint(a))["step"]
    assert sorted(train_rows(a)) == list(range(1, k + 1))  # the checkpoint is the last step logged
    assert main(train_args(small_builtin, a, k + 2, *common) + ["--resume"]) == 0
    assert main(train_args(small_builtin, b, k + 2, *common)) == 0
    assert_same_trajectory(a, b, k + 2, COMPARED)


def test_ctrl_c_during_evaluation_summary_matches_the_metrics_file(small_builtin, tmp_path):
    """Every step evaluates on many prompts, so the signal most likely lands in an evaluation; whatever it
    hits, summary.json says how many steps metrics.jsonl holds and its final accuracy is the last logged."""
    out = tmp_path / "run"
    proc = start(train_args(small_builtin, out, 500, "train.save_every=0", "train.eval_every=1",
                            "task.eval_size=48", "train.eval_samples=2"))
    wait_for(proc, lambda: len(train_rows(out)) >= 1)
    rc, _, err = stop(proc)
    assert rc == 130, err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    logged = rows(out)
    steps = max(train_rows(out))
    evals = [r for r in logged if "eval/accuracy_sampled" in r]
    assert summary["status"] == "interrupted" and summary["steps"] == steps
    assert max(r["step"] for r in logged) == steps
    assert summary["eval_accuracy_final"] == evals[-1]["eval/accuracy_sampled"]
    assert summary["eval_accuracy_initial"] == evals[0]["eval/accuracy_sampled"]
    assert load_trainer_state(latest_checkpoint(out))["step"] == steps


def test_three_quick_ctrl_c_end_with_the_checkpoint_and_one_line(small_builtin, tmp_path):
    """Ctrl-C pressed three times in a row: the later ones land in the wrap-up (checkpoint, summary, exit) and
    are acknowledged, not obeyed: the last completed step is saved, no traceback, the status is 130."""
    out = tmp_path / "run"
    proc = start(train_args(small_builtin, out, 500, "train.save_every=0", "train.eval_every=0", "task.eval_size=0"))
    wait_for(proc, lambda: len(train_rows(out)) >= 1)
    for _ in range(2):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    rc, _, err = stop(proc)  # the third
    assert rc == 130 and "Traceback" not in err and err.strip().endswith("oblr: interrupted"), err[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    k = load_trainer_state(latest_checkpoint(out))["step"]
    assert k == summary["steps"] == max(train_rows(out))  # the checkpoint is the last step logged
