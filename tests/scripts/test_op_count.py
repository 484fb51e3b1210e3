"""benchmarks/op_count.py counts the operators a step dispatches; the two-pass step dispatches more than GRPO's;
several depths, the table it writes, and the counts at another revision's src/."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_counts_and_refusals(capsys):
    import op_count

    res = op_count.main(["--layers", "2", "--plans", "grpo_ckpt,oblr_ckpt"])
    assert set(res) == {2} and set(res[2]) == {"grpo_ckpt", "oblr_ckpt"}
    assert 0 < res[2]["grpo_ckpt"]["total"] < res[2]["oblr_ckpt"]["total"]
    assert sum(n for _, n in res[2]["oblr_ckpt"]["top"]) <= res[2]["oblr_ckpt"]["total"]
    assert "oblr_ckpt" in capsys.readouterr().out
    gpu = op_count.main(["--layers", "2", "--plans", "oblr", "--gpu-paths"])
    from oblr.gradnorm import stored, strips, windows

    assert strips.GRAM_STRIPS == 16 and stored.trim_windows is windows.trim_windows  # restored
    assert gpu[2]["oblr"]["total"] > 0
    for argv, msg in ((["--plans", "fast"], "--plans: unknown ['fast']"), (["--layers", "0"], "--layers must be"),
                      (["--layers", "2,x"], "--layers must be")):
        with pytest.raises(SystemExit):
            op_count.main(argv)
        assert msg in capsys.readouterr().err


def test_depths_table_and_before(tmp_path):
    """Two depths: GRPO's count grows with the layers; --out writes the command and one row per depth and plan, the
    ratio to the GRPO twin computed from the counts; --before HEAD counts again from the committed src/."""
    import op_count

    out = tmp_path / "ops.md"
    argv = ["--layers", "1,2", "--plans", "grpo,oblr", "--before", "HEAD", "--out", str(out)]
    res = op_count.main(argv)
    assert list(res) == [1, 2] and res[1]["grpo"]["total"] < res[2]["grpo"]["total"]
    text = out.read_text()
    assert "benchmarks/op_count.py " + " ".join(argv) in text and "GPU times are not measured" in text
    rows = [r for r in text.splitlines() if r.startswith("| 2 | oblr |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2] == f"{res[2]['oblr']['total']:,}"
    assert cells[3] == f"{res[2]['oblr']['total'] / res[2]['grpo']['total']:.2f}"
    assert int(cells[4].replace(",", "")) > 0 and cells[5]  # the before count and its ratio
    with pytest.raises(SystemExit, match="git archive failed"):
        op_count.counts_at("no-such-revision", [1], ["grpo"], False)
