"""The shipped built-in models: the bytes match their manifest, `builtin` resolves to them, their measured start
accuracy reproduces the manifest's exactly, and a damaged or missing file is refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from oblr.models import builtin_model_dir, resolve_model_path
from oblr.models import shipped as sh
from oblr.models.cli import builtin_entries

NAMES = dict(builtin_entries())


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_builtin_is_shipped_and_its_files_match_the_manifest():
    man = json.loads((sh.WEIGHTS_DIR / sh.MANIFEST_FILE).read_text())
    assert set(man) == set(NAMES.values())
    for dirname, ent in man.items():
        folder = sh.WEIGHTS_DIR / dirname
        on_disk = {p.name for p in folder.iterdir() if p.is_file()}
        assert on_disk == set(ent["files"]), dirname  # nothing unlisted ships, nothing listed is missing
        for name, digest in ent["files"].items():
            assert _sha(folder / name) == digest, (dirname, name)
        assert ent["weights_sha256"] == ent["files"]["model.safetensors"]
        meta = json.loads((folder / "oblr_builtin.json").read_text())
        assert meta["recipe"] == ent["recipe"] and meta["accuracy_greedy"] == ent["accuracy_greedy"]


def test_builtin_names_resolve_to_the_shipped_folders(monkeypatch, tmp_path):
    monkeypatch.delenv(sh.SOURCE_ENV, raising=False)
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path / "no-cache"))
    for name, dirname in NAMES.items():
        assert resolve_model_path(name) == sh.WEIGHTS_DIR / dirname
    assert resolve_model_path("builtin") == sh.WEIGHTS_DIR / NAMES["builtin:tiny-arith"]
    assert not (tmp_path / "no-cache").exists()  # nothing built, nothing written


def test_builtin_source_build_uses_the_cache_and_a_bad_value_is_refused(monkeypatch, tmp_path):
    from oblr.models import builtin as bm

    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(sh.SOURCE_ENV, "build")
    calls = []

    def fake_build(out, **kw):
        calls.append(out)
        raise RuntimeError("build reached")

    monkeypatch.setattr(bm, "build_builtin_model", fake_build)
    with pytest.raises(RuntimeError, match="build reached"):
        resolve_model_path("builtin")
    assert calls == [builtin_model_dir()]
    monkeypatch.setenv(sh.SOURCE_ENV, "shiped")
    with pytest.raises(ValueError, match="OBLR_BUILTIN='shiped': must be one of shipped, build"):
        resolve_model_path("builtin")


def _copy_shipped(tmp_path, dirname):
    root = tmp_path / "weights"
    shutil.copytree(sh.WEIGHTS_DIR / dirname, root / dirname)
    shutil.copy(sh.WEIGHTS_DIR / sh.MANIFEST_FILE, root / sh.MANIFEST_FILE)
    return root


def test_a_damaged_or_missing_shipped_file_is_refused_in_one_line(tmp_path):
    dirname = NAMES["builtin:tiny-arith"]
    root = _copy_shipped(tmp_path, dirname)
    assert sh.verified_dir(dirname, root) == root / dirname
    w = root / dirname / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-5] ^= 0x01  # one flipped bit in the last weight
    w.write_bytes(bytes(data))
    sh._verified.clear()
    with pytest.raises(FileNotFoundError) as e:
        sh.verified_dir(dirname, root)
    msg = str(e.value)
    assert "\n" not in msg and "model.safetensors is damaged" in msg and "OBLR_BUILTIN=build" in msg
    data[-5] ^= 0x01
    w.write_bytes(bytes(data))  # intact again: the next file checked is the missing one
    (root / dirname / "tokenizer.json").unlink()
    sh._verified.clear()
    with pytest.raises(FileNotFoundError, match="tokenizer.json is missing"):
        sh.verified_dir(dirname, root)
    with pytest.raises(FileNotFoundError, match="tiny-nope is not shipped"):
        sh.verified_dir("tiny-nope", root)


def test_compare_build_tells_identical_bytes_from_a_rebuild_that_differs(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    dirname = NAMES["builtin:tiny-countdown"]
    copy = tmp_path / "build"
    shutil.copytree(sh.WEIGHTS_DIR / dirname, copy)
    same = sh.compare_build(copy, dirname)
    assert same["identical_weights"] and not same["different_files"] and same["max_abs_weight_diff"] == 0.0
    tensors = load_file(str(copy / "model.safetensors"))
    key = sorted(tensors)[0]
    tensors[key] = tensors[key].clone()
    tensors[key].view(-1)[0] += 0.25
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    other = sh.compare_build(copy, dirname)
    assert not other["identical_weights"] and other["different_files"] == ["model.safetensors"]
    assert other["max_abs_weight_diff"] == pytest.approx(0.25, abs=1e-6)
    del torch


@pytest.mark.parametrize("name", list(NAMES))
def test_the_shipped_models_start_accuracy_is_reproduced_exactly(name, monkeypatch):
    """The accuracy recorded when the shipped bytes were built, measured again here from those bytes with the
    build's own protocol (its held-out problems, seed, sample count): the same number, not one within noise."""
    import torch

    from oblr.models import load_model_and_tokenizer
    from oblr.models.builtin import BUILTIN_TASK, N_MEASURE, N_TRAIN, measure_accuracy
    from oblr.models.task_builtins import spec_of
    from oblr.tasks import get_task
    from oblr.tasks.arithmetic import arithmetic_task

    monkeypatch.delenv(sh.SOURCE_ENV, raising=False)
    ent = sh.entry(NAMES[name])
    threads = torch.get_num_threads()
    torch.set_num_threads(ent["torch_threads"])
    try:
        model, tok = load_model_and_tokenizer(name)
        spec = spec_of(name)
        if spec is None:
            task, kw = arithmetic_task(seed=0, n_train=N_TRAIN, n_eval=N_MEASURE, **BUILTIN_TASK), {}
        else:
            task = get_task(spec.task, seed=0, n_train=spec.n_train, n_eval=spec.n_measure, **spec.task_options)
            kw = {"max_new_tokens": spec.max_new_tokens}
        sampled = measure_accuracy(model, tok, task, task.eval, greedy=False, seed=0, **kw)
        greedy = measure_accuracy(model, tok, task, task.eval, greedy=True, **kw)
    finally:
        torch.set_num_threads(threads)
    assert (sampled, greedy) == (ent["accuracy_sampled_t1"], ent["accuracy_greedy"])


