"""benchmarks/gpu/memory_check.py cannot rot: its CPU path (--dry-run = --device cpu --tiny) runs the exactness
check of the checkpointed two-pass update against the loop and the measured-vs-predicted peaks on tiny shapes;
and it refuses settings it cannot run in one line. The committed GPU summary is summarize_scale.py's output."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "gpu"))


def test_dry_run_checks_exactness_and_writes_every_memory_row(one_thread, tmp_path):
    import memory_check

    from oblr import memory_model as mm

    out = tmp_path / "mc.json"
    rep = memory_check.main(["--dry-run", "--out", str(out)])
    assert json.loads(out.read_text())["device"] == "cpu" and rep["tiny"]
    ex = rep["exactness"]
    for key in ("micro_batch_groups=0", "micro_batch_groups=1", "micro_batch_groups=0, output layer in chunks of 4",
                "micro_batch_groups=1, output layer in chunks of 4"):
        assert set(ex[key]["errors"]) == {"w", "adv", "grad", "gk", "S", "V", "lr"}
        assert ex[key]["passed"] and ex[key]["max_error"] <= memory_check.RTOL, ex[key]
        assert ex[key]["values"]["S"] > 0  # a step with signal, so S and the lr are really compared
    rows = rep["memory"]
    assert [(r["model"], r["plan"]) for r in rows] == [(label, p) for label, _, plans in memory_check.MEMORY_TINY
                                                       for p in plans]
    for r, (_, shape, _) in zip(rows, [c for c in memory_check.MEMORY_TINY for _ in c[2]]):
        assert r["measured_bytes"] > 0
        chunk = memory_check.TINY_CHUNK if r["plan"].endswith("_chunk") else 0
        assert r["predicted_bytes"] == mm.step_peak_bytes(shape, r["plan"].removesuffix("_chunk"), r["batch"],
                                                          r["tokens"], act_bytes=2, grad_bytes=2, logit_chunk=chunk, groups=2)
        assert r["ratio"] == pytest.approx(r["measured_bytes"] / r["predicted_bytes"])


def test_a_wrong_exactness_would_fail(one_thread, monkeypatch, tmp_path):
    """The comparison is live: a two-pass engine that drops one layer's contribution fails the check."""
    import memory_check

    from oblr.gradnorm import twopass

    real = twopass.TwoPassBookKeeper._take
    seen = []

    def drop_first(self, h, x, g):
        if not seen:
            seen.append(h.path)
            return None
        return real(self, h, x, g)

    monkeypatch.setattr(twopass.TwoPassBookKeeper, "_take", drop_first)
    rep = memory_check.main(["--dry-run", "--skip", "memory", "--out", str(tmp_path / "x.json")])
    assert seen and not rep["exactness"]["micro_batch_groups=0"]["passed"]


def test_refusals(tmp_path, capsys):
    import memory_check

    out = str(tmp_path / "x.json")
    for argv, msg in ((["--device", "cpu"], "needs a CUDA GPU"), (["--device", "tpu"], "--device must be"),
                      (["--dry-run", "--skip", "nothing"], "--skip takes"),
                      (["--dry-run", "--response-len", "0"], "--response-len must be"),
                      (["--dry-run", "--models", "Qwen3-4B"], "does not go with --tiny"),
                      (["--dry-run", "--plans", "grpo,fast"], "--plans: unknown ['fast']"),
                      (["--dry-run", "--time-repeats", "-1"], "--time-repeats must be"),
                      (["--dry-run", "--lora-rank", "-1"], "--lora-rank must be")):
        with pytest.raises(SystemExit):
            memory_check.main(argv + ["--out", out])
        assert msg in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            memory_check.main(["--device", "cuda", "--out", out])
        assert "CUDA is not available" in capsys.readouterr().err


def test_timing_comparison_and_profile_rows(one_thread, tmp_path):
    """--plans keeps a subset; --time-repeats adds medians and the ratio to the GRPO twin; --fp32-compare and
    --profile add their entries to each OBLR-PO row (on CPU the two product settings are the same arithmetic)."""
    import memory_check

    rep = memory_check.main(["--dry-run", "--skip", "exactness", "--plans", "grpo_ckpt,oblr_ckpt", "--time-repeats",
                             "2", "--fp32-compare", "--profile", "--out", str(tmp_path / "x.json")])
    rows = rep["memory"]
    assert [r["plan"] for r in rows] == ["grpo_ckpt", "oblr_ckpt"] * 2
    for r in rows:
        assert len(r["step_seconds_all"]) == 2 and r["step_seconds"] > 0
    for r in rows[1::2]:
        assert r["time_vs_grpo"] > 0 and "aten::" in r["profile"]
        n = r["norm_products"]
        assert n["w_rel_diff"] == 0 and n["gk_rel_diff"] == 0 and n["grad_rel_diff"] == 0
    from oblr.gradnorm import precision

    assert precision.TF32_HALF_PRODUCTS  # restored


