"""The task-specific built-in models (countdown, word_problems): a test-sized build loads through the
ordinary path, ``builtin`` resolves to the task's model in the trainer, and a cached build is reused."""

import json

import pytest

from oblr.models import load_model_and_tokenizer, resolve_model_path
from oblr.models.builtin import METADATA_FILE
from oblr.models.task_builtins import TASK_MODELS, build_task_model, builtin_for_task, is_current


@pytest.fixture(autouse=True)
def _builds_of_this_machine(monkeypatch):
    """These tests are about building the built-in models on this machine (``OBLR_BUILTIN=build``); the
    shipped bytes that ``builtin`` loads by default are tested in tests/models/test_shipped.py."""
    monkeypatch.setenv("OBLR_BUILTIN", "build")


@pytest.mark.parametrize("task", ["countdown", "word_problems"])
def test_tiny_build_loads_and_generates(task, tmp_path):
    path = build_task_model(task, tmp_path / task, sft_steps=3, n_measure=2, progress=None)
    meta = json.loads((path / METADATA_FILE).read_text())
    assert meta["name"] == TASK_MODELS[task].name and meta["recipe"] is None  # test-sized: never the default
    assert not is_current(path, TASK_MODELS[task])
    model, tok = load_model_and_tokenizer(path)
    spec = TASK_MODELS[task]
    assert model.config.vocab_size == spec.vocab_size and model.config.max_position_embeddings == spec.max_positions
    from oblr.tasks import get_task

    ex = get_task(task, n_train=1, n_eval=1).eval[0]
    text = ex.prompt + ex.meta["solution"]
    ids = tok(text)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text  # the task's text is in the vocabulary
    assert len(ids) + spec.max_new_tokens <= spec.max_positions


def test_builtin_means_the_tasks_model():
    assert builtin_for_task("builtin", "countdown") == "builtin:tiny-countdown"
    assert builtin_for_task("builtin", "word_problems") == "builtin:tiny-words"
    assert builtin_for_task("builtin", "arithmetic") == "builtin"  # the default run is unchanged
    assert builtin_for_task("some/model", "countdown") == "some/model"


def _small_countdown_spec(tmp_path, monkeypatch):
    import oblr.models.task_builtins as tb

    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path))
    small = tb.TaskModelSpec(task="countdown", name="builtin:tiny-countdown", dirname="tiny-countdown-v1",
                             sft_steps=2, n_measure=2, n_train=50)
    monkeypatch.setitem(tb.TASK_MODELS, "countdown", small)
    monkeypatch.setitem(tb.MODEL_NAMES, "builtin:tiny-countdown", small)
    return small


def test_resolve_uses_the_cache_and_builds_a_current_recipe(tmp_path, monkeypatch):
    small = _small_countdown_spec(tmp_path, monkeypatch)
    with pytest.raises(FileNotFoundError, match="builtin:tiny-countdown not found"):
        resolve_model_path("builtin:tiny-countdown", build=False)
    path = resolve_model_path("builtin:tiny-countdown", progress=lambda msg: None)
    assert path == tmp_path / "models" / "tiny-countdown-v1" and is_current(path, small)
    stamp = (path / METADATA_FILE).stat().st_mtime_ns
    assert resolve_model_path("builtin:tiny-countdown") == path  # cached: not rebuilt
    assert (path / METADATA_FILE).stat().st_mtime_ns == stamp
    (path / METADATA_FILE).write_text(json.dumps({"recipe": {"version": 0}}))  # another recipe: rebuilt
    resolve_model_path("builtin:tiny-countdown", progress=lambda msg: None)
    assert is_current(path, small)

    other = type(small)(**{**small.__dict__, "noise": small.noise + 0.1})  # another recipe: not current
    assert not is_current(path, other)


def test_concurrent_first_uses_build_once(tmp_path, monkeypatch):
    """Two first uses at once: the build lock (the arithmetic model's) lets one build; the other waits and
    loads that build."""
    import threading

    import oblr.models.task_builtins as tb

    _small_countdown_spec(tmp_path, monkeypatch)
    calls = []
    real = tb.build_task_model

    def counting(*a, **k):
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(tb, "build_task_model", counting)
    out, errors = [], []

    def use():
        try:
            out.append(resolve_model_path("builtin:tiny-countdown", progress=lambda msg: None))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=use) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(calls) == 1 and len(set(out)) == 1 and len(out) == 3
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".tmp-")]  # nothing left over


def test_evaluate_a_countdown_model(tmp_path):
    """``oblr eval --benchmarks countdown`` goes through the registered-task path: rewards, extracted
    expressions for maj@n."""
    from oblr.cli import main

    path = build_task_model("countdown", tmp_path / "m", sft_steps=3, n_measure=2, progress=None)
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(path), "--benchmarks", "countdown", "--limit", "4", "--n", "2",
                 "--temperature", "1", "--max-new-tokens", "8", "--output-dir", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())["results"]["countdown"]
    assert res["problems"] == 4 and res["n"] == 2 and "maj@2" in res and 0.0 <= res["reward_mean"] <= 1.0


def test_trainer_loads_the_tasks_model():
    """The trainer's model name: plain ``builtin`` with countdown is the countdown model; the default run
    (arithmetic) keeps ``builtin``."""
    from types import SimpleNamespace

    from oblr.config import load_config
    from oblr.train.trainer import Trainer

    for task, want in [("countdown", "builtin:tiny-countdown"), ("word_problems", "builtin:tiny-words"),
                       ("arithmetic", "builtin")]:
        cfg = load_config(None, [f"task.name={task}"])
        assert Trainer._model_name(SimpleNamespace(cfg=cfg)) == want
    assert load_config(None, []).task.name == "arithmetic"
