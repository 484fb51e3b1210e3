"""Atomic checkpoints that resume the same trajectory.

Layout of a run folder::

    run/checkpoints/step_000020/   model (save_pretrained: config + safetensors), tokenizer,
                                   trainer_state.pt (optimizer, lr controller, RNG states, step, data position)
    run/checkpoints/LATEST         the name of the newest complete checkpoint

A checkpoint is written into a temporary folder beside its final place and renamed when complete; LATEST
is replaced atomically afterwards. A crash or a kill at any point leaves the previous checkpoint intact
and LATEST pointing at a complete one. A checkpoint folder is itself a Hugging Face checkpoint, so
``oblr eval --model run/checkpoints/step_000020`` works.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict, *, keep: int = 2) -> Path:
    """Write ``run_dir/checkpoints/step_{step:06d}`` atomically; prune to the ``keep`` newest. Returns its path."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:06d}"
    final = ckpt_root / name
    tmp = ckpt_root / f".{name}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        torch.save({**state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
        for f in tmp.iterdir():
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if final.exists():  # re-saving the same step (e.g. interrupt right after a periodic save)
            old = ckpt_root / f".{name}.old{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(ckpt_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(ckpt_root / "LATEST", name + "\n")
    complete = sorted(p for p in ckpt_root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run, or None."""
    ckpt_root = Path(run_dir) / "checkpoints"
    pointer = ckpt_root / "LATEST"
    if pointer.is_file():
        p = ckpt_root / pointer.read_text().strip()
        if (p / STATE_FILE).is_file():
            return p
    complete = sorted(p for p in ckpt_root.glob("step_*") if (p / STATE_FILE).is_file())
    return complete[-1] if complete else None


def load_trainer_state(ckpt: Path) -> dict:
    return torch.load(Path(ckpt) / STATE_FILE, map_location="cpu", weights_only=False)


def load_weights_into(model, ckpt: Path) -> None:
    """Load a checkpoint's safetensors weights into an already-built model (exact, strict on trainable names);
    a LoRA (peft) model gets its adapter weights."""
    from safetensors.torch import load_file

    if getattr(model, "peft_config", None):
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(Path(ckpt) / "adapter_model.safetensors")))
        return
    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in checkpoint {ckpt}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied weights are saved once; anything else missing is an error
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [m for m in missing if m not in tied and not m.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint {ckpt} does not match the model: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
