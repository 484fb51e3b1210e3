"""Models: load any causal LM + tokenizer, wrap it with LoRA, resolve (and build) the built-in tiny model.

One code path for real checkpoints and the built-in model: both go through
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``
(:func:`load_model_and_tokenizer`). The built-in model (``"builtin"`` or ``"builtin:tiny-arith"``) is a
Qwen3-architecture checkpoint shipped inside the package (:mod:`oblr.models.shipped`: the same bytes on
every machine, checked against their sha256), made by :func:`oblr.models.builtin.build_builtin_model`
(tokenizer: :mod:`oblr.models.tokenizer`); the tasks ``countdown`` and ``word_problems`` have their own
built-in models (``"builtin:tiny-countdown"``, ``"builtin:tiny-words"``, :mod:`oblr.models.task_builtins`).
With ``OBLR_BUILTIN=build`` they are built on this machine into ``$OBLR_CACHE_DIR/models`` (default
``~/.cache/oblr``) the first time they are asked for. A checkpoint of an FSDP run saved before the run's end holds its weights only
as sharded state (``sharded/``): it is loaded in one process from its config and the shards
(:func:`is_sharded_checkpoint`). Real checkpoints prepared by ``oblr models prepare NAME``
(:mod:`oblr.models.prepare`) load as ``"prepared:NAME"``. :func:`wrap_lora` adds LoRA adapters (peft); :func:`enable_activation_checkpointing` turns on non-reentrant
activation checkpointing. :data:`DTYPES` lists the
parameter dtypes by name (``model.dtype``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from oblr.models.cache import LOCK_REPORT_EVERY_S, cache_dir, lock_holder  # noqa: F401 (the package's API)
from oblr.models.cache import build_lock as _build_lock

BUILTIN_NAMES = ("builtin", "builtin:tiny-arith")
BUILTIN_DIRNAME = "tiny-arith-v1"

# parameter dtypes by name (the config's choices) and the short aliases load_model_and_tokenizer accepts too
DTYPES = ("float32", "bfloat16", "float16")
_DTYPES = {**{d: d for d in DTYPES}, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def builtin_model_dir() -> Path:
    return cache_dir() / "models" / BUILTIN_DIRNAME


def is_builtin(name: str) -> bool:
    return str(name).strip().lower() in BUILTIN_NAMES


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def _looks_local(name: str) -> bool:
    """Not of the hub-id form ``owner/name`` (so a missing path is reported as such)."""
    return _HUB_ID.fullmatch(name) is None


def resolve_model_path(name_or_path: str | os.PathLike, *, build: bool = True, progress=None) -> Path | str:
    """Where ``from_pretrained`` should load from.

    - ``"builtin"`` / ``"builtin:tiny-arith"`` / ``"builtin:tiny-countdown"`` / ``"builtin:tiny-words"`` -> the
      shipped folder in the package (:mod:`oblr.models.shipped`, every file checked against its sha256 once
      per process). With ``OBLR_BUILTIN=build``: the cached build of this machine, built on first use (and
      rebuilt when the cached one is incomplete or from an older recipe) when ``build`` is true; otherwise a
      missing one raises ``FileNotFoundError``.
    - ``"prepared:NAME"`` (or a bare ``NAME`` of :data:`oblr.models.prepare.PREPARABLE` when no local path of
      that name exists) -> the folder ``oblr models prepare NAME`` wrote; not prepared: ``FileNotFoundError``
      naming that command.
    - an existing directory -> that directory.
    - something that looks like a local path but does not exist -> ``FileNotFoundError`` naming it.
    - otherwise a hub id (``"Qwen/Qwen3-4B-Base"``) is returned as a string; with ``HF_HUB_OFFLINE=1`` it
      must already be in the local Hugging Face cache, else a ``FileNotFoundError`` explains the fix.
      Without it the hub is probed first (:data:`HUB_PROBE_TIMEOUT_S`): when it cannot be reached, the
      cached copy is used, else a ``FileNotFoundError`` says how to run offline.
    """
    name = os.fspath(name_or_path)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"model name or path must be a non-empty string, got {name_or_path!r}")
    from oblr.models.task_builtins import spec_of

    spec = spec_of(name)
    if spec is not None or is_builtin(name):
        from oblr.models.shipped import source, verified_dir

        if source() == "shipped":  # the bytes in the package, the same on every machine
            return verified_dir(spec.dirname if spec is not None else BUILTIN_DIRNAME)
    if spec is not None:  # a task's built-in model (builtin:tiny-countdown, builtin:tiny-words), built here
        return _resolve_task_model(spec, build=build, progress=progress)
    if is_builtin(name):
        path = builtin_model_dir()
        from oblr.models.builtin import build_builtin_model, is_current_build

        if not is_current_build(path):
            if not build:
                raise FileNotFoundError(f"built-in model not found at {path}; load it once with "
                                        f"load_model_and_tokenizer('builtin') to build it")
            with _build_lock(path):  # a second process (a grid's other job) waits, then loads the first's build
                if not is_current_build(path):
                    kw = {} if progress is None else {"progress": progress}
                    build_builtin_model(path, overwrite=True, **kw)  # replaces an incomplete or outdated build
        return path
    from oblr.models.prepare import prepared_name, resolve_prepared

    prepared = prepared_name(name)  # "prepared:NAME", or a bare registered NAME that is no local path
    if prepared is not None:
        return resolve_prepared(prepared)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model directory {path} has no config.json; it is not a saved "
                                    f"Hugging Face model (save one with model.save_pretrained(dir))")
        return path
    if path.exists():
        raise FileNotFoundError(f"model path {path} is a file; pass the directory that holds config.json")
    if _looks_local(name):
        raise FileNotFoundError(f"model path {path} does not exist (pass an existing directory saved with "
                                f"save_pretrained, 'builtin', or a Hugging Face hub id like Qwen/Qwen3-4B-Base)")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(name, local_files_only=True))
        except Exception as e:  # noqa: BLE001 - any miss in the local cache ends here
            raise FileNotFoundError(
                f"model {name!r} is not a local directory and not in the local Hugging Face cache; "
                f"HF_HUB_OFFLINE is set, so hub downloads are not attempted. Fix: pass a local directory, "
                f"download it first on a machine with network (hf download {name}), or unset "
                f"HF_HUB_OFFLINE. ({type(e).__name__})") from None
    return _hub_or_cache(name)


# seconds the hub may take to answer the probe of resolve_model_path (a refused or unresolvable endpoint
# answers at once; this bounds a silently dropped connection)
HUB_PROBE_TIMEOUT_S = 5.0


def _hub_or_cache(name: str) -> Path | str:
    """A hub id without ``HF_HUB_OFFLINE``: ``name`` when the hub answers (transformers downloads or reports a
    missing repository); when it cannot be reached, the copy in the local Hugging Face cache, else one
    ``FileNotFoundError`` saying how to run offline -- instead of about a minute of download retries."""
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        HfApi().model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
        return name
    except HfHubHTTPError:  # the hub answered (not found, gated, ...): transformers says what
        return name
    except Exception as e:  # noqa: BLE001 - no answer: no network, a refused or unknown endpoint, a timeout
        reason = f"{type(e).__name__}: {e}".splitlines()[0][:160]
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached either
        pass
    raise FileNotFoundError(
        f"model {name!r} is not a local directory, not in the local Hugging Face cache, and the hub "
        f"({constants.ENDPOINT}) cannot be reached ({reason}), so nothing can be downloaded. Fix: pass a local "
        f"directory saved with save_pretrained or 'builtin', or download it on a machine with network "
        f"(hf download {name}) and run offline with HF_HUB_OFFLINE=1")


def task_model_dir(spec) -> Path:
    """Cache folder of a task's built-in model (:class:`oblr.models.task_builtins.TaskModelSpec`)."""
    return cache_dir() / "models" / spec.dirname


