"""scripts/same_numbers.py without running oblr train: the comparison of two metrics.jsonl files finds a
changed value, a missing key and a missing row, skips only the wall-clock keys, and refuses an unknown case."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import same_numbers as sn  # noqa: E402

ROWS = [{"step": 0, "time": 1.0, "eval/accuracy_sampled": 0.25},
        {"step": 1, "time": 2.0, "time/step": 0.5, "optim/lr": 1e-3, "snr/V": float("nan"), "optim/skipped": 0.0}]


def _copy(rows):
    return [dict(r) for r in rows]


def test_identical_runs_but_for_the_clock_have_no_difference():
    other = _copy(ROWS)
    other[0]["time"], other[1]["time"], other[1]["time/step"] = 9.0, 10.0, 7.0
    rows, n, diffs = sn.compare(ROWS, other)
    assert (rows, diffs) == (2, [])
    assert n == 2 + 4  # step and accuracy; step, lr, V (NaN equals NaN), skipped -- no time key


def test_a_changed_bit_a_missing_key_and_a_missing_row_are_reported():
    other = _copy(ROWS)
    other[1]["optim/lr"] = 1e-3 * (1 + 2 ** -40)
    del other[0]["eval/accuracy_sampled"]
    _, _, diffs = sn.compare(ROWS, other)
    assert len(diffs) == 2 and "optim/lr" in diffs[1] and "only in base" in diffs[0]
    _, _, diffs = sn.compare(ROWS, other[:1])
    assert diffs[0] == "2 rows against 1"
    assert not sn.same(1, 1.0)  # an int written where a float was is a different file


def test_only_the_clock_is_skipped():
    assert sn.skipped("time") and sn.skipped("time/norms")
    assert not sn.skipped("timeout") and not sn.skipped("optim/lr") and not sn.skipped("eval/time")


def test_unknown_case_is_refused(capsys):
    with pytest.raises(SystemExit):
        sn.main(["--cases", "default,nope"])
    assert "unknown case(s) nope" in capsys.readouterr().err
