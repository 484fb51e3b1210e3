"""Run folders: one process at a time (OS lock), a folder that never saved a checkpoint resumes from step
0 with its own config (--resume-or-start; --resume refuses), a folder that is not a run folder is never
written into (not even one holding another program's config.yaml, metrics.jsonl or checkpoints/), every
refusal names the next step (and the pid holding a locked folder) and following it works, damaged last
metrics records are kept aside and re-run, orphaned temporary checkpoints are removed on resume."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest
from fault_helpers import env, rows, start, stop, train_args, train_rows, wait_for

from oblr.cli import main
from oblr.config import Config
from oblr.train.run_dir import is_run_folder, record_run


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
    # plain --resume: nothing to resume, refused in one line
    assert main(["train", "--plugin", "signal_task", "--resume", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no checkpoint" in err and "--resume-or-start" in err, err
    assert main(["train", "--plugin", "signal_task", "--resume-or-start", "--output-dir", str(out), "--quiet"]) == 0
    assert sorted(train_rows(out)) == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["status"] == "completed"


def test_a_run_folder_without_a_checkpoint_and_no_rows_is_reusable(small_builtin, tmp_path):
    """What a run that stopped (a late error) before it logged anything leaves: the config.yaml and code.json
    it wrote when it started, an empty metrics.jsonl."""
    out = tmp_path / "run"
    out.mkdir()
    record_run(out, Config(), 0, config=True)
    (out / "metrics.jsonl").write_text("")
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


@pytest.mark.parametrize("resume", [[], ["--resume"], ["--resume-or-start"]])
def test_a_folder_that_is_not_a_run_folder_is_never_written_into(small_builtin, tmp_path, capsys, resume):
    out = tmp_path / "project"
    (out / "src").mkdir(parents=True)
    (out / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    (out / "README.md").write_text("my project\n")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(train_args(small_builtin, out, 1) + resume) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not empty and is not an oblr run folder" in err, err
    assert "README.md, pyproject.toml, src" in err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def _snapshot(folder):
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {p.relative_to(folder): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


# another program's files under the names an oblr run uses too; the config.yaml even reads as an oblr config
LOOKALIKES = {
    "config.yaml": {"config.yaml": "train:\n  steps: 100\n  seed: 3\nmodel:\n  name_or_path: gpt2\n"},
    "metrics.jsonl": {"metrics.jsonl": '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'},
    "checkpoints": {"checkpoints/step_000100/model.pt": "weights", "checkpoints/step_000200/model.pt": "weights"},
}


@pytest.mark.parametrize("resume", [[], ["--resume"], ["--resume-or-start"]])
@pytest.mark.parametrize("lookalike", sorted(LOOKALIKES))
def test_another_programs_config_metrics_or_checkpoints_are_never_taken_for_a_run_folder(small_builtin, tmp_path,
                                                                                        capsys, lookalike, resume):
    """A folder holding only a config.yaml, a metrics.jsonl or a checkpoints/ of another program is not a run
    folder (only oblr writes code.json): refused in one line naming the file and the next step, and nothing
    in it is touched (before: its config.yaml was overwritten, its metrics were moved to
    metrics.jsonl.restarted, or its step_N folders were pruned as oblr checkpoints)."""
    out = tmp_path / "other"
    for rel, text in LOOKALIKES[lookalike].items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    before = _snapshot(out)
    assert not is_run_folder(out)
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + resume) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not an oblr run folder" in err, err
    assert f"it holds {lookalike}," in err and "choose another --output-dir" in err, err
    assert _snapshot(out) == before


def test_a_run_folder_is_recognised_by_its_code_record_and_an_old_one_by_its_checkpoints(small_builtin, tmp_path):
    """A run folder is one oblr made: its code.json; one made before runs recorded their code, by its oblr
    config.yaml and a checkpoint (LATEST naming a folder with trainer_state.pt); it resumes either way."""
    out = tmp_path / "run"
    args = train_args(small_builtin, out, 1, "train.eval_every=0")
    assert main(args) == 0
    assert is_run_folder(out)
    (out / "code.json").unlink()  # as a folder written before code.json existed
    assert is_run_folder(out)
    (out / "checkpoints" / "LATEST").write_text("step_000099\n")  # a LATEST naming no oblr checkpoint
    assert not is_run_folder(out)
    (out / "checkpoints" / "LATEST").write_text("step_000001\n")
    assert main(train_args(small_builtin, out, 2, "train.eval_every=0") + ["--resume"]) == 0
    assert sorted(train_rows(out)) == [1, 2] and is_run_folder(out)


def _hold_lock(folder):
    """Another live process holding ``folder``'s run lock (as a running oblr train does); returns it."""
    code = ("import sys; from pathlib import Path; from oblr.train.run_dir import lock_run_dir; "
            "fh = lock_run_dir(Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _half_made(small_builtin, out):
    """A run folder whose run logged a step but saved no checkpoint (killed before its first save)."""
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0")) == 0
    shutil.rmtree(out / "checkpoints")
    (out / "summary.json").unlink()
    assert train_rows(out)


@pytest.mark.parametrize("state", ["empty", "half-made"])
def test_a_folder_held_by_another_process_is_refused_naming_its_pid_in_every_mode(small_builtin, tmp_path, capsys,
                                                                                   state):
    """Plain, --resume and --resume-or-start on a folder another live process holds: each refusal names that
    pid and one next step (a new run: another --output-dir; a resumption: the same command once it has
    ended), never "pass --resume" / "nothing to resume" (before: only --resume-or-start named the pid)."""
    out = tmp_path / "run"
    if state == "half-made":
        _half_made(small_builtin, out)
    holder = _hold_lock(out)
    try:
        before = _snapshot(out)
        for mode, then in [([], "choose another --output-dir for a new run"),
                           (["--resume"], f"wait for pid {holder.pid} to end, then run this command again"),
                           (["--resume-or-start"], f"wait for pid {holder.pid} to end, then run this command again")]:
            assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + mode) == 2, mode
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"is in use by another oblr process (pid {holder.pid})" in err, err
            assert then in err and "nothing to resume" not in err and "pass --resume" not in err, err
            assert _snapshot(out) == before
    finally:
        holder.communicate("")
    # the holder has ended: the same --resume-or-start command now runs
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + ["--resume-or-start"]) == 0
    assert sorted(train_rows(out)) == [1]


