"""Built-in tiny models for the tasks ``countdown`` and ``word_problems``, warm-started on their own task.

Same architecture family, build procedure and cache rules as the arithmetic model
(:mod:`oblr.models.builtin`): a Qwen3 LM with the character tokenizer (``word_problems`` adds letters and
punctuation to the vocabulary), a short SFT on **noisy demonstrations** (so that sampling at temperature 1
is often wrong and RL has room), accuracy measured on held-out problems, everything written atomically into
``$OBLR_CACHE_DIR/models/<dirname>`` with ``oblr_builtin.json`` (whose ``recipe`` decides whether a cached
build is current). :data:`TASK_MODELS` holds the recipes by task name; ``"builtin"`` given with one of
these tasks (``oblr train task.name=countdown``) means that task's model (:func:`builtin_for_task`).

Demonstrations: ``countdown``: the reference expression, or with probability ``noise`` a random
expression over a random subset (2 or more) of the given numbers, usually of another value.
``word_problems``: the worked solution with each digit of each step result replaced with probability
``noise`` by another digit (the final answer is the last written result).
"""

from __future__ import annotations

import os
import random
import string
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from oblr.models.builtin import (
    METADATA_FILE,
    _stderr_progress,
    build_record,
    is_complete_build,
    measure_accuracy,
    save_build,
    sft_train,
)

#: raise it (or a spec's ``dirname``) when a task's generator or the demonstrations change: the recipe stored
#: with a build holds the spec's fields and this number, so that a cached build of older code is rebuilt
VERSION = 1
WORD_CHARS = "".join(c for c in string.ascii_letters if c not in "QA") + ".,?'$"  # Q, A: already there


@dataclass(frozen=True)
class TaskModelSpec:
    """The recipe of one task's built-in model (all of it is stored in, and compared with, its metadata)."""

    task: str
    name: str  # the model name users can pass (model.name_or_path)
    dirname: str
    task_options: dict = field(default_factory=dict)
    extra_chars: str = ""
    vocab_size: int = 32
    max_positions: int = 128
    hidden_size: int = 128
    layers: int = 2
    sft_steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    warmup: int = 30
    weight_decay: float = 0.01
    noise: float = 0.3
    n_train: int = 10000
    n_measure: int = 200
    max_new_tokens: int = 32

    def recipe(self, seed: int) -> dict:
        return {"version": VERSION, "seed": seed, **asdict(self)}


TASK_MODELS: dict[str, TaskModelSpec] = {
    "countdown": TaskModelSpec(task="countdown", name="builtin:tiny-countdown", dirname="tiny-countdown-v1",
                               sft_steps=600, noise=0.3, max_new_tokens=32),
    "word_problems": TaskModelSpec(task="word_problems", name="builtin:tiny-words", dirname="tiny-words-v2",
                                   extra_chars=WORD_CHARS, vocab_size=96, max_positions=128,
                                   sft_steps=700, batch_size=64, noise=0.15, max_new_tokens=32),
}
MODEL_NAMES = {spec.name: spec for spec in TASK_MODELS.values()}


def builtin_for_task(name: str, task: str) -> str:
    """``name``, except that plain ``"builtin"`` with a task of :data:`TASK_MODELS` is that task's model."""
    if str(name).strip().lower() == "builtin" and task in TASK_MODELS:
        return TASK_MODELS[task].name
    return name


def spec_of(name: str) -> TaskModelSpec | None:
    return MODEL_NAMES.get(str(name).strip().lower())


def is_current(path: str | os.PathLike, spec: TaskModelSpec) -> bool:
    """A complete build of ``spec``'s current recipe with intact weights is at ``path``."""
    return is_complete_build(path, spec.recipe)


def _config(spec: TaskModelSpec):
    from transformers import Qwen3Config

    from oblr.models.tokenizer import EOS, PAD, vocabulary

    voc = vocabulary(spec.extra_chars, spec.vocab_size)
    heads = 4
    return Qwen3Config(vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.layers,
                       num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=4 * spec.hidden_size,
                       max_position_embeddings=spec.max_positions, head_dim=spec.hidden_size // heads,
                       tie_word_embeddings=True, pad_token_id=voc[PAD], eos_token_id=voc[EOS], bos_token_id=None,
                       rope_theta=10000.0)