def test_lora_rows(one_thread, tmp_path):
    """--lora-rank: the models carry LoRA adapters (labelled); the recompute plan is priced with them, the
    others with the full model's gradients (``lora_modelled`` False)."""
    import memory_check

    from oblr import memory_model as mm

    rep = memory_check.main(["--dry-run", "--skip", "exactness", "--plans", "grpo_ckpt,oblr_recompute",
                             "--lora-rank", "2", "--out", str(tmp_path / "x.json")])
    rows = rep["memory"]
    assert [(r["model"], r["plan"]) for r in rows] == [(f"{label}+LoRA2", p) for label, _, _ in memory_check.MEMORY_TINY
                                                       for p in ("grpo_ckpt", "oblr_recompute")]
    for r, (_, shape, _) in zip(rows, [c for c in memory_check.MEMORY_TINY for _ in range(2)]):
        assert r["lora_rank"] == 2 and r["lora_modelled"] == (r["plan"] == "oblr_recompute")
        assert r["predicted_bytes"] == mm.step_peak_bytes(shape, r["plan"], r["batch"], r["tokens"], act_bytes=2,
                                                          grad_bytes=2, head_trainable=False, lora_rank=2, groups=2)
    full = mm.step_peak_bytes(memory_check.MEMORY_TINY[0][1], "oblr_recompute", rows[1]["batch"], rows[1]["tokens"],
                              act_bytes=2, grad_bytes=2, groups=2)
    assert rows[1]["predicted_bytes"] < full


def test_a_plan_out_of_memory_is_recorded_and_the_others_run(one_thread, monkeypatch, tmp_path):
    import memory_check

    real, calls = memory_check._peak_cpu, []

    def second_fails(fn):
        calls.append(fn)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("test")
        return real(fn)

    monkeypatch.setattr(memory_check, "_peak_cpu", second_fails)
    rep = memory_check.main(["--dry-run", "--skip", "exactness", "--plans", "grpo_ckpt,oblr_ckpt,oblr_recompute",
                             "--time-repeats", "1", "--out", str(tmp_path / "x.json")])
    rows = [r for r in rep["memory"] if r["model"] == "tiny tied"]
    assert [(r["plan"], bool(r.get("out_of_memory"))) for r in rows] == [
        ("grpo_ckpt", False), ("oblr_ckpt", True), ("oblr_recompute", False)]
    assert "step_seconds" not in rows[1] and rows[1]["predicted_bytes"] > 0
    assert rows[2]["step_seconds"] > 0 and rows[2]["time_vs_grpo"] > 0


def test_models_option_names_full_shapes(tmp_path, capsys):
    import memory_check

    with pytest.raises(SystemExit):
        memory_check.main(["--device", "cpu", "--models", "Qwen3-9B", "--out", str(tmp_path / "x.json")])
    assert "--models: unknown ['Qwen3-9B']" in capsys.readouterr().err  # before the device is looked at


def test_committed_gpu_summary_is_the_scripts_output(tmp_path):
    """benchmarks/results/gpu/h200_scale/summary.md is what summarize_scale.py makes of the run folders beside it;
    and the summary's counts come from the rows (a changed ratio changes the count)."""
    import shutil

    import summarize_scale

    root = ROOT / "benchmarks/results/gpu/h200_scale"
    assert (root / "summary.md").read_text() == summarize_scale.summarize(root) + "\n"
    assert (root / "time_ratios.png").stat().st_size > 0
    copy = tmp_path / "h200_scale"
    shutil.copytree(root, copy)
    log = copy / "1_before" / "log.txt"
    text = log.read_text()
    row = re.search(r"Qwen3-8B grpo_ckpt: measured [\d.]+ GiB, predicted 52.651 GiB \(0.889\)", text).group(0)
    log.write_text(text.replace(row, "Qwen3-8B grpo_ckpt: measured 26.326 GiB, predicted 52.651 GiB (0.500)"))  # 8B
    before = re.search(r"(\d+) of (\d+) measured peaks are within 15%", summarize_scale.summarize(root)).groups()
    text = summarize_scale.summarize(copy)
    assert f"{int(before[0]) - 1} of {before[1]} measured peaks are within 15%" in text and "| 0.500 |" in text
