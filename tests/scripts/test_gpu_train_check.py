"""benchmarks/gpu/train_check.py cannot rot: on CPU it runs `oblr train` with two engines and the planner, and
the first-step comparison passes; the comparison itself is live (a difference is reported), and bad
arguments are refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))


def test_cpu_path_runs_the_engines_and_the_planner(tmp_path):
    import train_check

    out = tmp_path / "tc"
    rep = train_check.main(["--device", "cpu", "--steps", "1", "--variants", "one_pass,recompute,auto_bf16",
                            "--out", str(out)])
    assert [r["name"] for r in rep["runs"]] == ["one_pass", "recompute", "auto_bf16"]
    assert all(r["rc"] == 0 for r in rep["runs"]), [r.get("tail") for r in rep["runs"]]
    (cmp,) = rep["comparisons"]
    assert (cmp["ref"], cmp["run"]) == ("one_pass", "recompute") and cmp["passed"], cmp
    assert rep["runs"][0]["step1"]["snr/S"] != 0  # a step with signal: S and the lr are really compared
    assert rep["runs"][2]["plan"].startswith(("one-pass", "recompute", "two-pass")) and "of 1 per device" in rep["runs"][2]["plan"]
    assert json.loads((out / "train_check.json").read_text())["comparisons"][0]["passed"]
    assert (out / "recompute.log").read_text().startswith("-m oblr train model.device=cpu")


def test_compare_reports_a_difference():
    import train_check

    ref = {"snr/V": 2.0, "snr/lr": 1e-4, "weights/mean": 1.0, "weights/std": 0.5, "optim/grad_norm": 3.0,
           "optim/loss": -1.0, "snr/S": 0.1, "train/reward_mean": 0.25}
    assert max(v for k, v in train_check.compare(ref, dict(ref), 16, 1e-3).items() if k != "reward_equal") == 0
    d = train_check.compare(ref, dict(ref, **{"snr/S": 0.1 + 1e-3}), 16, 1e-3)
    assert d["snr/S"] == pytest.approx(1e-3 / (0.1 + 2.0 / 16))
    assert not train_check.compare(ref, dict(ref, **{"train/reward_mean": 0.5}), 16, 1e-3)["reward_equal"]


def test_refusals(tmp_path, capsys):
    import train_check

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for argv, msg in ((["--steps", "0"], "--steps must be"), (["--device", "tpu"], "--device must be"),
                      (["--variants", "nope"], "--variants: unknown"), ([], "is not empty")):
        out = str(tmp_path / "full") if msg == "is not empty" else str(tmp_path / "o")
        with pytest.raises(SystemExit):
            train_check.main([*argv, "--out", out])
        assert msg in capsys.readouterr().err
