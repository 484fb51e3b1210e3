"""benchmarks/real_model_rl.py end to end on a tiny Llama prepared from a GGUF file (the real run uses
SmolLM2-135M-Instruct): both methods train with LoRA on the chat-template arithmetic task (two at once), start
from the same held-out accuracy, and results.json, summary.md and the PNG are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_model_rl  # noqa: E402
from gguf_helpers import prepared_tiny_llama  # noqa: E402


def test_both_methods_run_and_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    model = prepared_tiny_llama(tmp_path)
    runs, out, fig = tmp_path / "runs", tmp_path / "out", tmp_path / "fig.png"
    config = ROOT / "configs/real-model/smollm2-arith-chat-lora.yaml"
    assert real_model_rl.main(["--config", str(config), "--runs", str(runs), "--out", str(out), "--figure", str(fig),
                               f"model.name_or_path={model}", "model.lora_rank=2", "train.steps=2",
                               "train.eval_every=2", "task.eval_size=3", "rollout.max_new_tokens=4", "--jobs", "2"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert list(res["runs"]) == ["oblr-snr", "grpo-const"]
    oblr, grpo = res["runs"]["oblr-snr"], res["runs"]["grpo-const"]
    assert oblr["config"]["algorithm"]["baseline"] == "oblr" and oblr["config"]["algorithm"]["lr_schedule"] == "snr"
    assert grpo["config"]["algorithm"]["baseline"] == "grpo" and grpo["config"]["algorithm"]["lr_schedule"] == "constant"
    for run in (oblr, grpo):
        assert run["finished"] and [s["step"] for s in run["steps"]] == [1, 2]
        assert all(0.0 <= s["train/reward_mean"] <= 1.0 and s["optim/lr"] >= 0 for s in run["steps"])
        assert run["result"]["end_sampled"] is not None and run["config"]["model"]["lora_rank"] == 2
        # the chat template of the checkpoint renders the prompts (ChatML, as SmolLM2's)
        assert run["config"]["task"]["options"]["style"] == "chat"
    # GRPO's lr is the constant optim.lr; the SNR rule's is at most that (eta_max)
    assert {s["optim/lr"] for s in grpo["steps"]} == {grpo["config"]["optim"]["lr"]}
    assert all(s["optim/lr"] <= oblr["config"]["optim"]["lr"] * (1 + 1e-6) for s in oblr["steps"])
    # same weights, problems and evaluation seed at step 0: the same start accuracy
    assert [e["step"] for e in oblr["evals"]] == [0, 2] == [e["step"] for e in grpo["evals"]]
    assert oblr["evals"][0] == grpo["evals"][0]
    md = (out / "summary.md").read_text()
    assert "| oblr-snr | 2 |" in md and "| grpo-const | 2 |" in md
    assert fig.stat().st_size > 1000 and not oblr["run_dir"].startswith("/")  # relative, never a machine path
    # finished runs are not run again: a second call only re-reads them
    mtime = (runs / "grpo-const" / "metrics.jsonl").stat().st_mtime
    assert real_model_rl.main(["--config", str(config), "--runs", str(runs), "--out", str(out), "--figure", str(fig),
                               f"model.name_or_path={model}"]) == 0
    assert (runs / "grpo-const" / "metrics.jsonl").stat().st_mtime == mtime


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(SystemExit):
        real_model_rl.main(["--methods", "nope"])
    with pytest.raises(SystemExit):
        real_model_rl.main(["--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(SystemExit):
        real_model_rl.main(["--jobs", "0"])
    with pytest.raises(SystemExit, match="not found"):
        real_model_rl.main(["--skip-train", "--runs", str(tmp_path)])
