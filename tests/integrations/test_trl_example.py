"""examples/trl_grpo_oblr.py runs end to end (a few steps) on one process (its ``main``, in this process) and on
2 processes under ``accelerate launch`` (gloo; the launch of conftest.py::two_process_run), and logs the oblr/
metrics into TRL's log history."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from .trl_helpers import EXAMPLE_SHORT_ARGS  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_oblr.py"


def _check(out_dir: Path, processes: int) -> None:
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["processes"] == processes and s["accuracy_after"] is not None
    steps = [h for h in s["log_history"] if "oblr/lr" in h]
    assert len(steps) == 2
    for h in steps:
        for key in ("oblr/S", "oblr/V", "oblr/snr", "oblr/w_mean", "oblr/fallback_count"):
            assert key in h, key
        assert h["learning_rate"] == pytest.approx(h["oblr/lr"])


def test_example_one_process(trl_model, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("trl_grpo_oblr", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--model", str(trl_model), "--output-dir", str(tmp_path), *EXAMPLE_SHORT_ARGS,
                  "--threads", str(torch.get_num_threads())])  # the test process's thread count stays as it is
    assert "[oblr/trl] 1 process(es), 2 steps" in capsys.readouterr().out
    _check(tmp_path, 1)


def test_example_two_processes(two_process_run):
    assert two_process_run.returncode == 0, two_process_run.output()
    assert "[oblr/trl] 2 process(es), 2 steps" in two_process_run.log.read_text(errors="replace")
    _check(two_process_run.out / "example", 2)