def test_models_list_prints_each_builtins_hash_and_start_accuracy():
    out = subprocess.run([sys.executable, "-m", "oblr", "models", "list"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    for name, dirname in NAMES.items():
        ent = sh.entry(dirname)
        line = next(x for x in out.stdout.splitlines() if x.startswith(f"{name}:"))
        assert ent["weights_sha256"] in line
        assert f"sampled (T=1) {ent['accuracy_sampled_t1']:.1%}, greedy {ent['accuracy_greedy']:.1%}" in out.stdout


def test_models_build_rebuilds_and_says_whether_the_shipped_bytes_are_reproduced(tmp_path, monkeypatch, capsys):
    """``oblr models build NAME --out DIR``: a build by the (here shortened) recipe, then the comparison with the
    shipped bytes; a 3-step build differs, and the line says so with the largest weight difference. An unknown
    name is one line with the known ones."""
    import oblr.models.builtin as bm
    from oblr.cli import main

    monkeypatch.setitem(bm.SFT_DEFAULTS, "sft_steps", 3)
    monkeypatch.setitem(bm.SFT_DEFAULTS, "batch_size", 8)
    monkeypatch.setattr(bm, "N_TRAIN", 200)
    monkeypatch.setattr(bm, "N_MEASURE", 8)
    threads = __import__("torch").get_num_threads()
    try:
        assert main(["models", "build", "builtin", "--out", str(tmp_path / "b")]) == 0
    finally:
        __import__("torch").set_num_threads(threads)
    out = capsys.readouterr().out
    assert out.startswith(f"builtin:tiny-arith: built into {tmp_path / 'b'}; weights sha256 ")
    assert "differs from the shipped bytes (largest weight difference" in out and "model.safetensors" in out
    cmp = sh.compare_build(tmp_path / "b", NAMES["builtin:tiny-arith"])
    assert not cmp["identical_weights"] and cmp["build_sha256"] in out
    assert main(["models", "build", "builtin:nope"]) == 2
    assert "unknown built-in model 'builtin:nope'; built-in models: builtin:tiny-arith" in capsys.readouterr().out
