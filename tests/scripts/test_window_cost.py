"""benchmarks/window_cost.py times per-row token windows against the cropped span: both ways give the same
numbers, the table names the model's choice, and the markdown carries the command."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_both_ways_agree_and_the_table_names_the_choice(tmp_path, monkeypatch):
    import window_cost

    from oblr.gradnorm import windows

    c, (first, last) = window_cost.make(16, 10, 4, 3, 0.4, seed=1)
    for k in range(16):  # zero exactly outside each row's window, row 0 whole
        assert not bool(c.left[k, :first[k]].any()) and not bool(c.left[k, last[k]:].any())
    assert (first[0], last[0]) == (0, 10)
    monkeypatch.setattr(window_cost, "CASES", [(16, 10, 4, 3, 0.4), (4, 256, 256, 256, 0.3)])
    out = tmp_path / "w.md"
    assert window_cost.main(["--reps", "1", "--out", str(out)]) == 0
    rows = [r for r in out.read_text().splitlines() if r.startswith("| ") and r[2].isdigit()]
    assert len(rows) == 2
    first_row, second = (r.split("|") for r in rows)
    assert first_row[9].strip() == "no" and second[9].strip().startswith("yes")  # dispatch-bound / worth it
    assert all(float(r[10]) < 1e-5 for r in (first_row, second))  # the same numbers both ways
    assert all(float(r[11]) > 0 and float(r[12]) > 0 for r in (first_row, second))  # both searches timed
    assert "python benchmarks/window_cost.py --reps 1" in out.read_text()
    wide, win = window_cost.make(4, 256, 256, 256, 0.3)
    assert windows.row_windows_pay(wide, *win) and not windows.row_windows_pay(c, first, last)
