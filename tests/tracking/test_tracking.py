"""MetricsLogger / read_metrics (format, non-finite values, crash tolerance, resume), optional sinks,
and the progress display in TTY and non-TTY modes."""

from __future__ import annotations

import io
import json
import math
import sys
import types

import numpy as np
import pytest
import torch

from oblr.tracking import MetricsLogger, ProgressDisplay, progress, read_metrics


class TTYStringIO(io.StringIO):
    def isatty(self) -> bool:
        return True


def _strict_loads(line: str) -> dict:
    def bad(c):
        raise ValueError(f"non-standard JSON constant {c}")
    return json.loads(line, parse_constant=bad)


def _steps(run_dir) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


# ------------------------------------------------------------------------------------------ format
def test_log_converts_tensors_and_numbers_and_flushes(tmp_path):
    log = MetricsLogger(tmp_path)
    rec = log.log(3, {"train/reward_mean": torch.tensor(0.25), "baseline/fallback_count": torch.tensor(4),
                      "optim/skipped": torch.tensor(False), "snr/S": np.float32(2.5), "adv/n": np.int64(7),
                      "optim/lr": 1e-3, "note": "hello", "x": None, "flag": np.bool_(True)})
    # flushed: readable before close
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1
    got = _strict_loads(lines[0])
    assert got == rec
    assert got["step"] == 3 and isinstance(got["time"], float)
    assert got["train/reward_mean"] == 0.25 and isinstance(got["train/reward_mean"], float)
    assert got["baseline/fallback_count"] == 4 and isinstance(got["baseline/fallback_count"], int)
    assert got["optim/skipped"] is False
    assert got["snr/S"] == 2.5 and got["adv/n"] == 7 and got["optim/lr"] == 1e-3
    assert got["note"] == "hello" and got["x"] is None and got["flag"] is True
    log.close()
    log.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        log.log(4, {"a": 1.0})


