"""scripts/pinned_runs.py: a bad queue line is refused with its line number before anything runs; a row is cut
to itself and one seed; a run trains at its pin in a worktree (a real two-step grid at HEAD); import copies only
completed runs, makes their paths repository-relative, refuses a leftover machine path and overwrites nothing; status says where each run of a queue
stands; the queue is read again as slots free, and a run another runner claims is skipped."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import pinned_runs as pr  # noqa: E402

GRID = {"description": "two tiny rows", "seeds": [0, 1],
        "base": {"task": {"name": "arithmetic", "eval_size": 8},
                 "rollout": {"prompts_per_step": 2, "group_size": 2},
                 "train": {"steps": 2, "eval_every": 2, "save_every": 0, "plots": False}},
        "runs": [{"name": "grpo-a", "algorithm.baseline": "grpo", "algorithm.lr_schedule": "constant"},
                 {"name": "rloo-b", "algorithm.baseline": "rloo", "algorithm.lr_schedule": "constant"}]}


def _grid(tmp_path: Path) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(GRID, sort_keys=False))
    return path


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("line, message", [
    ("{pin} lab {grid} grpo-a", "expected 'PIN LABEL CONFIG ROW SEED', got 4 fields"),
    ("{pin} lab {grid} grpo-a zero", "SEED 'zero' is not an integer"),
    ("{pin} lab {grid}.missing grpo-a 0", "not found"),
    ("{pin} lab {grid} nosuchrow 0", "ROW 'nosuchrow' is not in"),
    ("0000000deadbeef lab {grid} grpo-a 0", "PIN '0000000deadbeef' is not a commit"),
    ("{pin} a/b {grid} grpo-a 0", "LABEL 'a/b' must be a plain folder name"),
])
def test_a_bad_line_is_refused_with_its_line_number(tmp_path, line, message):
    grid = _grid(tmp_path)
    queue = tmp_path / "queue.txt"
    good = f"{_head()} lab {grid} grpo-a 0"
    queue.write_text(f"# a comment\n{good}\n{line.format(pin=_head(), grid=grid)}\n")
    with pytest.raises(ValueError) as err:
        pr.parse_queue(queue)
    assert f"{queue}:3:" in str(err.value) and message in str(err.value)


def test_an_empty_queue_and_a_file_that_is_not_a_grid_are_refused(tmp_path):
    queue = tmp_path / "queue.txt"
    queue.write_text("# nothing\n\n")
    with pytest.raises(ValueError, match="no runs in the queue"):
        pr.parse_queue(queue)
    other = tmp_path / "other.yaml"
    other.write_text("train: {steps: 2}\n")
    queue.write_text(f"{_head()} lab {other} grpo-a 0\n")
    with pytest.raises(ValueError, match=":1: CONFIG .* is not an oblr compare grid file"):
        pr.parse_queue(queue)


def test_the_cut_config_holds_one_row_and_one_seed_and_the_base(tmp_path):
    cut = yaml.safe_load(pr.cut_config(_grid(tmp_path), "rloo-b", 7, tmp_path / "c" / "cut.yaml").read_text())
    assert cut["seeds"] == [7] and [r["name"] for r in cut["runs"]] == ["rloo-b"]
    assert cut["base"] == GRID["base"] and cut["runs"][0] == GRID["runs"][1]


def test_a_queue_runs_at_its_pin_and_imports_into_the_repository_relative_layout(tmp_path):
    grid = _grid(tmp_path)
    queue = tmp_path / "queue.txt"
    queue.write_text(f"{_head()} tiny {grid} rloo-b 3\n")
    work = tmp_path / "work"
    try:
        assert pr.main(["run", str(queue), "--work", str(work), "--jobs", "1"]) == 0
        run = work / "out" / "tiny" / "rloo-b-s3" / "rloo-b" / "seed3"
        code = json.loads((run / "code.json").read_text())
        assert code["git_commit"] == _head() and not code["git_dirty"]  # trained by the worktree's code
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"

        root = tmp_path / "repo"
        root.mkdir()
        said = pr.import_runs(work / "out" / "tiny", Path("results/tiny"), root=root)
        assert said == ["imported results/tiny/rloo-b/seed3"]
        copied = root / "results" / "tiny" / "rloo-b" / "seed3"
        assert sorted(p.name for p in copied.iterdir()) == sorted(pr.KEPT)
        for name in pr.KEPT:
            assert str(work) not in (copied / name).read_text()
        assert json.loads((copied / "summary.json").read_text())["run_dir"] == "results/tiny/rloo-b/seed3"
        before = (copied / "metrics.jsonl").read_text()
        assert pr.import_runs(work / "out" / "tiny", Path("results/tiny"), root=root) == [
            "left alone results/tiny/rloo-b/seed3: already there"]
        assert (copied / "metrics.jsonl").read_text() == before
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "pins" / _head())],
                       capture_output=True)


def _fake_run(source: Path, row: str, status: str, extra: str = "") -> Path:
    run = source / f"{row}-s0" / row / "seed0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"run_dir": str(run), "status": status}, indent=2))
    (run / "config.yaml").write_text(f"train:\n  output_dir: {run}\n{extra}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "code.json").write_text("{}\n")
    return run


def test_import_skips_an_unfinished_run_and_refuses_a_leftover_machine_path(tmp_path):
    source = tmp_path / "work" / "out" / "lab"
    _fake_run(source, "unfinished", "running")
    root = tmp_path / "repo"
    root.mkdir()
    assert pr.import_runs(source, Path("r/lab"), root=root) == ["skipped unfinished/seed0: not completed"]
    assert not (root / "r" / "lab" / "unfinished").exists()
    _fake_run(source, "leaky", "completed", extra=f"  init_from: {tmp_path / 'work' / 'pins' / 'abc'}\n")
    with pytest.raises(ValueError, match="config.yaml: still names a path of this machine"):
        pr.import_runs(source, Path("r/lab"), root=root)
    assert not (root / "r" / "lab" / "leaky").exists()


def test_status_says_where_each_run_of_a_queue_stands(tmp_path, capsys):
    grid = _grid(tmp_path)
    work = tmp_path / "work"
    jobs = [pr.Job(n, "abc", "lab", grid, "grpo-a", seed) for n, seed in enumerate((0, 1, 2, 3), start=1)]
    done = pr.run_dir(jobs[0], work)
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"status": "completed", "eval_accuracy_final": 0.4125}))
    going = pr.run_dir(jobs[1], work)
    going.mkdir(parents=True)
    (going / "summary.json").write_text(json.dumps({"status": "running"}))
    (going / "config.yaml").write_text("train:\n  steps: 100\n")
    (going / "metrics.jsonl").write_text('{"step": 1, "optim/lr": 0.1}\n{"step": 1, "eval/accuracy_sampled": 0.2}\n'
                                         '{"step": 2, "optim/lr": 0.1}\n')
    mtime = (going / "metrics.jsonl").stat().st_mtime
    lock = (going / ".oblr.lock").open("a+")  # its trainer holds the run folder
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    stopped = pr.run_dir(jobs[2], work)
    stopped.mkdir(parents=True)
    (stopped / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    assert pr.queue_status(jobs, work, now=mtime + 180) == [
        "line   1 abc lab/grpo-a-s0: completed, final sampled accuracy 41.2 %",
        "line   2 abc lab/grpo-a-s1: step 2 of 100, metrics last written 3 min ago",
        "line   3 abc lab/grpo-a-s2: stopped (interrupted; see the log)",
        "line   4 abc lab/grpo-a-s3: not started",
        "4 runs: 1 completed, 1 in progress, 1 stopped, 1 not started"]
    lock.close()  # the trainer killed: the same metrics, no process holds the folder
    assert pr.queue_status(jobs, work, now=mtime + 180)[1] == (
        "line   2 abc lab/grpo-a-s1: stopped: step 2 of 100, metrics last written 3 min ago; no process holds it "
        "(killed?): a runner resumes it from its last checkpoint")
    queue = tmp_path / "queue.txt"
    queue.write_text(f"{_head()} lab {grid} grpo-a 0\n{_head()} lab {grid} rloo-b 5\n")
    assert pr.main(["status", str(queue), "--work", str(work)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("lab/grpo-a-s0: completed, final sampled accuracy 41.2 %")
    assert out[1].endswith("lab/rloo-b-s5: not started") and out[2] == "2 runs: 1 completed, 1 not started"
    queue.write_text(f"{_head()} lab {grid} nosuchrow 0\n")
    assert pr.main(["status", str(queue), "--work", str(work)]) == 2
    assert "ROW 'nosuchrow' is not in" in capsys.readouterr().err
    assert not (work / "pins").exists()  # status starts nothing


def test_the_queue_is_read_again_as_slots_free_and_claimed_runs_are_skipped(tmp_path, capsys):
    """One slot, a fake trainer: a completed run, a run another runner claims and a run a trainer holds (its run
    folder's lock) are skipped; while the first run trains, the queue is rewritten (a line added first, one
    removed): the next run is the new first line; a queue that stops parsing keeps its last good reading; no run
    is started twice."""
    grid, head, work = _grid(tmp_path), _head(), tmp_path / "work"
    queue = tmp_path / "queue.txt"
    line = f"{head} tiny {grid} {{}} {{}}\n"
    queue.write_text(line.format("grpo-a", 0) + line.format("grpo-a", 1) + line.format("rloo-b", 0)
                     + line.format("rloo-b", 1))
    jobs = pr.parse_queue(queue)
    done = pr.run_dir(jobs[0], work)  # grpo-a seed 0: completed before
    done.mkdir(parents=True)
    (done / "summary.json").write_text(json.dumps({"status": "completed", "eval_accuracy_final": 0.5}))
    held = pr.claim(jobs[1], work)  # grpo-a seed 1: another runner holds it
    assert held is not None and pr.claimed_elsewhere(jobs[1], work)
    training = pr.run_dir(jobs[3], work)  # rloo-b seed 1: a trainer holds its run folder's lock, no claim
    training.mkdir(parents=True)
    lock = (training / ".oblr.lock").open("a+")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert pr.claimed_elsewhere(jobs[3], work)
    ran = []

    def fake(job, work_dir):
        ran.append(job.name)
        if len(ran) == 1:  # rloo-b-s0 runs: put rloo-b seed 5 first, drop grpo-a seed 0 (the completed one)
            queue.write_text(line.format("rloo-b", 5) + line.format("grpo-a", 1) + line.format("rloo-b", 0)
                             + line.format("rloo-b", 1))
        elif len(ran) == 2:
            queue.write_text("not a queue line\n")
        return 0

    codes = pr.run_queue(queue, jobs, work, 1, run=fake)
    lock.close()
    assert ran == ["rloo-b-s0", "rloo-b-s5"] and codes == [0, 0]
    assert not pr.claimed_elsewhere(jobs[2], work)  # this runner's claim of rloo-b seed 0 ended with its run
    assert "cannot be read now" in capsys.readouterr().out
    held.close()
    assert not pr.claimed_elsewhere(jobs[1], work)  # released: a later runner may take it
    claim = pr.claim(jobs[1], work)
    assert claim is not None  # and a runner's own claim ends with its run
    claim.close()


def test_a_run_that_raises_or_a_queue_that_vanishes_does_not_stop_the_runner(tmp_path, capsys):
    grid, head, work = _grid(tmp_path), _head(), tmp_path / "work"
    queue = tmp_path / "queue.txt"
    queue.write_text(f"{head} tiny {grid} grpo-a 0\n{head} tiny {grid} rloo-b 0\n")
    ran = []

    def fake(job, work_dir):
        ran.append(job.name)
        if job.row == "grpo-a":
            queue.unlink()  # e.g. a checkout rewriting it
            raise RuntimeError("git worktree add failed")
        return 0

    assert pr.run_queue(queue, pr.parse_queue(queue), work, 1, run=fake) == [1, 0]
    out = capsys.readouterr().out
    assert ran == ["grpo-a-s0", "rloo-b-s0"]
    assert "FAILED" in out and "RuntimeError: git worktree add failed" in out and "cannot be read now" in out
