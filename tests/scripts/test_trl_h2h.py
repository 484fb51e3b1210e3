"""benchmarks/trl_h2h.py without training: a finished run is reused only when its protocol, start model's
weights included, is this one (the built-in model is rebuilt per machine, and its weights differ between
machines); the start model's hash follows its weights."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trl_h2h  # noqa: E402


def _args(tmp_path, sha):
    a = trl_h2h.parse_args(["--out", str(tmp_path), "--steps", "3"])
    a.model_sha = sha
    return a


def test_a_finished_run_is_reused_only_for_the_same_start_model(tmp_path, monkeypatch):
    calls = []

    def fake_native(variant, seed, a, out):
        calls.append((variant, seed, a.model_sha))
        return {"final": {"sampled": 0.5, "greedy": 0.5}, "lr": [1e-4]}

    monkeypatch.setattr(trl_h2h, "_native_run", fake_native)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    first = trl_h2h.run_one(("native-grpo", 0, _args(tmp_path, "aaaa")))
    assert not first.get("reused") and first["protocol"]["model_sha"] == "aaaa"
    again = trl_h2h.run_one(("native-grpo", 0, _args(tmp_path, "aaaa")))
    assert again["reused"] and len(calls) == 1
    other = trl_h2h.run_one(("native-grpo", 0, _args(tmp_path, "bbbb")))
    assert not other.get("reused") and len(calls) == 2
    saved = json.loads((tmp_path / "native-grpo" / "seed0" / "result.json").read_text())
    assert saved["protocol"]["model_sha"] == "bbbb"


def test_model_sha_follows_the_weights(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    import oblr.models as models

    monkeypatch.setattr(models, "resolve_model_path", lambda name, **kw: Path(name))
    save_file({"w": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    h0 = trl_h2h.model_sha(str(tmp_path))
    assert h0 == trl_h2h.model_sha(str(tmp_path)) and len(h0) == 16
    save_file({"w": torch.tensor([0.0, 0.0, 1e-7])}, str(tmp_path / "model.safetensors"))
    assert trl_h2h.model_sha(str(tmp_path)) != h0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit, match="no weight files"):
        trl_h2h.model_sha(str(empty))
