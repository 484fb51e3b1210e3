"""``oblr export``: a run's checkpoint as a plain Hugging Face model folder, to serve (vLLM, transformers) or to
train on elsewhere.

``--model`` names what ``oblr eval --model`` takes (a run folder: its newest intact checkpoint; one of its
``checkpoints/step_N``; a model folder). What is written to ``--out``:

- a full fine-tuning checkpoint: its weights as they are (``model.safetensors`` + ``config.json``), without
  ``trainer_state.pt`` and the manifest;
- a sharded checkpoint of an FSDP run (``sharded/`` only, every one but the last): its shards gathered in
  this one process into ordinary safetensors weights;
- a LoRA checkpoint (adapters only): the adapters merged into the base model the run trained (found as
  ``oblr eval`` finds it; ``--base-model`` overrides; a base with other weights than the run started from is
  refused), so the folder loads without peft.

Every case loads in float32 on ``--device`` (default ``cpu``: 4 bytes per parameter of memory; ``cuda`` merges on
the GPU, the weights moved back to the CPU to be written), so a merge is computed in float32, and is cast to
``--dtype`` only when saved (default ``auto``: the dtype the source's weights were saved in; for adapters, their base's). The
tokenizer is saved beside the weights, and ``oblr_export.json`` records the source, its step, what was done
and the dtype. Everything is checked before a model loads (an existing ``--out`` is refused, never
overwritten), and the folder is written under a hidden name beside ``--out`` and renamed when complete: an
interrupted export leaves no half-written model where a server would read it (an export killed outright
leaves its hidden folder, which the next export to the same ``--out`` removes).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from oblr.evaluate_cli import _is_adapter, lora_base, resolve_model_arg

RECORD = "oblr_export.json"
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``oblr export`` to an argparse sub-parser set; the handler is ``args.func``."""
    p = subparsers.add_parser("export", help="write a run's checkpoint as a plain Hugging Face model folder "
                              "(LoRA adapters merged, FSDP shards gathered), to serve or share",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="run folder of oblr train (its newest intact checkpoint), one of its checkpoints/step_N, "
                        "or a model folder")
    p.add_argument("--out", required=True, help="the model folder to write (refused if it exists and is not empty)")
    p.add_argument("--base-model", default=None,
                   help="the base model of a LoRA checkpoint's adapters; default: the model its run trained "
                        "(the run's config.yaml), else the base named in adapter_config.json")
    p.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES,
                   help="dtype of the written weights; auto (default): the dtype the source was saved in")
    p.add_argument("--device", default="cpu",
                   help="where the model is loaded and adapters merged, in float32: cpu (default), cuda, cuda:N, mps; "
                        "a device this machine lacks is refused before anything loads")
    p.set_defaults(func=run_cli)
    return p


def saved_dtype(model_dir: str | os.PathLike) -> str:
    """The dtype a model folder's ``config.json`` says its weights were saved in (``dtype``, or the older
    ``torch_dtype``); float32 when it says none or names another."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
    return name if name in DTYPE_CHOICES[1:] else "float32"


def check_out(out: str | os.PathLike) -> Path:
    """``--out`` as a path, refused with one line when it holds anything (an export never overwrites) or when
    its parent is not a folder."""
    path = Path(out).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ValueError(f"--out {out}: exists and is not an empty folder; an export never overwrites, "
                         f"so name a new folder")
    if path.parent.exists() and not path.parent.is_dir():
        raise ValueError(f"--out {out}: its parent {path.parent} is not a folder")
    return path


def run_cli(args: argparse.Namespace) -> int:
    from oblr.distributed.env import resolve_device

    out = check_out(args.out)
    if args.device == "auto":
        raise ValueError("--device auto: name the device (cpu, cuda, cuda:N, mps); an export does not pick one")
    device = str(resolve_device(args.device))  # one line on a machine without it, before any model loads
    model_path, run = resolve_model_arg(args.model, "export")
    source = Path(model_path)
    if _is_adapter(source):
        base = lora_base(model_path, run, args.base_model)
        from oblr.models import resolve_model_path

        dtype = saved_dtype(resolve_model_path(base)) if args.dtype == "auto" else args.dtype
    elif args.base_model is not None:
        raise ValueError(f"--base-model {args.base_model}: --model {args.model} is not a LoRA checkpoint "
                         f"(only adapters take a base model)")
    else:
        base = None
        dtype = saved_dtype(source) if args.dtype == "auto" else args.dtype
    written = export_model(model_path, out, base=base, dtype=dtype, device=device)
    print(f"[export] {written}: {json.loads((written / RECORD).read_text())['what']}, {dtype}", file=sys.stderr)
    return 0


def _remove_orphans(out: Path) -> None:
    """Delete the hidden folders that exports to ``out`` killed before their rename left (``.NAME.tmpPID`` of a
    process that is gone, or of this process's id reused); one of another live process (an export running now)
    is left alone."""
    for tmp in out.parent.glob(f".{out.name}.tmp*"):
        pid = tmp.name.rsplit(".tmp", 1)[1]
        if not pid.isdigit():
            continue
        if int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except PermissionError:  # alive, another user's
                continue
        shutil.rmtree(tmp, ignore_errors=True)


def export_model(model_path: str | os.PathLike, out: str | os.PathLike, *, base: str | None = None,
                 dtype: str = "float32", device: str = "cpu") -> Path:
    """Write the model at ``model_path`` (a model or checkpoint folder, or LoRA adapters when ``base`` is given)
    to the new folder ``out`` as a plain Hugging Face model in ``dtype``; returns ``out``. Loaded in float32 on
    ``device`` (adapters merged there), cast and moved to the CPU when saved; written beside ``out`` under a hidden name and renamed."""
    import torch

    from oblr.models import is_sharded_checkpoint, load_lora_checkpoint, load_model_and_tokenizer
    from oblr.train.checkpoint import checkpoint_step

    out = check_out(out)
    source = Path(model_path)
    if base is not None:
        model, tokenizer = load_lora_checkpoint(model_path, base, dtype="float32", device=device)
        model = model.merge_and_unload()
        what = f"LoRA adapters merged into {base}"
    else:
        what = "shards gathered" if is_sharded_checkpoint(source) else "weights as saved"
        model, tokenizer = load_model_and_tokenizer(model_path, dtype="float32", device=device)
    model.to(getattr(torch, dtype)).to("cpu")
    step = checkpoint_step(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(out)
    tmp = out.parent / f".{out.name}.tmp{os.getpid()}"
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        record = {"source": str(source.resolve()), "step": None if step < 0 else step, "what": what, "base_model": base, "dtype": dtype}
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():  # an empty folder (check_out let it pass): replaced by the complete one
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
