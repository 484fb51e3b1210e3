"""Atomic checkpoints that resume the same trajectory.

Layout of a run folder::

    run/checkpoints/step_000020/   model (save_pretrained: config + safetensors), tokenizer,
                                   trainer_state.pt (optimizer, lr controller, RNG states, step, data position)
    run/checkpoints/step_000020/MANIFEST.json   size and sha256 of every other file (written last)
    run/checkpoints/LATEST         the name of the newest complete checkpoint

A checkpoint is written into a temporary folder beside its final place and renamed when complete; LATEST
is replaced atomically afterwards. A crash or a kill at any point leaves the previous checkpoint intact
and LATEST pointing at a complete one; a crash mid-write leaves a hidden ``.step_*.tmp<pid>`` folder that
:func:`remove_orphans` deletes on the next start. On load, :func:`latest_checkpoint` checks each candidate
against its manifest (sizes; ``deep=True`` also hashes) and falls back to the newest intact one, naming
the damaged ones. After a save, :func:`prune_checkpoints` keeps the new checkpoint and the newest intact
ones before it (never a damaged one in their place, never a folder of a later step, which belongs to an
abandoned trajectory); when a run starts again because every checkpoint is damaged, :func:`set_aside_checkpoints`
moves them into ``checkpoints/damaged-<time>/`` first. The state saved carries the RNG state passed in (the trainer's, from the end of the last
completed step), so a checkpoint written after an interrupt resumes the uninterrupted trajectory. A
checkpoint folder is itself a Hugging Face checkpoint, so ``oblr eval --model run/checkpoints/step_000020``
works.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

from oblr.disk_errors import writes_as_os_errors
from oblr.hashing import sha256_file

STATE_FILE = "trainer_state.pt"
MANIFEST = "MANIFEST.json"


def rng_state() -> dict:
    import numpy as np
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

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


def _files(folder: Path) -> list[Path]:
    """Every file under ``folder`` (subfolders too: a sharded checkpoint's ``sharded/``), sorted."""
    return sorted(f for f in Path(folder).rglob("*") if f.is_file())


def write_manifest(folder: Path) -> None:
    """``folder/MANIFEST.json``: ``{relative path: {"size": bytes, "sha256": hex}}`` of every other file."""
    files = {f.relative_to(folder).as_posix(): {"size": f.stat().st_size, "sha256": sha256_file(f)}
             for f in _files(folder) if f != Path(folder) / MANIFEST}
    with open(folder / MANIFEST, "w") as f:
        json.dump({"files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def checkpoint_problem(ckpt: Path, *, deep: bool = False) -> str | None:
    """Why ``ckpt`` cannot be loaded (a missing, truncated or, with ``deep``, altered file), or None when it
    is intact. A checkpoint written before manifests existed is checked for its state file only."""
    ckpt = Path(ckpt)
    if not (ckpt / STATE_FILE).is_file():
        return f"{STATE_FILE} is missing"
    if not (ckpt / MANIFEST).is_file():
        return None
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{MANIFEST} is unreadable"
    for name, want in files.items():
        f = ckpt / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != want["size"]:
            return f"{name} has {f.stat().st_size} bytes, {want['size']} were written"
        if deep and sha256_file(f) != want["sha256"]:
            return f"{name} has changed since it was written (sha256 differs)"
    return None


def remove_orphans(run_dir: str | Path) -> list[str]:
    """Delete the hidden temporary folders of checkpoint writes that never finished (``.step_*.tmp<pid>``,
    ``.step_*.old<pid>``). Only call it while holding the run folder's lock. Returns the names removed."""
    root = Path(run_dir) / "checkpoints"
    gone = [p for p in root.glob(".step_*") if p.is_dir() and (".tmp" in p.name or ".old" in p.name)]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in gone]


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """Create (empty) the hidden temporary folder a checkpoint of ``step`` is written into; returns it."""
    ckpt_root = Path(run_dir) / "checkpoints"
    ckpt_root.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_root / f".step_{step:06d}.tmp{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit_checkpoint(run_dir: str | Path, step: int, tmp: Path, *, keep: int = 2) -> Path:
    """Make the files written into ``tmp`` (:func:`begin_checkpoint`) the checkpoint of ``step``: fsync them,
    write the manifest last, rename the folder into place, point LATEST at it, prune to the ``keep`` newest.
    On any error the temporary folder is removed and the previous checkpoints are untouched."""
    ckpt_root = Path(run_dir) / "checkpoints"
    name = f"step_{step:06d}"
    final = ckpt_root / name
    try:
        for f in _files(tmp):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        write_manifest(tmp)  # last: its presence and sizes mark every other file as complete
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
    prune_checkpoints(ckpt_root, final, keep)
    return final


def checkpoint_folders(run_dir: str | Path) -> list[Path]:
    """The checkpoint folders ``checkpoints/step_N`` of a run, newest (highest step) first, intact or not."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if p.is_dir() and checkpoint_step(p) >= 0] if root.is_dir() else []
    return sorted(found, key=checkpoint_step, reverse=True)


def prune_checkpoints(ckpt_root: Path, current: Path, keep: int) -> list[str]:
    """After ``current`` was saved: keep it and the ``keep - 1`` newest intact checkpoints of earlier steps,
    delete every checkpoint folder older than the oldest one kept; returns the names deleted. Not counted and
    not deleted: a damaged folder newer than that (it goes once enough intact ones follow it), and any folder
    of a step after ``current``'s (another trajectory: the run restarted or resumed from an earlier
    checkpoint). With fewer than ``keep`` intact checkpoints nothing is deleted."""
    at = checkpoint_step(current)
    earlier = [p for p in checkpoint_folders(Path(ckpt_root).parent) if checkpoint_step(p) < at]
    kept = [current] + [p for p in earlier if checkpoint_problem(p) is None][: max(keep - 1, 0)]
    if len(kept) < keep:
        return []
    oldest = checkpoint_step(kept[-1])
    gone = [p for p in earlier if checkpoint_step(p) < oldest]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in gone]


def checkpoint_problems(run_dir: str | Path, *, deep: bool = False) -> list[tuple[Path, str | None]]:
    """``(folder, problem or None)`` for every checkpoint folder of a run, newest first."""
    return [(p, checkpoint_problem(p, deep=deep)) for p in checkpoint_folders(run_dir)]


def all_damaged_line(problems: list[tuple[Path, str | None]]) -> str:
    """``"2 checkpoints, all damaged (step_000010: ...; step_000009: ...)"`` (the first three named)."""
    shown = "; ".join(f"{p.name}: {why}" for p, why in problems[:3])
    more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
    return f"{len(problems)} checkpoint{'s' if len(problems) != 1 else ''}, all damaged ({shown}{more})"


def set_aside_checkpoints(run_dir: str | Path, stamp: str) -> Path | None:
    """Move every checkpoint folder of a run and its ``LATEST`` into ``checkpoints/damaged-<stamp>/`` (a
    run that starts again because none of them is intact: nothing is deleted, and neither resuming nor
    pruning sees them there). Returns that folder, or None when there was nothing to move. Only call it
    while holding the run folder's lock."""
    root = Path(run_dir) / "checkpoints"
    folders = checkpoint_folders(run_dir)
    if not folders:
        return None
    dest, k = root / f"damaged-{stamp}", 1
    while dest.exists():
        k += 1
        dest = root / f"damaged-{stamp}-{k}"
    dest.mkdir()
    for p in folders + ([root / "LATEST"] if (root / "LATEST").is_file() else []):
        os.replace(p, dest / p.name)
    _fsync_dir(root)
    return dest


def write_state(folder: Path, step: int, state: dict) -> None:
    """``folder/trainer_state.pt``: ``state`` with its step; the RNG state is ``state["rng"]`` when given
    (else the current one). A full disk or an I/O error is raised as the ``OSError`` it is: ``torch.save``
    reports it as a bare ``RuntimeError`` from its zip writer (on a path), or raises one while closing the
    zip over the ``OSError`` of a Python file object's write; the latter is unwrapped here."""
    import torch

    with writes_as_os_errors():
        with open(Path(folder) / STATE_FILE, "wb") as f:
            torch.save({**state, "step": step, "rng": state.get("rng") or rng_state()}, f)


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, state: dict, *, keep: int = 2) -> Path:
    """Write ``run_dir/checkpoints/step_{step:06d}`` atomically (a Hugging Face checkpoint of ``model`` plus
    :data:`STATE_FILE`); prune to the ``keep`` newest. Returns its path."""
    tmp = begin_checkpoint(run_dir, step)
    try:
        with writes_as_os_errors():
            model.save_pretrained(tmp, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            write_state(tmp, step, state)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return commit_checkpoint(run_dir, step, tmp, keep=keep)


def checkpoint_step(ckpt: Path) -> int:
    """The step of a checkpoint folder ``step_000123`` (-1 for another name)."""
    name = Path(ckpt).name
    return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else -1


def latest_checkpoint(run_dir: str | Path, *, deep: bool = False, warn=None, before: int | None = None) -> Path | None:
    """The newest intact checkpoint of a run (the one LATEST names first, then the others newest first), or
    None. Each damaged one passed over is reported through ``warn(message)``; ``deep`` hashes the files;
    ``before``: only checkpoints of steps before it."""
    ckpt_root = Path(run_dir) / "checkpoints"
    pointer = ckpt_root / "LATEST"
    candidates = checkpoint_folders(run_dir)  # newest first by step number (step_10 before step_9)
    if before is not None:
        candidates = [p for p in candidates if 0 <= checkpoint_step(p) < before]
    try:
        named = ckpt_root / pointer.read_text().strip() if pointer.is_file() else None
    except OSError:
        named = None
    if named is not None and named in candidates:
        candidates.remove(named)
        candidates.insert(0, named)
    for p in candidates:
        problem = checkpoint_problem(p, deep=deep)
        if problem is None:
            return p
        if warn is not None:
            warn(f"warning: checkpoint {p} is damaged ({problem}); falling back to an earlier one")
    return None


def restore_state(path: Path, parallel, model, optimizer, lr_controller, dist, warn) -> dict:
    """Load the checkpoint at ``path`` into ``model``, ``optimizer`` (the strategy's ``load_state``; fsdp: every
    rank its shards) and ``lr_controller``, and set this rank's RNG state from it; returns the trainer state
    (``step``, ``history``). ``warn`` says when the checkpoint was written by another number of processes."""
    state = load_trainer_state(path)
    # the strategy reads the folder through this module's functions (distributed does not import train)
    parallel.load_state(path, model, optimizer, state, store=sys.modules[__name__])
    saved_world = state.get("world_size", 1)
    if saved_world != dist.world_size:
        warn(f"warning: checkpoint {path} was written by {saved_world} process(es), this run has "
             f"{dist.world_size}: it continues, but not on the trajectory of the run that wrote it "
             "(the ranks' sampling streams differ)")
    lr_controller.load_state_dict(state["lr_controller"])
    ranks = state.get("rng_ranks")  # every rank's sampling state (a distributed run's checkpoint)
    set_rng_state(ranks[dist.rank] if ranks and len(ranks) == dist.world_size else state["rng"])
    return state


def load_trainer_state(ckpt: Path) -> dict:
    import torch

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