def _resolve_task_model(spec, *, build: bool, progress) -> Path:
    from oblr.models.task_builtins import build_task_model, is_current

    path = task_model_dir(spec)
    if not is_current(path, spec):
        if not build:
            raise FileNotFoundError(f"built-in model {spec.name} not found at {path}; load it once with "
                                    f"load_model_and_tokenizer({spec.name!r}) to build it")
        with _build_lock(path):
            if not is_current(path, spec):
                kw = {} if progress is None else {"progress": progress}
                build_task_model(spec.task, path, overwrite=True, **kw)
    return path


def ensure_builtin_built(name: str, *, distributed: bool, local_rank: int, rank: int, timeout_s: float) -> None:
    """Before a run's work starts: a built-in model (``name``, plain or a task's) that must still be built needs
    a writable cache folder. Under torchrun, local rank 0 builds it and the node's other ranks wait for the
    finished build (ranks that built at once raced in the cache folder: one read it while another replaced it);
    a rank that waits longer than ``timeout_s`` raises ``TimeoutError``. In one process it is built when it loads."""
    import time

    from oblr.checks import check_writable
    from oblr.models.builtin import is_current_build
    from oblr.models.task_builtins import is_current, spec_of

    spec = spec_of(name)
    if spec is not None or is_builtin(name):
        from oblr.models.shipped import source

        if source() == "shipped":  # nothing to build: the package holds it
            return
    if spec is not None:
        path, what = task_model_dir(spec), name
        ready = lambda: is_current(path, spec)  # noqa: E731
    elif is_builtin(name):
        path, what = builtin_model_dir(), "the built-in model"
        ready = lambda: is_current_build(path)  # noqa: E731
    else:
        return
    if ready():
        return
    check_writable(path.parent, "the built-in model must be built, but its cache folder",
                   hint="set OBLR_CACHE_DIR to a writable folder")
    if not distributed:
        return
    if local_rank == 0:
        resolve_model_path(name)
        return
    deadline = time.monotonic() + timeout_s  # torchrun stops this rank if rank 0 fails
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank} waited {timeout_s:.0f} s (distributed.timeout_s) for local rank 0 to "
                               f"build {what} into {path}")
        time.sleep(1.0)


