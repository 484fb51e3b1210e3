"""FSDP2 start-up on the meta device (oblr.distributed.meta_init) against the full copy on every rank.

In one process: the empty build has every parameter on the meta device, its rotary buffers computed as
a normal build computes them, and its embeddings tied; the trainer's loader gives it with ``empty``. On 2
processes (torchrun, gloo, CPU; ``tests/meta_init_worker.py``): after set-up (policy and its KL reference,
as ``place_for_training`` makes them) and after one training step the parameters are bitwise those of the
full-copy path, in float32 and loaded into bfloat16, with tied embeddings still one parameter and the
rotary buffers equal; a checkpoint missing a tensor is refused in one line on every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_qwen3

from oblr.distributed.meta_init import build_empty

HERE = Path(__file__).resolve().parents[1]  # tests/: the worker and the shared helpers


def _equal(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tied tiny Qwen3 saved with save_pretrained, and a copy whose weights lack one tensor."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("meta")
    model = tiny_qwen3()
    model.save_pretrained(root / "model")
    broken = root / "broken"
    model.save_pretrained(broken)
    (f,) = broken.glob("*.safetensors")
    state = load_file(str(f))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(f), metadata={"format": "pt"})
    return root / "model", broken


def test_empty_build_has_meta_parameters_real_buffers_and_tied_embeddings(saved):
    path, _ = saved
    model = build_empty(path, dtype=torch.float32, device="cpu")
    ref = tiny_qwen3()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    bufs, ref_bufs = dict(model.named_buffers()), dict(ref.named_buffers())
    assert sorted(bufs) == sorted(ref_bufs) and "model.rotary_emb.inv_freq" in bufs
    assert all(torch.equal(bufs[n], ref_bufs[n]) for n in bufs)
    assert model.oblr_empty_build.path == str(path)
    bf16 = build_empty(path, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}


def test_loader_builds_empty_only_when_asked_and_safetensors_exist(small_builtin):
    from oblr.models import load_model_and_tokenizer

    empty, tok = load_model_and_tokenizer(small_builtin, empty=True)
    assert all(p.device.type == "meta" for p in empty.parameters()) and tok.padding_side == "left"
    assert empty.config.pad_token_id == tok.pad_token_id
    full, _ = load_model_and_tokenizer(small_builtin)
    assert all(p.device.type == "cpu" for p in full.parameters())
    assert full.generation_config.to_dict() == empty.generation_config.to_dict()


@pytest.fixture(scope="module")
def worker_results(saved, tmp_path_factory):
    out = tmp_path_factory.mktemp("meta_out") / "results.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "meta_init_worker.py"), str(saved[0]), str(saved[1]), str(out)]
    proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out, weights_only=False)


def test_meta_start_up_equals_the_full_copy_after_set_up_and_after_a_step(worker_results):
    assert worker_results["world_size"] == 2
    full, meta = worker_results["full"], worker_results["meta"]
    saved = tiny_qwen3().state_dict()
    for when in ("setup", "after"):
        for which in (full, meta):
            assert which[when]["tied"] and which[when]["types"] == ["DTensor"]
        assert _equal(meta[when]["weights"], full[when]["weights"]), when
        assert _equal(meta[when]["buffers"], full[when]["buffers"]), when
    assert _equal(meta["ref"]["weights"], full["ref"]["weights"]) and meta["ref"]["tied"]
    # the set-up holds the saved weights; the step moved every parameter, identically on both paths
    assert all(torch.equal(v, saved[k]) for k, v in meta["setup"]["weights"].items())
    assert all(not torch.equal(v, saved[k]) for k, v in meta["after"]["weights"].items())
    assert _equal(meta["ref"]["weights"], meta["setup"]["weights"])  # the KL reference stays the start model
    for key in ("grads", "grads2", "params"):
        assert len(meta["step"][key]) == len(full["step"][key]) > 0
        assert all(torch.equal(a, b) for a, b in zip(meta["step"][key], full["step"][key])), key
    inv = meta["setup"]["buffers"]["model.rotary_emb.inv_freq"]
    assert torch.equal(inv, dict(tiny_qwen3().named_buffers())["model.rotary_emb.inv_freq"])


def test_meta_start_up_into_bfloat16_equals_the_full_copy(worker_results):
    full, meta = worker_results["full-bf16"], worker_results["meta-bf16"]
    assert meta["dtypes"] == full["dtypes"] == ["torch.bfloat16"] and meta["tied"]
    assert _equal(meta["weights"], full["weights"]) and _equal(meta["buffers"], full["buffers"])


def test_weights_missing_a_tensor_are_refused_in_one_line_on_every_rank(worker_results):
    msgs = worker_results["broken"]
    assert len(msgs) == 2 and msgs[0] == msgs[1]
    assert "lack 1 tensor(s) of the model, e.g. 'model.layers.1.mlp.up_proj.weight'" in msgs[0]
    assert "\n" not in msgs[0]
