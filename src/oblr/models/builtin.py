"""Build the built-in tiny model: a Qwen3-architecture LM warm-started by a short SFT on arithmetic.

The result is an ordinary Hugging Face checkpoint (``config.json``, ``model.safetensors``, tokenizer files)
plus ``oblr_builtin.json`` (seed, steps, measured accuracy, versions). The SFT is deliberately short:
the model writes the solution format and is often right, but sampling at temperature 1 is noisy, which
leaves RL room to sharpen it (numbers in docs/builtin.md).

The build is atomic: everything is written into a temporary directory beside the target, the metadata
last, then renamed into place. A crash leaves only a ``.tmp-*`` directory that is never loaded; when two
processes build at once, the first rename wins and the other discards its copy.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from oblr.disk_errors import writes_as_os_errors

METADATA_FILE = "oblr_builtin.json"
N_TRAIN = 20000  # arithmetic train problems the SFT draws from
N_MEASURE = 200  # held-out problems the accuracy in the metadata is measured on
BUILTIN_VERSION = 1

#: task the built-in model is trained for (also the default task of ``oblr train``)
BUILTIN_TASK = {"difficulty": "easy"}

#: architecture of the built-in model (Qwen3, tied embeddings)
MODEL_SHAPE = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
               "intermediate_size": 512, "max_position_embeddings": 128}

#: SFT defaults
SFT_DEFAULTS = {"sft_steps": 700, "batch_size": 64, "lr": 3e-3, "warmup": 30, "weight_decay": 0.01,
                "digit_noise": 0.15}


def builtin_recipe(seed: int = 0) -> dict:
    """Everything that determines the default build; a cached build with another recipe is rebuilt."""
    return {"version": BUILTIN_VERSION, "seed": seed, "task": dict(BUILTIN_TASK), "shape": dict(MODEL_SHAPE),
            "sft": dict(SFT_DEFAULTS)}


def safetensors_intact(path: str | os.PathLike) -> bool:
    """True when the safetensors file at ``path`` is as long as its header says (a truncated or damaged
    file is not): 8-byte header length, JSON header, then the tensors' data up to the largest offset."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        return os.path.getsize(path) == 8 + n + end
    except (OSError, ValueError, KeyError, TypeError, IndexError, MemoryError, OverflowError):
        return False