def test_nonfinite_written_as_null_and_restored(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(1, {"optim/grad_norm": float("inf"), "optim/loss": torch.tensor(float("nan")),
                    "snr/V": -math.inf, "snr/S": 1.0})
    line = (tmp_path / "metrics.jsonl").read_text().strip()
    raw = _strict_loads(line)  # strict JSON: no NaN/Infinity tokens
    assert raw["optim/grad_norm"] is None and raw["optim/loss"] is None and raw["snr/V"] is None
    assert raw["_nonfinite"] == {"optim/grad_norm": "inf", "optim/loss": "nan", "snr/V": "-inf"}
    assert read_metrics(tmp_path, raw=True)[0] == raw
    rec = read_metrics(tmp_path)[0]
    assert rec["optim/grad_norm"] == math.inf and rec["snr/V"] == -math.inf and math.isnan(rec["optim/loss"])
    assert rec["snr/S"] == 1.0 and "_nonfinite" not in rec


@pytest.mark.parametrize("step, metrics, err, match", [
    (1, {"a": torch.ones(3)}, ValueError, "'a': tensor of shape \\(3,\\)"),
    (1, {"a": np.ones(2)}, ValueError, "'a': array"),
    (1, {"step": 1.0}, ValueError, "reserved"),
    (1, {"time": 1.0}, ValueError, "reserved"),
    (1, {"a": [1, 2]}, TypeError, "'a': unsupported value type list"),
    (1, {3: 1.0}, TypeError, "keys must be str"),
    (-1, {"a": 1.0}, ValueError, "non-negative int"),
    (1.5, {"a": 1.0}, ValueError, "non-negative int"),
])
def test_log_rejects_bad_input(tmp_path, step, metrics, err, match):
    with MetricsLogger(tmp_path) as log, pytest.raises(err, match=match):
        log.log(step, metrics)


def test_steps_may_repeat_but_not_decrease(tmp_path):
    with MetricsLogger(tmp_path) as log:
        log.log(5, {"train/reward_mean": 0.5})
        log.log(5, {"eval/accuracy_sampled": 0.3})  # eval of the same step: allowed
        with pytest.raises(ValueError, match="before the last logged step 5"):
            log.log(4, {"a": 1.0})
    assert _steps(tmp_path) == [5, 5]


# ----------------------------------------------------------------------------------------- reading
def test_read_metrics_tolerates_truncated_last_line_only(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n\n{"step": 2, "a": 2.0}\n{"step": 3, "a": 3.')
    assert [r["a"] for r in read_metrics(tmp_path)] == [1.0, 2.0]
    assert read_metrics(path) == read_metrics(tmp_path)  # file or folder
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a\n{"step": 3, "a": 3.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        read_metrics(path)
    path.write_text('{"a": 1.0}\n')
    with pytest.raises(ValueError, match=r":1: expected a JSON object with an integer 'step'"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError, match="no metrics file"):
        read_metrics(tmp_path / "nope")


# ------------------------------------------------------------------------------------------ resume
def test_resume_truncates_later_steps_and_partial_tail(tmp_path):
    with MetricsLogger(tmp_path) as log:
        for s in range(1, 11):
            log.log(s, {"train/reward_mean": s / 10})
        log.log(10, {"eval/accuracy_sampled": 0.5})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "train/rew')  # crash mid-write
    with pytest.raises(FileExistsError, match="resume=<checkpoint step>"):
        MetricsLogger(tmp_path)
    with pytest.raises(ValueError, match="needs resume_step"):
        MetricsLogger(tmp_path, resume=True)
    with pytest.raises(ValueError, match="disagree"):
        MetricsLogger(tmp_path, resume=6, resume_step=5)
    with pytest.raises(ValueError, match="needs resume_step"):
        MetricsLogger(tmp_path, resume=-1)
    with MetricsLogger(tmp_path, resume=6) as log:  # same as resume=True, resume_step=6
        assert log.last_step == 6
        with pytest.raises(ValueError, match="before the last logged step 6"):
            log.log(5, {"a": 1.0})
        for s in range(7, 12):
            log.log(s, {"train/reward_mean": -s})
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == list(range(1, 12))  # no duplicates, no partial line
    assert [r["train/reward_mean"] for r in recs[:6]] == [s / 10 for s in range(1, 7)]
    assert [r["train/reward_mean"] for r in recs[6:]] == [-s for s in range(7, 12)]
    text = (tmp_path / "metrics.jsonl").read_text()
    assert all(_strict_loads(line) for line in text.splitlines())
    assert not list(tmp_path.glob("*.tmp"))


def test_resume_without_existing_file_starts_fresh(tmp_path):
    with MetricsLogger(tmp_path / "new", resume=True, resume_step=0) as log:
        assert log.last_step == -1
        log.log(1, {"a": 1.0})
    assert _steps(tmp_path / "new") == [1]


# ---------------------------------------------------------------------------------- optional sinks
def test_tensorboard_missing_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"pip install oblr\[tensorboard\]"):
        MetricsLogger(tmp_path, tensorboard=True)


def test_wandb_missing_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"pip install oblr\[wandb\]"):
        MetricsLogger(tmp_path, wandb=True)
    with pytest.raises(ValueError, match="wandb_mode"):
        MetricsLogger(tmp_path, wandb=True, wandb_mode="cloud")


def test_tensorboard_scalars_and_resume_purge(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, tensorboard=True, config={"seed": 1}) as log:
        for s in range(1, 5):
            log.log(s, {"optim/lr": s * 0.1, "note": "skipped by TB", "optim/grad_norm": math.nan})
    with MetricsLogger(tmp_path, tensorboard=True, resume=True, resume_step=2) as log:
        log.log(3, {"optim/lr": 9.0})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = [(e.step, round(e.value, 6)) for e in acc.Scalars("optim/lr")]
    assert events == [(1, 0.1), (2, 0.2), (3, 9.0)]  # steps 3, 4 of the first session purged
    assert all(math.isnan(e.value) for e in acc.Scalars("optim/grad_norm"))


def test_wandb_calls_and_run_id_reuse(tmp_path, monkeypatch):
    calls = {"init": [], "log": [], "finish": 0}

    class FakeRun:
        id = "abc123"

        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finish"] += 1

    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls["init"].append(kw) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with MetricsLogger(tmp_path, wandb=True, wandb_project="p", config={"seed": 3}) as log:
        log.log(1, {"optim/lr": torch.tensor(0.5), "note": "text", "optim/grad_norm": math.inf})
    with MetricsLogger(tmp_path, wandb=True, resume=True, resume_step=1):
        pass
    first, second = calls["init"]
    assert first == {"project": "p", "dir": str(tmp_path), "mode": "offline", "config": {"seed": 3},
                     "id": None, "resume": None}
    assert second["id"] == "abc123" and second["resume"] == "allow"
    assert calls["log"] == [(1, {"optim/lr": 0.5, "optim/grad_norm": math.inf})]
    assert calls["finish"] == 2


# ---------------------------------------------------------------------------------------- progress
def _fake_clock(times):
    it = iter(times)
    return lambda: next(it)


def test_progress_display_tty_rewrites_one_line():
    out = TTYStringIO()
    disp = ProgressDisplay(10, stream=out)
    disp._clock = _fake_clock([0.0, 2.0, 4.0, 6.0])
    disp.update(1, {"train/reward_mean": torch.tensor(0.25), "optim/lr": 3e-4, "snr/snr": 0.125,
                    "time/step": 1.5})
    disp.update(2, {"train/reward_mean": 0.5, "eval/accuracy_sampled": 0.4, "eval/accuracy_greedy": 0.45})
    disp.update(3, {"train/reward_mean": 0.75, "policy/step_kl": 3.14e-4})
    disp.update(4, {"train/reward_mean": 0.75})
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 4
    frames = text.split("\r")[1:]
    assert frames[0] == "step 1/10 | reward 0.250 | lr 3.00e-04 | snr 0.125 | 1.50 s/step | ETA 14s"
    assert frames[1].startswith("step 2/10 | reward 0.500 | eval 0.400 (greedy 0.450) | 2.00 s/step | ETA 16s")
    # the last eval is remembered; a shorter line is padded to erase the previous one
    assert frames[2].rstrip() == ("step 3/10 | reward 0.750 | eval 0.400 (greedy 0.450) | step kl 0.00031 | "
                                  "2.00 s/step | ETA 14s")  # the kl schedule's measured policy change
    assert frames[3].rstrip() == "step 4/10 | reward 0.750 | eval 0.400 (greedy 0.450) | 2.00 s/step | ETA 12s"
    assert len(frames[3]) == len(frames[2])
    disp.close()
    assert out.getvalue().endswith("\n")


def test_progress_display_plain_lines_every_n():
    out = io.StringIO()
    with ProgressDisplay(5, stream=out, every=2) as disp:
        disp._clock = _fake_clock([float(t) for t in range(5)])
        for s in range(1, 6):
            disp.update(s, {"train/reward_mean": s / 10})
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [line.split(" |")[0] for line in lines] == ["step 2/5", "step 4/5", "step 5/5"]  # last always
    assert lines[-1] == "step 5/5 | reward 0.500 | 1.00 s/step | ETA 0s"


def test_progress_helper_tty_and_plain():
    out = TTYStringIO()
    assert list(progress(range(5), desc="eval", stream=out, min_interval=0.0)) == [0, 1, 2, 3, 4]
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n") and text.count("\n") == 1
    assert text.split("\r")[-1].startswith("eval: 5/5")

    out = io.StringIO()
    assert sum(progress(range(100), desc="build", stream=out)) == sum(range(100))
    counts = [int(line.split()[1].split("/")[0]) for line in out.getvalue().splitlines()]
    assert counts == [1, 11, 21, 31, 41, 51, 61, 71, 81, 91, 100] and "\r" not in out.getvalue()

    out = io.StringIO()
    list(progress(iter(range(20)), stream=out))  # unknown length: powers of two, then the final count
    assert [int(line.split()[0]) for line in out.getvalue().splitlines()] == [1, 2, 4, 8, 16, 20]


def test_logger_close_that_fails_still_closes(tmp_path):
    """A full disk can refuse the last buffered bytes when the metrics file is closed: the error reaches the
    caller (the trainer turns it into one line), and the logger is closed anyway, so a second close (the
    trainer's error path) does not raise again."""
    import errno

    from oblr.tracking.metrics import MetricsLogger

    logger = MetricsLogger(tmp_path)
    real = logger._file

    class Full:
        def close(self):
            real.close()
            raise OSError(errno.ENOSPC, "No space left on device")

    logger._file = Full()
    with pytest.raises(OSError, match="No space"):
        logger.close()
    logger.close()
