"""benchmarks/default_run.py: the claim from per-seed results (mean, sample std), the table, and the verdicts
of a new run (start accuracy identical for a measured seed; final accuracy within the spread of a new seed)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import default_run as dr


def _res(start, final, g0=0.5, g1=0.55, wall=100.0):
    return {"eval_accuracy_initial": start, "eval_accuracy_final": final, "eval_accuracy_greedy_initial": g0,
            "eval_accuracy_greedy_final": g1, "wall_seconds": wall}


def test_claim_and_verdicts_by_hand():
    claim = dr.claim_from_runs({0: _res(0.17, 0.36), 1: _res(0.18, 0.38), 2: _res(0.19, 0.40)}, "ab" * 32, "c0ffee")
    assert math.isclose(claim["final_sampled_mean"], 0.38) and math.isclose(claim["final_sampled_std"], 0.02)
    half = 2 * 0.02 * math.sqrt(1 + 1 / 3)  # 0.0462: a new seed's spread around the mean of three
    ok, lines = dr.verdict(claim, 1, _res(0.18, 0.38))
    assert ok and "identical" in lines[0] and "within seed noise" in lines[1] and "identical" in lines[2]
    ok, lines = dr.verdict(claim, 1, _res(0.181, 0.38))  # the same seed must start exactly where it did
    assert not ok and "DIFFERENT" in lines[0]
    ok, lines = dr.verdict(claim, 7, _res(0.2, 0.38 + half - 1e-9))  # an unseen seed: no start check
    assert ok and len(lines) == 1
    ok, lines = dr.verdict(claim, 7, _res(0.2, 0.38 - half - 1e-3))
    assert not ok and "OUTSIDE" in lines[0]
    table = dr.claim_table(claim)
    assert "| 1 | 18.0% | 38.0% | 50.0% | 55.0% | 100 |" in table and "38.0% ± 2.0%" in table
    assert dr.command(3, Path("/x"))[-6:] == ["train", "model.device=cpu", "train.threads=1", "train.seed=3",
                                              "--output-dir", "/x"]


def test_keep_copies_the_record_with_the_start_model_and_no_machine_path(tmp_path):
    run = tmp_path / "tmpXYZ" / "seed0"
    run.mkdir(parents=True)
    for name in ("config.yaml", "summary.json", "code.json"):
        (run / name).write_text(f'{{"file": "{name}", "run_dir": "{run}/x"}}')
    dst = tmp_path / "kept" / "seed0"
    dr.keep(run, dst)
    for name in ("config.yaml", "summary.json", "code.json"):
        text = (dst / name).read_text()
        assert name in text and str(run) not in text and f"{dst.resolve()}/x" in text


def test_check_refuses_a_claim_of_another_default_schedule(tmp_path, capsys):
    claim = dr.claim_from_runs({0: _res(0.17, 0.36)}, "ab" * 32, "c0ffee", "snr")
    assert claim["lr_schedule"] == "snr"
    path = tmp_path / "claim.json"
    path.write_text(json.dumps(claim))
    assert dr._default_schedule() == "kl"
    assert dr.main(["check", "--claim", str(path)]) == 2  # before any run starts
    assert "measured with the default schedule 'snr'; the default is now 'kl'" in capsys.readouterr().err
    del claim["lr_schedule"]  # a claim from before the field: the snr default
    path.write_text(json.dumps(claim))
    assert dr.main(["check", "--claim", str(path)]) == 2


def test_check_refuses_a_claim_of_another_kl_target_before_running(tmp_path, capsys):
    want = dr._default_kl_target()
    assert want == 1.5e-3 * 16 / 128  # the default run: kl, AdamW, N = 16
    claim = dr.claim_from_runs({0: _res(0.17, 0.36)}, "ab" * 32, "c0ffee", "kl", 3.75e-4)  # the first target
    path = tmp_path / "claim.json"
    path.write_text(json.dumps(claim))
    assert dr.main(["check", "--claim", str(path)]) == 2
    assert "measured at the kl target 0.000375; the default resolves to 0.0001875 now" in capsys.readouterr().err
    assert dr.check_settings({**claim, "kl_target": want}) is None
    assert dr.check_settings({**claim, "kl_target": None}) is None  # a claim from before the field: checked, noted


def test_the_committed_claim_matches_todays_default():
    claim = json.loads((dr.DEFAULT_OUT / "claim.json").read_text())
    assert dr.check_settings(claim) is None and claim["kl_target"] == dr._default_kl_target()


def test_logged_kl_target_reads_the_first_row_that_has_it(tmp_path):
    rows = [{"step": 0, "eval/accuracy_sampled": 0.2}, {"step": 1, "kl/target": 1.875e-4}, {"step": 2, "kl/target": 9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert dr.logged_kl_target(tmp_path) == 1.875e-4
    (tmp_path / "metrics.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert dr.logged_kl_target(tmp_path) is None