def is_current_build(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a complete build (metadata written) of the current default recipe whose
    weights file is intact (a truncated cache is rebuilt)."""
    return is_complete_build(path, builtin_recipe)


def is_complete_build(path: str | os.PathLike, recipe) -> bool:
    """True when ``path`` holds a complete build (metadata written last, a config, intact safetensors weights)
    whose recorded recipe is ``recipe(seed)``, the current one for its seed: the cache check of every
    built-in model (:func:`is_current_build`, :func:`oblr.models.task_builtins.is_current`)."""
    meta_path = Path(path) / METADATA_FILE
    if not meta_path.is_file() or not (Path(path) / "config.json").is_file():
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        return False
    weights = sorted(Path(path).glob("*.safetensors"))
    return (meta.get("recipe") == recipe(meta.get("seed", 0)) and bool(weights)
            and all(safetensors_intact(w) for w in weights))


def builtin_config():
    """The ``Qwen3Config`` of the built-in model (vocabulary of :mod:`oblr.models.tokenizer`)."""
    from transformers import Qwen3Config

    from oblr.models.tokenizer import EOS, MODEL_VOCAB_SIZE, PAD, vocabulary

    voc = vocabulary()
    shape = dict(MODEL_SHAPE)
    return Qwen3Config(
        vocab_size=MODEL_VOCAB_SIZE, head_dim=shape["hidden_size"] // shape["num_attention_heads"],
        tie_word_embeddings=True, pad_token_id=voc[PAD], eos_token_id=voc[EOS], bos_token_id=None,
        rope_theta=10000.0, **shape,
    )


def _stderr_progress(msg: str) -> None:
    print(f"[oblr] {msg}", file=sys.stderr, flush=True)


def sft_batch(tokenizer, prompts: list[str], solutions: list[str]):
    """Right-padded ``input_ids``, ``attention_mask``, ``labels`` [b, T] for ``prompt + solution + eos``;
    labels are -100 off the solution (and its eos)."""
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    s_ids = tokenizer(solutions, add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs = [p + s + [eos] for p, s in zip(p_ids, s_ids)]
    width = max(len(q) for q in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, (seq, p) in enumerate(zip(seqs, p_ids)):
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, len(p):len(seq)] = ids[r, len(p):len(seq)]
        mask[r, :len(seq)] = 1
    return ids, mask, labels


def sft_train(model, tokenizer, examples, *, steps: int, batch_size: int, lr: float, warmup: int,
              weight_decay: float, digit_noise: float, seed: int,
              progress: Callable[[str], None] | None = None, demo=None) -> list[float]:
    """Supervised warm start: AdamW, linear warm-up then cosine decay to lr/10, loss on solution tokens.

    Batches are drawn with replacement by generators seeded with ``seed``; each demonstration is made
    fresh with :func:`oblr.tasks.arithmetic.noisy_solution` (each result digit wrong with probability
    ``digit_noise``), or by ``demo(example, rng)`` when given (another task's demonstrations). Returns the
    loss per step.
    """
    import random

    from oblr.tasks.arithmetic import noisy_solution

    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    losses = []
    t0 = time.time()
    for step in range(steps):
        batch = [examples[i] for i in torch.randint(len(examples), (batch_size,), generator=gen).tolist()]
        if demo is not None:
            sols = [demo(ex, rng) for ex in batch]
        else:
            sols = [noisy_solution(ex, rng, digit_noise) if digit_noise > 0 else ex.meta["solution"] for ex in batch]
        ids, mask, labels = sft_batch(tokenizer, [ex.prompt for ex in batch], sols)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())  # a build step, not an RL hot path
        if progress is not None and ((step + 1) % 50 == 0 or step + 1 == steps):
            progress(f"building built-in model: SFT step {step + 1}/{steps}, loss {losses[-1]:.3f}, "
                     f"{time.time() - t0:.0f}s")
    model.eval()
    return losses


def measure_accuracy(model, tokenizer, task, examples, *, greedy: bool, num_samples: int = 1,
                     max_new_tokens: int = 48, seed: int = 0, batch_size: int = 256) -> float:
    """Mean reward over ``examples`` x ``num_samples`` sampled answers (temperature 1, top-p 1, private
    generator seeded with ``seed``), or over one greedy answer per example: the held-out evaluation
    :func:`oblr.rollout.heldout.heldout_eval` on the ``hf`` engine."""
    from oblr.rollout import make_engine
    from oblr.rollout.heldout import heldout_eval
    from oblr.tasks import reward_scorer

    engine = make_engine("hf", model, tokenizer, batch_size=batch_size)
    h = heldout_eval(engine, examples, reward_scorer(task), samples=0 if greedy else num_samples,
                     max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, seed=seed, greedy=greedy)
    return h.accuracy_greedy() if greedy else h.accuracy_sampled()


def build_builtin_model(out_dir: str | os.PathLike, *, seed: int = 0, sft_steps: int | None = None,
                        batch_size: int | None = None, lr: float | None = None, digit_noise: float | None = None,
                        n_train: int | None = None,
                        n_measure: int | None = None, progress: Callable[[str], None] | None = _stderr_progress,
                        overwrite: bool = False) -> Path:
    """Build, warm-start, measure and save the built-in model into ``out_dir`` atomically; return it.

    Deterministic given ``seed`` (on one machine and thread count). ``sft_steps=0`` saves the random init.
    When ``out_dir`` already holds a complete build (and not ``overwrite``), nothing is done. The caller's
    random state (torch CPU generator and Python's ``random``) is left as it was, so a training run that
    builds the model on first use draws the same rollouts as one that loads it from the cache.
    """
    state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        try:
            return _build(out_dir, seed=seed, sft_steps=sft_steps, batch_size=batch_size, lr=lr,
                          digit_noise=digit_noise, n_train=n_train, n_measure=n_measure, progress=progress,
                          overwrite=overwrite)
        finally:
            random.setstate(state)


def _build(out_dir, *, seed, sft_steps, batch_size, lr, digit_noise, n_train, n_measure, progress,
           overwrite) -> Path:
    from transformers import Qwen3ForCausalLM

    from oblr.models.tokenizer import build_tokenizer
    from oblr.tasks.arithmetic import arithmetic_task

    out = Path(out_dir).expanduser()
    if (out / METADATA_FILE).is_file() and not overwrite:
        return out
    steps = SFT_DEFAULTS["sft_steps"] if sft_steps is None else int(sft_steps)
    bs = SFT_DEFAULTS["batch_size"] if batch_size is None else int(batch_size)
    peak = SFT_DEFAULTS["lr"] if lr is None else float(lr)
    noise = SFT_DEFAULTS["digit_noise"] if digit_noise is None else float(digit_noise)
    n_train = N_TRAIN if n_train is None else int(n_train)
    n_measure = N_MEASURE if n_measure is None else int(n_measure)
    if not 0 <= noise < 1:
        raise ValueError(f"build_builtin_model: digit_noise must be in [0, 1), got {noise}")
    if steps < 0 or bs < 1 or not peak > 0:
        raise ValueError(f"build_builtin_model: need sft_steps >= 0, batch_size >= 1, lr > 0; got "
                         f"{steps}, {bs}, {peak}")
    say = progress or (lambda msg: None)
    t0 = time.time()
    why = ("replacing an incomplete or outdated build" if out.exists() else "first use")
    say(f"building the built-in model into {out} ({why}; about 2 minutes on 2 idle CPU cores)")
    task = arithmetic_task(seed=seed, n_train=n_train, n_eval=n_measure, **BUILTIN_TASK)
    tokenizer = build_tokenizer()
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(builtin_config()).float()
    losses = sft_train(model, tokenizer, task.train, steps=steps, batch_size=bs, lr=peak,
                       warmup=min(SFT_DEFAULTS["warmup"], max(1, steps // 10)),
                       weight_decay=SFT_DEFAULTS["weight_decay"], digit_noise=noise, seed=seed,
                       progress=say) if steps else []
    t_sft = time.time() - t0
    say("measuring the accuracy of the built-in model")
    acc_sampled = measure_accuracy(model, tokenizer, task, task.eval, greedy=False, seed=seed)
    acc_greedy = measure_accuracy(model, tokenizer, task, task.eval, greedy=True)
    meta = {
        "name": "builtin:tiny-arith", "version": BUILTIN_VERSION, "seed": seed,
        "recipe": builtin_recipe(seed) if (steps, bs, peak, noise, n_train) == (
            SFT_DEFAULTS["sft_steps"], SFT_DEFAULTS["batch_size"], SFT_DEFAULTS["lr"],
            SFT_DEFAULTS["digit_noise"], N_TRAIN) else None, "sft_steps": steps,
        "batch_size": bs, "lr": peak, "digit_noise": noise, "task": {"name": "arithmetic", "seed": seed, **BUILTIN_TASK},
        **build_record(model, losses, n_measure, acc_sampled, acc_greedy, t_sft),
    }
    save_build(model, tokenizer, meta, out, overwrite=overwrite, t0=t0)
    say(f"built-in model ready in {meta['build_seconds']:.0f}s: sampled accuracy {acc_sampled:.1%}, "
        f"greedy {acc_greedy:.1%} on {n_measure} held-out problems")
    return out


def build_record(model, losses: list[float], n_measure: int, acc_sampled: float, acc_greedy: float,
                 t_sft: float) -> dict:
    """The part of a built-in model's metadata every build records: its SFT losses, measured accuracy, size,
    timing (``build_seconds`` is set by :func:`save_build`) and library versions."""
    import tokenizers
    import torch
    import transformers

    return {
        "final_sft_loss": losses[-1] if losses else None,
        "sft_loss_every_50": [round(x, 4) for x in losses[49::50]], "n_measure": n_measure,
        "accuracy_sampled_t1": acc_sampled, "accuracy_greedy": acc_greedy,
        "parameters": sum(p.numel() for p in model.parameters()), "build_seconds": None,
        "sft_seconds": round(t_sft, 1), "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
    }


def save_build(model, tokenizer, meta: dict, out: Path, *, overwrite: bool, t0: float) -> None:
    """Write a built model, its tokenizer and ``meta`` (last: its presence marks a complete build) into a
    temporary folder beside ``out`` and rename it to ``out`` (:func:`_publish`); ``t0``: when the build began."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        with writes_as_os_errors():  # a full disk is an OSError (one line from the CLI), whichever library writes
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
        meta["build_seconds"] = round(time.time() - t0, 1)
        with open(tmp / METADATA_FILE, "w") as f:  # written last: its presence marks a complete build
            json.dump(meta, f, indent=2)
        _publish(tmp, out, overwrite=overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, out: Path, *, overwrite: bool) -> None:
    """Rename ``tmp`` to ``out``. An existing complete build is kept unless ``overwrite``."""
    if out.exists():
        if ((out / METADATA_FILE).is_file() and not overwrite) or (is_current_build(out) and is_current_build(tmp)):
            return  # another builder finished first; keep theirs
        old = out.parent / f".old-{out.name}-{os.getpid()}-{time.time_ns()}"
        os.rename(out, old)  # an incomplete or replaced build is moved aside, then removed
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.rename(tmp, out)
    except OSError:
        if not (out / METADATA_FILE).is_file():  # lost a race to a builder that then failed: re-raise
            raise
