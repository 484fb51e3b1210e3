"""``oblr export``: a LoRA run's adapters merged into its base (the logits of the adapters as trained, loadable
without peft), a full run's checkpoint as its weights (bit for bit, or cast), and the refusals and the
interrupted write that must leave the user's folders as they were. The sharded case (an FSDP run's
checkpoint) is in tests/distributed/test_distributed_train.py, where such a checkpoint is made."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from oblr.cli import main


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def _logits(model, tok):
    ids = tok(["12+7*3=", "4*(5-2)="], return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**ids).logits


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """A 1-step full fine-tuning run of the built-in task (its checkpoint holds the whole model, which the step
    moved: the shipped model gets rewards to learn from)."""
    from safetensors.torch import load_file

    from oblr.models import load_model_and_tokenizer

    run = tmp_path_factory.mktemp("full") / "run"
    assert main(["train", "train.steps=1", "algorithm.lr_schedule=constant", "optim.lr=1e-3",
                 "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=24",
                 "task.eval_size=4", "train.eval_samples=1", "train.threads=1",
                 "task.options={n_train: 50, n_eval: 8}", "--output-dir", str(run), "--quiet"]) == 0
    saved = load_file(run / "checkpoints" / "step_000001" / "model.safetensors")
    start = load_model_and_tokenizer("builtin")[0].state_dict()
    assert any(not torch.equal(v, start[n]) for n, v in saved.items())
    return run


def test_export_of_a_lora_run_is_its_adapters_merged_and_loads_without_peft(lora_run, tmp_path, capsys):
    """The run folder's newest checkpoint, merged into the base the run trained: a plain model folder (no
    adapter files, no trainer state) whose logits are the unmerged adapters' to float32 rounding, and not the
    base's; the record names the source step, the base and the dtype."""
    from transformers import AutoModelForCausalLM

    from oblr.models import load_lora_checkpoint, load_model_and_tokenizer

    run, _ = lora_run
    out = tmp_path / "merged"
    assert main(["export", "--model", str(run), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "[export] run folder" in err and "its checkpoint step_000002" in err
    assert "LoRA adapters merged into builtin, float32" in err
    files = _files(out)
    assert "model.safetensors" in files and "config.json" in files and "tokenizer.json" in files, files
    assert not any(f.startswith("adapter") or f == "trainer_state.pt" for f in files), files
    record = json.loads((out / "oblr_export.json").read_text())
    assert record["step"] == 2 and record["base_model"] == "builtin" and record["dtype"] == "float32"
    assert not list(tmp_path.glob(".merged.tmp*"))

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not hasattr(merged, "peft_config")
    adapters, tok = load_lora_checkpoint(run / "checkpoints" / "step_000002", "builtin")
    base, _ = load_model_and_tokenizer("builtin")
    got, want, plain = _logits(merged, tok), _logits(adapters, tok), _logits(base, tok)
    assert torch.allclose(got, want, rtol=0, atol=1e-4), (got - want).abs().max()
    assert (got - plain).abs().max() > 100 * (got - want).abs().max()  # the adapters are in the weights


@pytest.mark.parametrize("dtype", ["auto", "bfloat16"])
def test_export_of_a_full_checkpoint_is_its_weights(full_run, tmp_path, dtype):
    """A full fine-tuning checkpoint: its weights bit for bit (auto keeps the saved float32), or cast once to
    bfloat16 (the file holds bfloat16 and config.json says so); no trainer state or manifest comes along."""
    from safetensors.torch import load_file

    from oblr.models import load_model_and_tokenizer

    ckpt = full_run / "checkpoints" / "step_000001"
    out = tmp_path / "model"
    assert main(["export", "--model", str(ckpt), "--out", str(out), "--dtype", dtype]) == 0
    assert not {"trainer_state.pt", "MANIFEST.json"} & set(_files(out))
    record = json.loads((out / "oblr_export.json").read_text())
    assert record["what"] == "weights as saved" and record["step"] == 1 and record["base_model"] is None
    want = load_file(ckpt / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert got.keys() == want.keys()
    cast = torch.float32 if dtype == "auto" else torch.bfloat16
    assert all(got[k].dtype == cast and torch.equal(got[k], want[k].to(cast)) for k in want)
    assert json.loads((out / "config.json").read_text())["dtype"] == ("float32" if dtype == "auto" else "bfloat16")
    model, _ = load_model_and_tokenizer(str(out), dtype="bfloat16" if dtype == "bfloat16" else "float32")
    assert all(torch.equal(v, want[n].to(cast)) for n, v in model.state_dict().items() if n in want)


def test_export_refuses_before_loading_and_an_interrupted_export_leaves_nothing(full_run, tmp_path, capsys,
                                                                               monkeypatch):
    """An --out that holds anything is refused in one line and left as it was; --base-model only for adapters;
    a folder that is no model nor run is named; an export cut off mid-write leaves neither --out nor its
    hidden temporary folder, and the source checkpoint is untouched."""
    import oblr.export_cli

    ckpt = full_run / "checkpoints" / "step_000001"
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for argv, msg in [
        (["--model", str(ckpt), "--out", str(taken)], "exists and is not an empty folder"),
        (["--model", str(ckpt), "--out", str(taken / "notes.txt" / "x")], "is not a folder"),
        (["--model", str(ckpt), "--out", str(tmp_path / "a"), "--base-model", "builtin"],
         "only adapters take a base model"),
        (["--model", str(tmp_path / "taken"), "--out", str(tmp_path / "b")], "neither a saved model"),
        (["--model", str(ckpt), "--out", str(tmp_path / "c"), "--device", "auto"], "name the device"),
        (["--model", str(ckpt), "--out", str(tmp_path / "d"), "--device", "gpu7"], "is not auto, cpu"),
    ] + ([] if torch.cuda.is_available() else [
        (["--model", str(ckpt), "--out", str(tmp_path / "e"), "--device", "cuda"], "has no CUDA device")]):
        assert main(["export", *argv]) == 2
        err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("oblr: error")]
        assert len(err) == 1 and msg in err[0], (argv, err)
    assert _files(taken) == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
    assert not any((tmp_path / x).exists() for x in "abcde")

    before = {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()}

    def cut(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("transformers.PreTrainedTokenizerBase.save_pretrained", cut)
    out = tmp_path / "cut"
    assert main(["export", "--model", str(ckpt), "--out", str(out)]) == 130
    assert not out.exists() and not list(tmp_path.glob(".cut.tmp*"))
    assert {p.name: p.stat().st_mtime_ns for p in ckpt.iterdir()} == before
    monkeypatch.undo()
    empty = tmp_path / "empty"  # an empty folder is taken (e.g. made by a job script) and filled
    empty.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # the folder of an export killed outright (its process gone) is removed; a live one's stays
    (tmp_path / f".empty.tmp{dead.pid}").mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".empty.tmp{live.pid}").mkdir()
        assert oblr.export_cli.export_model(ckpt, empty).name == "empty"
        assert [p.name for p in tmp_path.glob(".empty.tmp*")] == [f".empty.tmp{live.pid}"]
    finally:
        live.kill()
        live.wait()
    assert "model.safetensors" in _files(empty)
