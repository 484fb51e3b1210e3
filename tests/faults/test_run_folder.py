"""Run folders: one process at a time (OS lock), a folder that never saved a checkpoint resumes from step
0 with its own config, orphaned temporary checkpoints are removed on resume."""

from __future__ import annotations

import json
import signal

from fault_helpers import start, stop, train_args, train_rows, wait_for

from oblr.cli import main


def test_second_process_is_refused_while_the_first_runs_and_a_killed_run_leaves_no_lock(small_builtin, tmp_path,
                                                                                         capsys):
    out = tmp_path / "run"
    first = start(train_args(small_builtin, out, 500, "train.save_every=1", "train.eval_every=0"))
    try:
        wait_for(first, lambda: (out / "checkpoints" / "LATEST").is_file())
        before = (out / "metrics.jsonl").read_text()
        # (steps=1: were it not refused, it would finish at once instead of running beside the first)
        assert main(train_args(small_builtin, out, 1, "train.save_every=1", "train.eval_every=0")
                    + ["--resume"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"run folder {out} is in use" in err and f"pid {first.pid}" in err, err
        assert (out / "metrics.jsonl").read_text().startswith(before)  # nothing of the first run touched
    finally:
        rc, _, _ = stop(first, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    done = max(train_rows(out))
    # the kernel released the dead process's lock: the folder resumes at once
    assert main(train_args(small_builtin, out, done + 1, "train.save_every=1", "train.eval_every=0")
                + ["--resume"]) == 0
    assert max(train_rows(out)) == done + 1


def test_interrupted_before_its_first_checkpoint_resumes_from_step_0_with_its_saved_config(small_builtin,
                                                                                           tmp_path, capsys):
    """Ctrl-C while the first evaluation runs (no step done): the message says no checkpoint was saved;
    `oblr train --resume --output-dir DIR` with nothing else runs the saved config (its model, its steps)."""
    out = tmp_path / "run"
    proc = start(train_args(small_builtin, out, 2, "task.eval_size=64", "train.eval_samples=4",
                            "rollout.max_new_tokens=24", quiet=False))
    wait_for(proc, lambda: (out / "metrics.jsonl").is_file())  # set up; the first evaluation is running
    rc, stdout, stderr = stop(proc)
    assert rc == 130, stderr[-2000:]
    if train_rows(out):  # the machine was slow to deliver the signal: a step finished; nothing to test
        import pytest

        pytest.skip("the first step completed before the signal arrived")
    assert "no checkpoint was saved" in stdout and "checkpoint saved" not in stdout, stdout[-1000:]
    assert json.loads((out / "summary.json").read_text())["steps"] == 0
    capsys.readouterr()
    assert main(["train", "--plugin", "signal_task", "--resume", "--output-dir", str(out), "--quiet"]) == 0
    assert sorted(train_rows(out)) == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["status"] == "completed"


def test_a_run_folder_without_a_checkpoint_and_no_rows_is_reusable(small_builtin, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("train:\n  steps: 1\n")
    (out / "metrics.jsonl").write_text("")  # a run that stopped (a late error) before it logged anything
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0")) == 0
    assert sorted(train_rows(out)) == [1]


def test_orphaned_temporary_checkpoints_are_removed_on_resume(small_builtin, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0")) == 0
    orphan = out / "checkpoints" / ".step_000002.tmp99999"  # what a kill in the middle of a save leaves
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"\0" * 1000)
    assert main(train_args(small_builtin, out, 2, "train.eval_every=0") + ["--resume"]) == 0
    assert not orphan.exists()
    assert ".step_000002.tmp99999" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["LATEST", "step_000001", "step_000002"]
