"""Built-in tokenizer and model: build (atomic, deterministic), resolve, load through from_pretrained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import oblr.models.builtin as bm
from oblr.models import builtin_model_dir, load_model_and_tokenizer, resolve_model_path
from oblr.models.tokenizer import EOS, PAD, UNK, build_tokenizer


@pytest.fixture(autouse=True)
def _builds_of_this_machine(monkeypatch):
    """These tests are about building the built-in models on this machine (``OBLR_BUILTIN=build``); the
    shipped bytes that ``builtin`` loads by default are tested in tests/models/test_shipped.py."""
    monkeypatch.setenv("OBLR_BUILTIN", "build")

TINY = {"sft_steps": 3, "batch_size": 8, "n_train": 200, "n_measure": 8, "progress": None}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return bm.build_builtin_model(tmp_path_factory.mktemp("cache") / "m", seed=0, **TINY)


def test_tokenizer_roundtrip_and_specials(tmp_path):
    tok = build_tokenizer()
    s = "Q: (17+5)*3-8\nA: 17+5=22 22*3=66 66-8=58 #### 58"
    ids = tok(s, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == s
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[:3] == ["Q:", " ", "("] and "####" in pieces and "A:" in pieces
    assert all(len(p) == 1 for p in pieces if p not in ("Q:", "A:", "####"))
    assert (tok.pad_token, tok.eos_token, tok.unk_token) == (PAD, EOS, UNK)
    assert tok("x", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]
    assert tok(s)["input_ids"] == ids  # no BOS/EOS added on encoding
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == s
    tok.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(s, add_special_tokens=False)["input_ids"] == ids
    assert again.padding_side == "left" and again.pad_token_id == tok.pad_token_id


def test_build_writes_a_complete_checkpoint(built):
    names = {p.name for p in built.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", bm.METADATA_FILE} <= names
    meta = json.loads((built / bm.METADATA_FILE).read_text())
    assert meta["seed"] == 0 and meta["sft_steps"] == 3 and isinstance(meta["final_sft_loss"], float)
    assert 0.0 <= meta["accuracy_sampled_t1"] <= 1.0 and 0.0 <= meta["accuracy_greedy"] <= 1.0
    assert {"torch", "transformers", "tokenizers"} <= set(meta["versions"])
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".tmp-")]  # temp dir cleaned


def test_load_built_model_through_from_pretrained(built):
    model, tok = load_model_and_tokenizer(built)
    assert type(model).__name__ == "Qwen3ForCausalLM" and not model.training
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    # the weights are the saved ones: the same logits as a second, independent load
    model2, _ = load_model_and_tokenizer(str(built), dtype="float32")
    x = torch.tensor([tok("Q: 1+2\nA:", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x).logits, model2(input_ids=x).logits)
    assert model(input_ids=x).logits.shape[-1] >= len(tok)


def test_build_is_deterministic(built, tmp_path):
    again = bm.build_builtin_model(tmp_path / "m", seed=0, **TINY)
    from safetensors.torch import load_file

    a, b = load_file(built / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = bm.build_builtin_model(tmp_path / "o", seed=1, **TINY)
    c = load_file(other / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_build_leaves_the_callers_random_state_alone(tmp_path):
    # a training run seeds, then builds the model on first use: its rollouts must not depend on the cache
    import random

    torch.manual_seed(123)
    random.seed(123)
    before_t, before_r = torch.get_rng_state(), random.getstate()
    bm.build_builtin_model(tmp_path / "m", seed=0, **TINY)
    assert torch.equal(torch.get_rng_state(), before_t)
    assert random.getstate() == before_r


def test_builtin_name_resolves_to_cache_and_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    target = tmp_path / "models" / "tiny-arith-v1"
    assert builtin_model_dir() == target
    with pytest.raises(FileNotFoundError, match="built-in model not found"):
        resolve_model_path("builtin", build=False)
    # an interrupted build (no metadata) is not taken for a model
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    monkeypatch.setitem(bm.SFT_DEFAULTS, "sft_steps", 3)
    monkeypatch.setitem(bm.SFT_DEFAULTS, "batch_size", 8)
    monkeypatch.setattr(bm, "N_TRAIN", 200)
    monkeypatch.setattr(bm, "N_MEASURE", 8)
    calls = []
    real = bm.build_builtin_model

    def counting_build(out, **kw):
        calls.append(out)
        return real(out, progress=None, **kw)

    monkeypatch.setattr(bm, "build_builtin_model", counting_build)
    _model, _tok = load_model_and_tokenizer("builtin:tiny-arith")
    assert calls == [target] and bm.is_current_build(target)
    assert resolve_model_path("BUILTIN") == target
    load_model_and_tokenizer("builtin")
    assert len(calls) == 1  # built on first use only
    # a cached build from another recipe is rebuilt
    monkeypatch.setitem(bm.SFT_DEFAULTS, "sft_steps", 2)
    assert not bm.is_current_build(target)
    resolve_model_path("builtin")
    assert len(calls) == 2 and json.loads((target / bm.METADATA_FILE).read_text())["sft_steps"] == 2


def test_concurrent_first_uses_build_the_model_once(tmp_path, monkeypatch):
    """Two processes (here: threads with their own file descriptions) resolving 'builtin' at once: the
    second waits for the first's build lock, then finds a current build and does not build again."""
    import threading
    import time

    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(bm.SFT_DEFAULTS, "sft_steps", 3)
    monkeypatch.setitem(bm.SFT_DEFAULTS, "batch_size", 8)
    monkeypatch.setattr(bm, "N_TRAIN", 200)
    monkeypatch.setattr(bm, "N_MEASURE", 8)
    calls, real = [], bm.build_builtin_model
    started = threading.Event()

    def slow_build(out, **kw):
        calls.append(out)
        started.set()
        time.sleep(0.5)  # hold the lock while the other thread arrives
        return real(out, progress=None, **kw)

    monkeypatch.setattr(bm, "build_builtin_model", slow_build)
    first = threading.Thread(target=resolve_model_path, args=("builtin",))
    first.start()
    started.wait(30)
    assert resolve_model_path("builtin") == builtin_model_dir()  # blocks until the first build is published
    first.join(60)
    assert len(calls) == 1 and bm.is_current_build(builtin_model_dir())


