"""benchmarks/step_ratio.py: the phases of `oblr train`'s metrics.jsonl, their shares and the whole-step ratio
computed from an update ratio (hand-made records, values checked by hand; no training run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_ratio  # noqa: E402


def _rec(step, gen, score, norms, update, total):
    return {"step": step, "time/generate": gen, "time/score": score, "time/norms": norms, "time/update": update,
            "time/sync": 0.0, "time/step": total, "optim/lr": 1e-3}


def _write(path: Path, recs) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in [{"step": 0, "time": 1.0}, *recs]) + "\n")
    return path


def test_phases_shares_and_the_computed_ratio(tmp_path, capsys):
    # first step (warm-up) left out; then rollout 2, scoring 1, update 0.5 + 0.5, other 1 -> shares 2/5 1/5 1/5 1/5
    grpo = _write(tmp_path / "g.jsonl", [_rec(1, 9, 9, 9, 9, 99), _rec(2, 2, 1, 0.5, 0.5, 5),
                                         _rec(3, 2, 1, 0.5, 0.5, 5), _rec(4, 2, 1, 0.5, 0.5, 5)])
    oblr = _write(tmp_path / "o.jsonl", [_rec(1, 9, 9, 9, 9, 99), _rec(2, 2, 1, 1.0, 0.5, 5.5),
                                         _rec(3, 2, 1, 1.0, 0.5, 5.5)])
    out = tmp_path / "r.json"
    assert step_ratio.main(["--grpo", str(grpo), "--oblr", str(oblr), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["grpo_phase_shares"] == pytest.approx({"rollout": 0.4, "scoring": 0.2, "update": 0.2, "other": 0.2})
    assert res["update_ratio"] == pytest.approx(1.5)  # 1.5 s over 1.0 s
    # (2 + 1 + 1 + 1.5 * 1) / 5 = 1.1, by hand
    assert res["whole_step_ratio_computed"] == pytest.approx(1.1)
    assert res["whole_step_ratio_runs"] == pytest.approx(5.5 / 5)
    assert res["whole_step_ratio_label"] == "computed from measured update ratio and phase shares"
    assert "whole-step ratio: 1.100 (computed from measured update ratio and phase shares)" in capsys.readouterr().out


def test_a_given_update_ratio_and_the_formula():
    ph = {"rollout": 3.0, "scoring": 0.5, "update": 1.0, "other": 0.5, "step": 5.0}
    assert step_ratio.whole_step_ratio(ph, 1.0) == 1.0
    assert step_ratio.whole_step_ratio(ph, 2.0) == pytest.approx(6.0 / 5.0)
    assert sum(step_ratio.shares(ph).values()) == pytest.approx(1.0)


def test_bad_input_is_refused_in_one_line(tmp_path):
    empty = tmp_path / "m.jsonl"
    empty.write_text('{"step": 0, "time": 1.0}\n')
    with pytest.raises(SystemExit, match="no step with time/"):
        step_ratio.main(["--grpo", str(empty), "--update-ratio", "1.1"])
    for bad in (["--grpo", str(empty)], ["--oblr", str(empty)], ["--update-ratio", "0"], ["--steps", "1"]):
        with pytest.raises(SystemExit):
            step_ratio.main(bad)


def test_set_overrides_reach_both_runs_and_the_command(tmp_path, monkeypatch, capsys):
    """``--set KEY=VALUE`` goes to every run this script makes (both methods, every round) and into the printed
    command; a malformed one, or one with ``--grpo``, is refused before any run."""
    seen = []

    def fake_run(extra, steps, out_dir, log):
        seen.append(extra)
        is_oblr = "algorithm.baseline=oblr" in extra
        return _write(tmp_path / f"{out_dir.name}.jsonl", [_rec(1, 9, 9, 9, 9, 99), _rec(2, 2, 1, 1.0 + is_oblr, 0, 4),
                                                          _rec(3, 2, 1, 1.0 + is_oblr, 0, 4)])

    monkeypatch.setattr(step_ratio, "run_train", fake_run)
    out = tmp_path / "r.json"
    assert step_ratio.main(["--rounds", "2", "--set", "task.name=countdown", "--set", "rollout.prompts_per_step=128",
                            "--json", str(out)]) == 0
    assert len(seen) == 4 and all(e[:2] == ("task.name=countdown", "rollout.prompts_per_step=128") for e in seen)
    assert json.loads(out.read_text())["update_ratio"] == pytest.approx(2.0)
    assert "--set task.name=countdown --set rollout.prompts_per_step=128" in capsys.readouterr().out
    for bad in (["--set", "novalue"], ["--set", "=1"], ["--grpo", str(out), "--update-ratio", "1", "--set", "a=1"]):
        with pytest.raises(SystemExit):
            step_ratio.main(bad)
    assert len(seen) == 4
