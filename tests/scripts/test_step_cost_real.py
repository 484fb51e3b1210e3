"""benchmarks/step_cost.py --real (step_cost_real.py): a truncated real-micro-batch case runs on CPU in seconds
and writes the fields the GPU run is read by; the full-size cases are refused on CPU in one line before any
model is built (no timed assertions)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_cost  # noqa: E402
import step_cost_real as real  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_truncated_cases_run_and_record_their_fields(tmp_path, capsys):
    pytest.importorskip("peft")
    out = tmp_path / "real.json"
    names = ["qwen3-0.6b-T1024-b4-full-plain", "qwen3-0.6b-T1024-b4-lora-ckpt"]
    assert step_cost.main(["--real", ",".join(names), "--layers", "1", "--tokens", "12", "--vocab", "128",
                           "--repeats", "1", "--json", str(out)]) == 0
    recs = json.loads(out.read_text())["cases"]
    assert [r["name"] for r in recs] == names
    plain, ckpt = recs
    assert (plain["baseline"], plain["method"], plain["engine"]) == ("grpo", "oblr", "one_pass")
    # a generous CPU budget for a tiny shape: the planner's tie-break picks the recompute engine (one backward)
    assert (ckpt["baseline"], ckpt["method"], ckpt["engine"]) == ("grpo_ckpt", "oblr_recompute", "recompute")
    for r in recs:
        assert r["skipped"] == "" and r["truncated"] == {"layers": 1, "tokens": 12, "vocab": 128}
        assert (r["layers"], r["tokens"], r["vocab"], r["sequences"]) == (1, 12, 128, 4)
        b, m = r["runs"][r["baseline"]], r["runs"][r["method"]]
        assert b["error"] is None and m["error"] is None and len(b["times_s"]) == len(m["times_s"]) == 1
        # the ratios are the recorded medians' and peaks' quotients
        assert r["update_ratio"] == pytest.approx(m["median_s"] / b["median_s"])
        assert r["peak_ratio"] == pytest.approx(m["peak_bytes"] / b["peak_bytes"])
        assert m["peak_bytes"] > 0 and math.isfinite(r["update_ratio"])
    # LoRA r = 16 on q/k/v/o of one layer of width 1024 (q 1024 -> 2048, k/v 1024 -> 1024, o 2048 -> 1024)
    assert ckpt["n_trainable"] == 16 * ((1024 + 2048) * 2 + (1024 + 1024) * 2)
    table = capsys.readouterr().out
    assert "| qwen3-0.6b-T1024-b4-full-plain |" in table and "truncated: layers 1, tokens 12, vocab 128" in table


def test_full_size_cases_are_refused_on_cpu_in_one_line(tmp_path):
    out = tmp_path / "real.json"
    assert step_cost.main(["--real", "qwen3-4b-T4096-b16-*,qwen3-0.6b-T1024-b4-lora-ckpt", "--json", str(out)]) == 0
    recs = json.loads(out.read_text())["cases"]
    assert [r["name"] for r in recs] == ["qwen3-0.6b-T1024-b4-lora-ckpt"] + [
        f"qwen3-4b-T4096-b16-{how}" for how in ("full-plain", "full-ckpt", "lora-plain", "lora-ckpt")]
    for r in recs:
        assert r["skipped"].startswith(("would not fit", "would not finish")) and "\n" not in r["skipped"]
        assert "runs" not in r


def test_case_names_and_selection():
    cases = real.all_cases()
    assert len({c.name for c in cases}) == len(cases) == 2 * 2 * 2 * 2 * 2
    assert [c.name for c in real.select("qwen3-4b-T1024-b4-full-*")] == ["qwen3-4b-T1024-b4-full-plain",
                                                                           "qwen3-4b-T1024-b4-full-ckpt"]
    assert real.select("all") == cases
    with pytest.raises(ValueError, match="names no case"):
        real.select("qwen3-0.6b-T2048-b4-full-plain")
    c = real.case_of(real.RealCase("qwen3-4b", 4096, 16, False, True))
    assert (c.hidden, c.layers, c.n_prompts * c.group_size, c.prompt_len + c.response_len) == (2560, 36, 16, 4096)


def test_plan_refuses_a_budget_nothing_fits():
    rc = real.RealCase("qwen3-0.6b", 1024, 4, False, True)
    assert real.plan_case(rc, real.case_of(rc), budget=1e9, param_bytes=2)["skip"].startswith("would not fit")
    plan = real.plan_case(rc, real.case_of(rc), budget=1e15, param_bytes=2)
    assert (plan["method"], plan["logit_chunk"]) == ("oblr_recompute", 0)


@pytest.mark.parametrize("bad", [["--real", "nope"], ["--layers", "1"], ["--real", "all", "--cases", "1"],
                                 ["--real", "all", "--tokens", "2"], ["--device", "tpu"]])
def test_bad_arguments_are_refused(bad):
    with pytest.raises(SystemExit):
        step_cost.main(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_on_a_cpu_machine_is_refused(capsys):
    with pytest.raises(SystemExit):
        step_cost.main(["--real", "all", "--device", "cuda"])
    assert "CUDA is not available" in capsys.readouterr().err
