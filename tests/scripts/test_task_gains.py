"""benchmarks/task_gains.py's bookkeeping with the training command replaced by a fake that writes a run
folder: the command it runs, the gain from the first to the last evaluation, the build flag, the summary
files (written after each task) and the table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import task_gains


def _fake_train(curves: dict):
    calls = []

    def run(cmd, env, stdout, stderr):
        calls.append(cmd)
        task = next(a.split("=", 1)[1] for a in cmd if a.startswith("task.name="))
        run_dir = Path(next(a.split("=", 1)[1] for a in cmd if a.startswith("train.output_dir=")))
        run_dir.mkdir(parents=True)
        rows = [{"step": s, "eval/accuracy_sampled": a, "eval/accuracy_greedy": g} for s, a, g in curves[task]]
        rows.insert(1, {"step": 1, "train/reward_mean": 0.5})  # a training row: not an evaluation
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run_dir / "summary.json").write_text(json.dumps({"steps": 200, "wall_seconds": 12.5}))
        from oblr.models import task_model_dir
        from oblr.models.builtin import METADATA_FILE
        from oblr.models.task_builtins import TASK_MODELS

        d = task_model_dir(TASK_MODELS[task])
        d.mkdir(parents=True, exist_ok=True)
        (d / METADATA_FILE).write_text(json.dumps({"build_seconds": 3.0, "accuracy_sampled_t1": 0.1,
                                                   "accuracy_greedy": 0.3}))
        return subprocess.CompletedProcess(cmd, 0)

    return run, calls


def test_summary_and_table(tmp_path, monkeypatch):
    curves = {"countdown": [(0, 0.125, 0.3), (100, 0.2, 0.3), (200, 0.25, 0.325)],
              "word_problems": [(0, 0.3, 0.6), (200, 0.35, 0.6)]}
    run, calls = _fake_train(curves)
    monkeypatch.setattr(task_gains.subprocess, "run", run)
    monkeypatch.delenv("OBLR_CACHE_DIR", raising=False)
    monkeypatch.delenv("OBLR_BUILTIN", raising=False)  # main() sets it with --cache-dir; restored after
    out = tmp_path / "out"
    assert task_gains.main(["--runs", str(tmp_path / "runs"), "--out", str(out),
                            "--cache-dir", str(tmp_path / "cache")]) == 0
    assert [c[3:] for c in calls] == [["train", "task.name=countdown", f"train.output_dir={tmp_path}/runs/countdown"],
                                      ["train", "task.name=word_problems",
                                       f"train.output_dir={tmp_path}/runs/word_problems"]]
    rows = json.loads((out / "task_gains.json").read_text())
    assert [r["gain_points"] for r in rows] == [12.5, 5.0]
    assert rows[0]["model_built_in_command"] is True and rows[0]["curve"][1] == {"step": 100, "sampled": 0.2,
                                                                                  "greedy": 0.3}
    table = (out / "task_gains.md").read_text()
    assert "| `oblr train task.name=countdown` | 12.5 % -> 25.0 % | +12.5 | 30.0 % -> 32.5 % | 12 | - |" in table
    with pytest.raises(SystemExit, match="exists"):  # a second run into the same folders is refused
        task_gains.main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--tasks", "countdown"])


def test_unknown_task_is_one_line(capsys):
    with pytest.raises(SystemExit):
        task_gains.main(["--tasks", "arithmetic"])
    assert "no built-in model for arithmetic" in capsys.readouterr().err


def test_rows_of_tasks_not_run_are_kept(tmp_path, monkeypatch):
    """``--tasks word_problems`` keeps the countdown row of an earlier task_gains.json as it was, replaces the
    word_problems row, and keeps the task order; a broken earlier file is refused in one line before any run."""
    out = tmp_path / "out"
    out.mkdir()
    old_countdown = {"task": "countdown", "gain_points": 10.25, "marker": "measured earlier"}
    old_words = {"task": "word_problems", "gain_points": 0.4}
    (out / "task_gains.json").write_text(json.dumps([old_words, old_countdown]))
    run, calls = _fake_train({"word_problems": [(0, 0.3, 0.6), (200, 0.42, 0.6)]})
    monkeypatch.setattr(task_gains.subprocess, "run", run)
    monkeypatch.setattr(task_gains, "markdown", lambda rows: "")  # the old rows lack the table's fields
    monkeypatch.delenv("OBLR_CACHE_DIR", raising=False)
    monkeypatch.delenv("OBLR_BUILTIN", raising=False)  # main() sets it with --cache-dir; restored after
    assert task_gains.main(["--runs", str(tmp_path / "runs"), "--out", str(out), "--tasks", "word_problems",
                            "--cache-dir", str(tmp_path / "cache")]) == 0
    rows = json.loads((out / "task_gains.json").read_text())
    assert [r["task"] for r in rows] == ["countdown", "word_problems"]
    assert rows[0] == old_countdown and rows[1]["gain_points"] == 12.0 and len(calls) == 1
    (out / "task_gains.json").write_text("{broken")
    with pytest.raises(SystemExit, match="cannot keep the earlier rows"):
        task_gains.main(["--runs", str(tmp_path / "runs2"), "--out", str(out), "--tasks", "word_problems"])
    assert len(calls) == 1


def test_loop_seconds_excludes_the_build(tmp_path):
    """The loop time runs from the step-0 evaluation's row to the last row, so that a first-use build (in
    ``summary.json``'s wall time) does not count as training; rows without a time are skipped."""
    rows = [{"step": 0, "time": 1000.0, "eval/accuracy_sampled": 0.3}, {"step": 1}, {"step": 1, "time": 1001.5},
            {"step": 200, "time": 1250.25, "eval/accuracy_sampled": 0.4}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert task_gains.loop_seconds(tmp_path) == 250.2
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert task_gains.loop_seconds(tmp_path) is None
