"""benchmarks/flop_ratios.py: it reads every committed step_cost table, its case names give the shapes the
measurements ran on, docs/scale.md's FLOP section is its output, and memory.py's --doc keeps that section."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import flop_ratios  # noqa: E402


def test_case_names_give_the_measured_shapes():
    import memory
    import step_cost

    for case in step_cost.FULL_CASES + step_cost.QUICK_CASES:
        if case.lora_rank:  # the FLOP model counts full fine-tuning: a LoRA case is not compared
            with pytest.raises(ValueError, match="LoRA"):
                flop_ratios.case_shape(case.name)
            continue
        s, B, T, G = flop_ratios.case_shape(case.name)
        assert s == memory.shape_of(case)
        assert (B, T, G) == (case.n_prompts * case.group_size, case.prompt_len + case.response_len, case.group_size)
    with pytest.raises(ValueError, match="not a step_cost case name"):
        flop_ratios.case_shape("hidden 12")


def test_reads_every_committed_table():
    tables = flop_ratios.parse_tables(flop_ratios.DEFAULT_RESULTS)
    ckpt = [t for t in tables if "oblr_ckpt" in t["rows"]]
    # docs/performance.md: 5 cases (whole batch, micro-batches); results/step_cost/checkpointing.md: 1 case
    assert len(tables) >= 6 and len(ckpt) >= 1
    assert all(t["rows"]["grpo"][1] == 1.0 for t in tables)
    rows = flop_ratios.comparison_rows(tables)
    assert {(r["plan"], r["base"]) for r in rows} == {("oblr", "grpo"), ("grpo_ckpt", "grpo"), ("oblr_ckpt", "grpo"),
                                                       ("oblr_ckpt", "grpo_ckpt"), ("oblr_recompute", "grpo"),
                                                       ("oblr_recompute", "grpo_ckpt")}
    # results/step_cost/recompute.md: the recompute engine within a few % of the checkpointed GRPO step, as the
    # FLOP model says (one full recomputation and the one-pass engine's per-row products, no second backward)
    rec = [r for r in rows if r["plan"] == "oblr_recompute" and r["base"] == "grpo_ckpt"]
    assert len(rec) >= 3 and all(1.0 < r["predicted"] < 1.1 and 0.9 < r["measured"] < 1.15 for r in rec)
    pair = next(r for r in rows if r["plan"] == "oblr_ckpt" and r["base"] == "grpo_ckpt")
    assert pair["measured"] == pytest.approx(ckpt[0]["rows"]["oblr_ckpt"][0] / ckpt[0]["rows"]["grpo_ckpt"][0])
    assert 1.7 < pair["predicted"] < 1.9  # one more recomputation and activation-only backward than grpo_ckpt


def test_doc_section_is_the_scripts_output_and_the_header_is_memory_pys():
    import memory

    doc = (ROOT / "docs/scale.md").read_text()
    assert doc.startswith(memory.DOC_HEADER)
    assert doc.endswith(memory.planner_footer()), "docs/scale.md's planner section differs from benchmarks/memory.py's"
    block = flop_ratios.render(flop_ratios.parse_tables(flop_ratios.DEFAULT_RESULTS))
    assert block in doc, "docs/scale.md is stale: run python benchmarks/flop_ratios.py --doc docs/scale.md"


def test_doc_writers_own_their_sections(tmp_path):
    import memory

    doc = tmp_path / "scale.md"
    memory.write_doc(doc, "## Measured\n\ntable one")
    flop_ratios.write_doc(doc, flop_ratios.BEGIN + "\nflops one\n" + flop_ratios.END)
    flop_ratios.write_doc(doc, flop_ratios.BEGIN + "\nflops two\n" + flop_ratios.END)  # replaced, not appended
    memory.write_doc(doc, "## Measured\n\ntable two")  # memory.py rewrites its part and keeps the FLOP section
    text = doc.read_text()
    assert text.startswith(memory.DOC_HEADER) and "### Measured\n\ntable two" in text and "table one" not in text
    assert text.count(flop_ratios.BEGIN) == 1 and "flops two" in text and "flops one" not in text


def test_bad_input(tmp_path):
    with pytest.raises(SystemExit, match="no such file or folder"):
        flop_ratios.parse_tables([tmp_path / "missing.md"])
    f = tmp_path / "t.md"
    f.write_text("| method | step time (s, median) | time / GRPO | x |\n|---|---|---|---|\n| grpo | 1.0 | 1.00 | - |\n")
    with pytest.raises(SystemExit, match=r"t.md:1: a step_cost table with no \*\*case\*\* line"):
        flop_ratios.parse_tables([f])
    f.write_text("nothing here\n")
    with pytest.raises(SystemExit, match="no step_cost tables"):
        flop_ratios.parse_tables([f])
