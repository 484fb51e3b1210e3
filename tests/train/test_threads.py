"""train.threads: the rule for the default 0 (the cores other work leaves free), the load measurement it reads
(/proc/stat snapshots), and the one line a run prints; values recomputed by hand."""

from __future__ import annotations

import pytest
import torch

from oblr.train import threads as th


@pytest.mark.parametrize("cores, default, busy, expected", [
    (2, 2, 0.0, 2),    # idle: torch's own count
    (2, 2, 0.4, 2),    # 2 - round(0.4) = 2
    (2, 2, 0.5, 1),    # half rounds up: 2 - 1
    (2, 2, 1.9, 1),    # the loaded 2-core machine: 2 - 2 = 0 -> at least 1
    (2, 2, 7.0, 1),
    (16, 8, 0.0, 8),   # never above torch's own count (physical cores)
    (16, 8, 10.2, 6),  # 16 - 10
    (4, 4, None, 4),   # load unknown: torch's count
    (4, 0, None, 1),
])
def test_auto_threads_rule(cores, default, busy, expected):
    assert th.auto_threads(cores, default, busy) == expected


STAT_BEFORE = """cpu  300 0 30 700 0 0 0 0 0 0
cpu0 100 0 10 400 0 0 0 0 0 0
cpu1 200 0 20 300 0 0 0 0 0 0
intr 12345
"""
# over the window: cpu0 10 busy of 100 (user 8, system 2; idle 85, iowait 5); cpu1 90 busy of 95 (user 80,
# steal 10; idle 5)
STAT_AFTER = """cpu  398 0 32 790 5 0 0 10 0 0
cpu0 108 0 12 485 5 0 0 0 0 0
cpu1 280 0 20 305 0 0 0 10 0 0
intr 12399
"""


def test_busy_cores_from_proc_stat_snapshots():
    before, after = th.read_proc_stat(STAT_BEFORE), th.read_proc_stat(STAT_AFTER)
    assert set(before) == {"cpu0", "cpu1"} and before["cpu1"][:4] == [200, 0, 20, 300]
    assert th.busy_cores(before, after, ["cpu0"]) == pytest.approx(0.10)  # iowait counts as idle
    assert th.busy_cores(before, after, ["cpu1"]) == pytest.approx(90 / 95)  # steal counts as busy
    assert th.busy_cores(before, after, ["cpu0", "cpu1"]) == pytest.approx(0.10 + 90 / 95)
    assert th.busy_cores(before, after, ["cpu7"]) is None  # not this machine's cpu
    assert th.busy_cores(before, before, ["cpu0"]) is None  # no time passed


def test_other_load_is_a_number_of_cores_here():
    cpus = th.usable_cpus()
    load = th.other_load(cpus, window_s=0.05)
    assert load is None or 0 <= load <= max(len(cpus), 1) * 64  # the load average may exceed the cores


def test_choose_threads_says_what_it_chose():
    measured = []

    def measure(cpus):
        measured.append(cpus)
        return 1.9

    cores = len(th.usable_cpus())
    n, line = th.choose_threads(0, cores, env={}, measure=measure)
    assert n == max(1, cores - 2) and measured == [th.usable_cpus()]
    assert line == f"torch threads: {n} ({cores} cores, load 1.9); set train.threads=N to override"
    # an explicit setting is used as it is, silently; OMP_NUM_THREADS keeps torch's count
    assert th.choose_threads(3, cores, env={}, measure=measure) == (3, None)
    assert th.choose_threads(0, 5, env={"OMP_NUM_THREADS": "1"}, measure=measure) == (
        None, "torch threads: 5 (OMP_NUM_THREADS=1); set train.threads=N to override")
    assert len(measured) == 1
    n, line = th.choose_threads(0, 3, env={}, measure=lambda cpus: None)
    assert n == 3 and "load unknown" in line


def test_runs_in_one_process_do_not_ratchet_the_default_down(monkeypatch):
    monkeypatch.setattr(th, "_last", {})
    assert th.torch_default(4) == 4
    th.remember(4, 1)  # a run set 1 where torch had 4
    assert th.torch_default(1) == 4  # the next run starts from torch's own count
    assert th.torch_default(2) == 2  # someone else changed it since: theirs


def test_a_default_run_sets_and_prints_its_thread_count(monkeypatch, capsys, tmp_path):
    """oblr train with train.threads=0 and no OMP_NUM_THREADS: the count from the rule is set before the
    model loads and said in one line."""
    import oblr.models
    from oblr.cli import main

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(oblr.models, "load_model_and_tokenizer", stop)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(th, "other_load", lambda cpus, window_s=th.WINDOW_S: 1.2)  # one core busy elsewhere
    monkeypatch.setattr(th, "_last", {})
    before = torch.get_num_threads()
    cores = len(th.usable_cpus())
    try:
        torch.set_num_threads(cores)
        with pytest.raises(Stop):
            main(["train", "--output-dir", str(tmp_path / "r")])
        expected = max(1, cores - 1)
        assert torch.get_num_threads() == expected
        out = capsys.readouterr().out
        assert f"[oblr] torch threads: {expected} ({cores} cores, load 1.2); set train.threads=N to override\n" in out
    finally:
        torch.set_num_threads(before)


def test_benchmark_reads_seconds_per_step_and_tabulates_ratios(tmp_path):
    """benchmarks/threads.py: median time/step after the first step; ratio to train.threads=1 at each load."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import threads as bench
    finally:
        sys.path.pop(0)
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [
        {"step": 0, "eval/accuracy_sampled": 0.1}, {"step": 1, "time/step": 9.0}, {"step": 2, "time/step": 2.0},
        {"step": 3, "time/step": 4.0}, {"step": 4, "time/step": 3.0}]))
    assert bench.seconds_per_step(f) == 3.0  # median of 2, 4, 3; the first step (9.0) left out
    rows = [{"busy": 0, "threads": 1, "used": 1, "seen": "", "s_per_step": 2.0},
            {"busy": 0, "threads": 0, "used": 1, "seen": "2 cores, load 1.9", "s_per_step": 3.0},
            {"busy": 2, "threads": 2, "used": 2, "seen": "", "s_per_step": 8.0}]
    lines = bench.table(rows)
    assert lines[2] == "| 0 | 1 | 1 | - | 2.00 | 1.00 |"
    assert lines[3] == "| 0 | 0 (default) | 1 | 2 cores, load 1.9 | 3.00 | 1.50 |"
    assert lines[4] == "| 2 | 2 | 2 | - | 8.00 | - |"  # no threads=1 row at that load