def test_following_a_refusals_advice_never_leads_to_another_refusal(small_builtin, tmp_path, capsys):
    """A folder whose run logged steps but saved no checkpoint: plain train and --resume both send the user
    to --resume-or-start (before: plain said "pass --resume" and --resume said "nothing to resume"), which
    runs; an empty folder: --resume sends the user to leave it out, which runs."""
    out = tmp_path / "run"
    _half_made(small_builtin, out)
    for mode in ([], ["--resume"]):
        assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + mode) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--resume-or-start starts it again from step 0" in err, err
        assert "pass --resume " not in err, err
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + ["--resume-or-start"]) == 0
    assert sorted(train_rows(out)) == [1] and (out / "metrics.jsonl.restarted").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(train_args(small_builtin, empty, 1, "train.eval_every=0") + ["--resume"]) == 2
    assert "leave out --resume" in capsys.readouterr().err
    assert main(train_args(small_builtin, empty, 1, "train.eval_every=0")) == 0


@pytest.mark.parametrize("exists", [False, True])
def test_resume_with_nothing_to_resume_is_refused(small_builtin, tmp_path, capsys, exists):
    out = tmp_path / "run"
    if exists:
        out.mkdir()
    assert main(train_args(small_builtin, out, 1) + ["--resume"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ("holds no checkpoint" if exists else "does not exist") in err, err
    assert (not out.exists()) if not exists else list(out.iterdir()) == []
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0") + ["--resume-or-start"]) == 0
    assert sorted(train_rows(out)) == [1]


def _damage_last_line(path):
    lines = path.read_text().splitlines(keepends=True)
    cut = lines[-1][: len(lines[-1]) // 2]
    path.write_text("".join(lines[:-1]) + cut)
    return cut


def test_a_damaged_record_after_the_checkpoint_is_kept_aside_and_re_run(small_builtin, tmp_path, capsys):
    """The crash case: the record being written when the run died (a step after its checkpoint)."""
    out = tmp_path / "run"
    assert main(train_args(small_builtin, out, 2, "train.eval_every=0", "train.save_every=1")) == 0
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "optim/loss": 0.12')  # step 3's record, cut short
    capsys.readouterr()
    assert main(train_args(small_builtin, out, 3, "train.eval_every=0", "train.save_every=1") + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "was damaged (step 3" in err and "metrics.jsonl.damaged" in err and "re-run" in err, err
    assert (out / "metrics.jsonl.damaged").read_text() == '{"step": 3, "optim/loss": 0.12\n'
    assert sorted(train_rows(out)) == [1, 2, 3]


def test_a_damaged_record_of_the_checkpointed_step_is_rebuilt_from_an_earlier_checkpoint(small_builtin, tmp_path,
                                                                                         capsys):
    """A finished run whose last record (step 3, with the final evaluation) was damaged: resuming goes back to
    step 2's checkpoint, re-runs step 3, and summary.json reports only what metrics.jsonl holds."""
    out = tmp_path / "run"
    args = train_args(small_builtin, out, 3, "train.eval_every=0", "train.save_every=1", "train.keep_checkpoints=3")
    assert main(args) == 0
    final = json.loads((out / "summary.json").read_text())["eval_accuracy_final"]
    cut = _damage_last_line(out / "metrics.jsonl")
    capsys.readouterr()
    assert main(args + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "the record of step 3" in err and "step_000002" in err, err
    assert (out / "metrics.jsonl.damaged").read_text() == cut + "\n"
    logged = rows(out)
    assert sorted(train_rows(out)) == [1, 2, 3]
    evals = [r for r in logged if "eval/accuracy_sampled" in r]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and evals[-1]["step"] == 3
    assert summary["eval_accuracy_final"] == evals[-1]["eval/accuracy_sampled"] == final  # rebuilt, same value


def test_a_damaged_record_with_no_earlier_checkpoint_is_refused_in_one_line(small_builtin, tmp_path, capsys):
    out = tmp_path / "run"
    args = train_args(small_builtin, out, 1, "train.eval_every=0", "train.save_every=1")
    assert main(args) == 0
    _damage_last_line(out / "metrics.jsonl")
    capsys.readouterr()
    assert main(args + ["--resume"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checkpoint before step 1 exists to re-run it" in err[0], err