def place_for_training(model, cfg, parallel):
    """``(policy, reference)``: ``model`` with activation checkpointing when ``model.activation_checkpointing``
    and LoRA adapters when ``model.lora_rank > 0``, placed by the parallel
    strategy (ddp: rank 0's weights on every rank; fsdp: shards), and, when ``algorithm.kl_coef > 0``, a frozen
    copy of its initial weights placed like it (else None)."""
    import copy

    m = cfg.model
    if m.activation_checkpointing:  # a model that cannot checkpoint is refused here, before any step
        enable_activation_checkpointing(model)
    if m.lora_rank > 0:
        model = wrap_lora(model, rank=m.lora_rank, alpha=m.lora_alpha, targets=m.lora_targets)
    ref = None
    if cfg.algorithm.kl_coef > 0:
        ref = parallel.prepare(copy.deepcopy(model).eval().requires_grad_(False))
    return parallel.prepare(model), ref


def quiet_hf_progress() -> None:
    """Turn off the progress bar transformers 5 prints for every save and load of a (tiny) checkpoint."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def load_model_and_tokenizer(name_or_path: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu",
                             trust_remote_code: bool = False, progress=None, empty: bool = False):
    """``(model, tokenizer)`` from a local directory, a hub id, or ``"builtin"``.

    The tokenizer gets ``padding_side="left"`` and, when it has none, ``pad_token = eos_token``. The model
    is returned in eval mode on ``device`` with ``dtype`` (``float32``, ``bfloat16`` or ``float16``).
    With ``empty`` and safetensors weights in the folder, its parameters are left on the meta device
    (:func:`oblr.distributed.meta_init.build_empty`: FSDP2 fills each rank's shards when it shards the model);
    a folder without safetensors weights (e.g. a sharded checkpoint) loads in full as without ``empty``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from oblr.distributed.meta_init import build_empty, weight_files

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(sorted(_DTYPES))}, got {dtype!r}")
    path = resolve_model_path(name_or_path, progress=progress)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        if empty and weight_files(path):  # (a sharded checkpoint has no *.safetensors)
            model = build_empty(path, dtype=getattr(torch, _DTYPES[dtype]), device=device,
                                trust_remote_code=trust_remote_code)
        elif is_sharded_checkpoint(path):
            model = _from_sharded_checkpoint(path, getattr(torch, _DTYPES[dtype]), trust_remote_code)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, _DTYPES[dtype]),
                                                         trust_remote_code=trust_remote_code)
    except OSError as e:
        raise FileNotFoundError(f"could not load model {name_or_path!r} from {path}: {e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if not any(p.device.type == "meta" for p in model.parameters()):
        model.to(device)
    model.eval()
    return model, tokenizer


def load_lora_checkpoint(adapter_dir: str | os.PathLike, base: str | os.PathLike, *, dtype: str = "float32",
                         device: str = "cpu", trust_remote_code: bool = False):
    """``(model, tokenizer)``: the base model ``base`` (anything :func:`load_model_and_tokenizer` takes) with the
    LoRA adapters saved in ``adapter_dir`` (a LoRA run's checkpoint: ``adapter_config.json`` +
    ``adapter_model.safetensors``) attached as in training, not merged, so the forward is the one the run's own
    evaluation computed. In eval mode on ``device``."""
    try:
        from peft import PeftModel
    except ImportError:
        raise ImportError("evaluating a LoRA checkpoint needs peft (pip install peft)") from None
    model, tokenizer = load_model_and_tokenizer(base, dtype=dtype, device=device,
                                                trust_remote_code=trust_remote_code)
    model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=False)
    model.to(device)
    model.eval()
    return model, tokenizer


