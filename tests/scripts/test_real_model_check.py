"""benchmarks/real_model_check.py on a tiny Llama prepared from a GGUF file (the real run uses SmolLM2-135M):
the batched w_i match the loop reference for full fine-tuning and LoRA, and the summary files are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import real_model_check  # noqa: E402
from gguf_helpers import write_fake_wheel, write_tiny_llama_gguf  # noqa: E402

from oblr.models.prepare import get_entry, prepare_model  # noqa: E402


def test_check_on_a_tiny_prepared_model(tmp_path):
    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    wheel = write_fake_wheel(tmp_path / "w.whl", get_entry("smollm2-135m-instruct").member, tmp_path / "tiny.gguf")
    model = prepare_model("smollm2-135m-instruct", out=tmp_path / "model", from_wheel=wheel, progress=None)
    out = tmp_path / "summary"
    assert real_model_check.main(["--model", str(model), "--out", str(out), "--sequences", "3",
                                  "--response-tokens", "5", "--lora-rank", "2", "--skip-eval"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["batch"]["sequences"] == 3 and all(n >= 1 for n in s["batch"]["response_tokens"])
    for key in ("full", "lora"):
        assert all(w > 0 for w in s[key]["w_loop"])
        assert set(s[key]["methods"]) == {"ghost", "materialize", "auto"}
        assert all(m["max_rel_err"] < 1e-4 for m in s[key]["methods"].values()), key
    assert s["lora"]["trainable_parameters"] < s["full"]["trainable_parameters"]
    assert "| LoRA r=2 |" in (out / "summary.md").read_text()
