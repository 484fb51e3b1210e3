"""examples/trl_grpo_oblr.py runs end to end (a few steps), on one process and under torchrun with 2 (gloo),
and logs the oblr/ metrics into TRL's log history."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_oblr.py"
SHORT = ["--max-steps", "2", "--prompts-per-step", "4", "--num-generations", "4", "--max-completion-length", "8",
         "--eval-problems", "4"]


def _check(out_dir: Path, processes: int) -> None:
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["processes"] == processes and s["accuracy_after"] is not None
    steps = [h for h in s["log_history"] if "oblr/lr" in h]
    assert len(steps) == 2
    for h in steps:
        for key in ("oblr/S", "oblr/V", "oblr/snr", "oblr/w_mean", "oblr/fallback_count"):
            assert key in h, key
        assert h["learning_rate"] == pytest.approx(h["oblr/lr"])


def test_example_one_process(small_builtin, tmp_path):
    p = subprocess.run([sys.executable, str(EXAMPLE), "--model", str(small_builtin), "--output-dir", str(tmp_path),
                        *SHORT], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    assert "[oblr/trl] 1 process(es), 2 steps" in p.stdout
    _check(tmp_path, 1)


def test_example_two_processes(small_builtin, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(EXAMPLE), "--model", str(small_builtin), "--output-dir", str(tmp_path), *SHORT],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    _check(tmp_path, 2)