def countdown_demo(noise: float) -> Callable:
    from oblr.tasks.countdown import _combine

    def demo(example, rng: random.Random) -> str:
        if rng.random() >= noise:
            return example.meta["solution"]
        nums = list(example.meta["numbers"])
        for _ in range(20):
            made = _combine(rng, [(str(x), x, 3) for x in rng.sample(nums, rng.randint(2, len(nums)))])
            if made is not None:
                return " " + made[0]
        return example.meta["solution"]

    return demo


def words_demo(noise: float) -> Callable:
    def corrupt(z: str, rng: random.Random) -> str:
        digits = list(z)
        for i in range(len(digits)):
            if rng.random() < noise:
                digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]
                                        and not (i == 0 and d == "0" and len(digits) > 1)])
        return "".join(digits)

    def demo(example, rng: random.Random) -> str:
        steps = []
        for step in example.meta["steps"]:
            lhs, z = step.rsplit("=", 1)
            steps.append(f"{lhs}={corrupt(z, rng)}")
        return " " + " ".join(steps) + f" #### {steps[-1].rsplit('=', 1)[1]}"

    return demo


DEMOS = {"countdown": countdown_demo, "word_problems": words_demo}


def build_task_model(task: str, out_dir: str | os.PathLike, *, seed: int = 0, sft_steps: int | None = None,
                     n_measure: int | None = None, progress: Callable[[str], None] | None = _stderr_progress,
                     overwrite: bool = False) -> Path:
    """Build, warm-start, measure and save the built-in model of ``task`` into ``out_dir`` atomically.

    ``sft_steps``/``n_measure`` override the recipe (a test-sized build; its metadata then holds no recipe,
    so it is never taken for the current default build). The caller's random state is left as it was."""
    if task not in TASK_MODELS:
        raise ValueError(f"no built-in model for task {task!r}; tasks with one: {', '.join(TASK_MODELS)}")
    import torch

    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        try:
            return _build(TASK_MODELS[task], Path(out_dir).expanduser(), seed, sft_steps, n_measure,
                          progress or (lambda msg: None), overwrite)
        finally:
            random.setstate(state)


def _build(spec: TaskModelSpec, out: Path, seed: int, sft_steps, n_measure, say, overwrite) -> Path:
    import torch
    from transformers import Qwen3ForCausalLM

    from oblr.models.tokenizer import build_tokenizer
    from oblr.tasks import get_task

    if (out / METADATA_FILE).is_file() and not overwrite:
        return out
    steps = spec.sft_steps if sft_steps is None else int(sft_steps)
    n_meas = spec.n_measure if n_measure is None else int(n_measure)
    if steps < 0 or n_meas < 1:
        raise ValueError(f"build_task_model: need sft_steps >= 0 and n_measure >= 1, got {steps}, {n_meas}")
    t0 = time.time()
    say(f"building the built-in {spec.task} model into {out} "
        f"({'replacing an incomplete or outdated build' if out.exists() else 'first use'}; a few minutes)")
    task = get_task(spec.task, seed=seed, n_train=spec.n_train, n_eval=n_meas, **spec.task_options)
    tokenizer = build_tokenizer(spec.extra_chars, spec.vocab_size)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(_config(spec)).float()
    losses = sft_train(model, tokenizer, task.train, steps=steps, batch_size=spec.batch_size, lr=spec.lr,
                       warmup=min(spec.warmup, max(1, steps // 10)), weight_decay=spec.weight_decay,
                       digit_noise=spec.noise, seed=seed, progress=say,
                       demo=DEMOS[spec.task](spec.noise)) if steps else []
    t_sft = time.time() - t0
    say(f"measuring the accuracy of the built-in {spec.task} model")
    kw = {"max_new_tokens": spec.max_new_tokens}
    acc_sampled = measure_accuracy(model, tokenizer, task, task.eval, greedy=False, seed=seed, **kw)
    acc_greedy = measure_accuracy(model, tokenizer, task, task.eval, greedy=True, **kw)
    default = sft_steps is None and n_measure is None
    meta = {
        "name": spec.name, "version": VERSION, "seed": seed, "recipe": spec.recipe(seed) if default else None,
        "sft_steps": steps, "task": {"name": spec.task, "seed": seed, **spec.task_options},
        **build_record(model, losses, n_meas, acc_sampled, acc_greedy, t_sft),
    }
    save_build(model, tokenizer, meta, out, overwrite=overwrite, t0=t0)
    say(f"built-in {spec.task} model ready in {meta['build_seconds']:.0f}s: sampled accuracy {acc_sampled:.1%}, "
        f"greedy {acc_greedy:.1%} on {n_meas} held-out problems")
    return out