def test_publish_keeps_an_existing_complete_build(built, tmp_path):
    import shutil

    out = tmp_path / "m"
    shutil.copytree(built, out)
    (out / "marker").write_text("first")
    tmp = tmp_path / ".tmp-m-x"
    shutil.copytree(built, tmp)
    bm._publish(tmp, out, overwrite=False)  # a second builder finishing later
    assert (out / "marker").is_file()
    assert bm.build_builtin_model(out, **TINY) == out  # complete: returns without rebuilding
    assert (out / "marker").is_file()


def test_missing_paths_raise_clear_errors(tmp_path, monkeypatch):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        load_model_and_tokenizer(str(missing))
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
        resolve_model_path("someone/not-a-cached-model")
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer("builtin", dtype="int8")


def test_pad_token_defaults_to_eos(tmp_path):
    from conftest import tiny_qwen3
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"</s>": 0, "<unk>": 1, "a": 2, "b": 3}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="</s>", unk_token="<unk>").save_pretrained(tmp_path)
    tiny_qwen3(vocab_size=4).save_pretrained(tmp_path)
    model, tok = load_model_and_tokenizer(tmp_path)
    assert tok.pad_token == "</s>" and tok.pad_token_id == tok.eos_token_id == 0
    assert tok.padding_side == "left"
    assert model.config.pad_token_id == 0


def test_bad_build_arguments(tmp_path):
    with pytest.raises(ValueError, match="digit_noise"):
        bm.build_builtin_model(tmp_path / "x", digit_noise=1.5, **TINY)
    with pytest.raises(ValueError, match="sft_steps"):
        bm.build_builtin_model(tmp_path / "x", **{**TINY, "sft_steps": -1})
    assert not (tmp_path / "x").exists()


def test_activation_checkpointing_is_enabled_non_reentrant_or_refused_in_one_line():
    from conftest import tiny_qwen3
    from gradnorm_helpers import ToyLM

    from oblr.config import ConfigError
    from oblr.gradnorm.engine import checkpointing_modules
    from oblr.models import enable_activation_checkpointing

    model = tiny_qwen3()
    enable_activation_checkpointing(model)
    assert "model.layers.0" in checkpointing_modules(model)
    assert model.model.layers[0]._gradient_checkpointing_func.keywords == {"use_reentrant": False}
    with pytest.raises(ConfigError, match=r"^config key 'model.activation_checkpointing': ToyLM does not support"):
        enable_activation_checkpointing(ToyLM())