def is_sharded_checkpoint(path) -> bool:
    """A checkpoint of an FSDP run written before its end: the model's weights only as sharded state
    (``sharded/``, torch.distributed.checkpoint), no ``*.safetensors``."""
    path = Path(path)
    return path.is_dir() and (path / "sharded").is_dir() and not any(path.glob("*.safetensors"))


def _from_sharded_checkpoint(path: Path, dtype, trust_remote_code: bool):
    """The model of a sharded checkpoint in one process: built from its config.json, then the weights read
    from the shards (:func:`oblr.distributed.sharded_state.load_sharded_weights`, no process group)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from oblr.distributed.sharded_state import load_sharded_weights

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    load_sharded_weights(Path(path) / "sharded", model)
    return model


def enable_activation_checkpointing(model) -> None:
    """Hugging Face activation checkpointing of ``model``'s decoder blocks, non-reentrant (the kind the
    exact-norm engine works with, :class:`oblr.gradnorm.TwoPassBookKeeper`). A model that cannot checkpoint
    is refused in one line (:class:`oblr.config.ConfigError`)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        from oblr.config import ConfigError

        raise ConfigError(f"config key 'model.activation_checkpointing': {type(model).__qualname__} does not support "
                          "activation checkpointing (its supports_gradient_checkpointing is not True)")
    if hasattr(model, "_require_grads_hook"):  # enabled before: drop that input-grads hook, or each call adds one
        model.disable_input_require_grads()
    if hasattr(model, "activation_checkpointing_enable"):  # newer transformers (5.24 has it, 5.17 not)
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:  # older transformers: the same switch under its former name
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def disable_activation_checkpointing(model) -> None:
    """Undo :func:`enable_activation_checkpointing`: checkpointing off, and the hook that made the embedding
    outputs require grad removed (disabling leaves it on a model without PEFT, and ``torch.func`` refuses it)."""
    (getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable)()
    if hasattr(model, "_require_grads_hook"):
        model.disable_input_require_grads()


def wrap_lora(model, *, rank: int, alpha: float, targets: list[str]):
    """``model`` with LoRA adapters of ``rank`` on the modules named ``targets`` (only they train)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        from oblr.config import ConfigError

        raise ConfigError("config key 'model.lora_rank': LoRA needs peft (pip install 'oblr[lora]')") from None
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                            lora_dropout=0.0))
