"""benchmarks/op_count.py counts the operators a step dispatches; the two-pass step dispatches more than GRPO's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_counts_and_refusals(capsys):
    import op_count

    res = op_count.main(["--layers", "2", "--plans", "grpo_ckpt,oblr_ckpt"])
    assert set(res) == {"grpo_ckpt", "oblr_ckpt"}
    assert 0 < res["grpo_ckpt"]["total"] < res["oblr_ckpt"]["total"]
    assert sum(n for _, n in res["oblr_ckpt"]["top"]) <= res["oblr_ckpt"]["total"]
    assert "oblr_ckpt" in capsys.readouterr().out
    gpu = op_count.main(["--layers", "2", "--plans", "oblr", "--gpu-paths"])
    from oblr.gradnorm import strips, windows

    assert strips.GRAM_STRIPS == 16 and windows.TRIM_MIN_FRACTION == 0.1  # restored
    assert gpu["oblr"]["total"] > 0
    for argv, msg in ((["--plans", "fast"], "--plans: unknown ['fast']"), (["--layers", "0"], "--layers must be")):
        with pytest.raises(SystemExit):
            op_count.main(argv)
        assert msg in capsys.readouterr().err