def test_activation_checkpointing_switches_on_and_off_any_number_of_times():
    """Enabling again does not stack input-grads hooks on the embedding; disabling removes the one there is,
    under the method names of whichever transformers is installed (the older ``gradient_checkpointing_*``
    too: transformers 5.17, a GPU image's, has only those)."""
    from conftest import tiny_qwen3

    from oblr.gradnorm.engine import checkpointing_modules
    from oblr.models import disable_activation_checkpointing, enable_activation_checkpointing

    model = tiny_qwen3()
    emb = model.get_input_embeddings()
    n0 = len(emb._forward_hooks)
    for _ in range(3):
        enable_activation_checkpointing(model)
    assert checkpointing_modules(model) and len(emb._forward_hooks) <= n0 + 1
    disable_activation_checkpointing(model)
    assert not checkpointing_modules(model) and len(emb._forward_hooks) == n0

    class OlderNames:  # only the former method names, as older transformers have them
        supports_gradient_checkpointing = True
        calls = []

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.calls.append(("enable", gradient_checkpointing_kwargs))

        def gradient_checkpointing_disable(self):
            self.calls.append(("disable", None))

    old = OlderNames()
    enable_activation_checkpointing(old)
    disable_activation_checkpointing(old)
    assert old.calls == [("enable", {"use_reentrant": False}), ("disable", None)]


def test_ensure_builtin_built_checks_the_cache_and_waits_for_local_rank_0(tmp_path, monkeypatch):
    """Before a run: nothing for a model that is not built-in; one line for a cache that cannot be written;
    under torchrun a rank other than local rank 0 waits for the build and, past its time limit, says which
    rank waited for what, where."""
    from oblr.config import ConfigError
    from oblr.models import BUILTIN_DIRNAME, ensure_builtin_built

    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.setenv("OBLR_CACHE_DIR", str(f))
    ensure_builtin_built(str(tmp_path / "some-hf-folder"), distributed=False, local_rank=0, rank=0, timeout_s=1)
    for name in ("builtin", "builtin:tiny-countdown"):
        with pytest.raises(ConfigError, match="cache folder .* is a file, not a folder; set OBLR_CACHE_DIR"):
            ensure_builtin_built(name, distributed=False, local_rank=0, rank=0, timeout_s=1)
    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path / "cache"))
    ensure_builtin_built("builtin", distributed=False, local_rank=0, rank=0, timeout_s=1)  # built when it loads
    assert not (tmp_path / "cache" / "models" / BUILTIN_DIRNAME).exists()
    for name, what in (("builtin", "the built-in model"), ("builtin:tiny-countdown", "builtin:tiny-countdown")):
        with pytest.raises(TimeoutError, match=f"rank 3 waited 0 s .* to build {what} into {tmp_path}/cache/models/"):
            ensure_builtin_built(name, distributed=True, local_rank=1, rank=3, timeout_s=0)



def test_a_wait_on_a_build_lock_says_who_holds_it_and_since_when(tmp_path, monkeypatch):
    """A second process reaching a built-in model's build lock while another builds: one line naming the holder's
    pid and since when, repeated every LOCK_REPORT_EVERY_S while it waits; the holder's note is not erased by the
    waiter opening the lock file, and the waiter writes its own once it holds the lock."""
    import fcntl
    import os
    import threading
    import time

    import oblr.models as om

    target = tmp_path / "models" / "tiny-arith-v1"
    lock_file = target.parent / f".{target.name}.lock"
    target.parent.mkdir(parents=True)
    holder = open(lock_file, "a+")  # another open file description: flock blocks the waiter as another process
    fcntl.flock(holder, fcntl.LOCK_EX)
    since = time.time() - 42
    holder.write(f"4242 {since:.3f}\n")
    holder.flush()
    import oblr.models.cache as oc

    monkeypatch.setattr(oc, "LOCK_REPORT_EVERY_S", 0.3)
    lines, got = [], threading.Event()

    def waiter():
        with om._build_lock(target, say=lines.append):
            got.set()
            assert lock_file.read_text().split()[0] == str(os.getpid())

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(1.0)
    assert not got.is_set()
    fcntl.flock(holder, fcntl.LOCK_UN)
    holder.close()
    t.join(10)
    assert got.is_set() and len(lines) >= 2  # the first line at once, then again while it waits
    when = time.strftime("%H:%M:%S", time.localtime(since))
    assert lines[0].startswith(f"waiting for tiny-arith-v1: process 4242 (since {when}, ")
    assert f"holds its lock {lock_file}" in lines[0] and "waited" in lines[-1]
    assert om.lock_holder(tmp_path / "nothing") == "another process"
