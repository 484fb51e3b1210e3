"""FSDP2 start-up without a full copy of the model on every rank: parameters built on the meta device,
sharded, then filled from the weights rank 0 reads.

:func:`build_empty` (every rank) builds a Hugging Face causal LM from its ``config.json`` with every
parameter on the meta device: torch's global parameter-registration hook
(``torch.nn.modules.module.register_module_parameter_registration_hook``) replaces each parameter by a meta
tensor as it is registered, so no parameter is ever allocated or initialised, while buffers are computed
for real as the model's constructor computes them (the rotary ``inv_freq``, a non-persistent buffer that
no checkpoint holds). Tied embeddings stay one parameter.

:func:`materialize` (every rank, collective) on a model that ``fully_shard`` has already sharded:
``to_empty`` allocates this rank's shards only, the constructor's buffers are copied back, and
``torch.distributed.checkpoint.state_dict.set_model_state_dict(full_state_dict=True,
broadcast_from_rank0=True)`` fills the shards: rank 0 reads the safetensors files in chunks of at most
``chunk_mb`` MiB (cast to the model's dtype), torch broadcasts each tensor and keeps each rank's rows of it
(``distribute_tensor``). Rank 0 holds one chunk of full tensors at a time, the other ranks one tensor.

Why rank 0 reads and broadcasts rather than every rank reading its own rows: one reader of the files (a
network file system is read once, not W times), and the cutting into shards stays torch's; the price is one
broadcast of the weights at start-up. Before anything is broadcast, rank 0 compares the files' tensor
names with the model's and every rank raises the same one-line error when they differ (a checkpoint whose
names transformers renames on load: start with ``distributed.options.meta_init=false``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .env import DistributedSetupError

# rank 0 holds at most this much of full tensors at a time besides its shards (or the largest tensor, if larger);
# each chunk costs one pass of load_state_dict over the shards (benchmarks/fsdp_startup_memory.py)
DEFAULT_CHUNK_MB = 64.0


@dataclass(frozen=True)
class EmptyBuild:
    """Where an empty (meta) model's weights are, and the device its shards go to."""

    path: str
    device: str


def weight_files(path: str | Path) -> list[Path]:
    """The ``*.safetensors`` files of a model folder (empty when there are none)."""
    p = Path(path)
    return sorted(p.glob("*.safetensors")) if p.is_dir() else []


@contextmanager
def params_on_meta():
    """Every parameter registered inside the block becomes a meta tensor (buffers are left as computed)."""
    from torch.nn.modules.module import register_module_parameter_registration_hook

    def to_meta(module, name, param):
        if param is None or param.device.type == "meta":
            return None
        return nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    handle = register_module_parameter_registration_hook(to_meta)
    try:
        yield
    finally:
        handle.remove()


def build_empty(path: str | Path, *, dtype: torch.dtype, device: str, trust_remote_code: bool = False):
    """The causal LM of the folder ``path`` with its parameters on the meta device (its buffers computed),
    its generation config read as ``from_pretrained`` reads it; ``model.oblr_empty_build`` says where the
    weights are and which device the shards go to."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    with params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    if (Path(path) / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    meta_buffers = [n for n, b in model.named_buffers() if b.device.type == "meta"]
    if meta_buffers:
        raise DistributedSetupError(f"meta-device start-up: {type(model).__name__} computes buffer "
                                    f"{meta_buffers[0]!r} on the meta device; set distributed.options.meta_init=false")
    model.oblr_empty_build = EmptyBuild(str(path), str(device))
    return model.eval()


def is_empty(model: nn.Module) -> bool:
    """True when some parameter of ``model`` is still on the meta device."""
    return any(p.device.type == "meta" for p in model.parameters())


def _canonical_names(model: nn.Module) -> tuple[dict[str, torch.dtype], dict[str, str]]:
    """``(names, aliases)``: the persistent state names of ``model`` that the weights must hold, each with its
    dtype, and the second names of tied parameters (``lm_head.weight`` -> ``model.embed_tokens.weight``)."""
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    names = {k: v.dtype for k, v in model.state_dict().items() if k not in aliases}
    return names, aliases


def _plan(files: list[Path], names: dict[str, torch.dtype], aliases: dict[str, str], chunk_bytes: int):
    """Rank 0: chunks of ``(file, key)`` whose tensors (in the model's dtype) fill at most ``chunk_bytes``
    each (a larger tensor is a chunk alone); raises DistributedSetupError when the names differ."""
    from safetensors import safe_open

    chunks: list[list[tuple[str, str]]] = [[]]
    size, seen = 0, set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            for key in sf.keys():
                if key in aliases:  # a tied parameter written twice: its first name carries it
                    continue
                if key not in names:
                    raise DistributedSetupError(f"meta-device start-up: {f.name} holds {key!r}, which "
                                                "the model has no parameter or buffer for; set "
                                                "distributed.options.meta_init=false to load it as from_pretrained does")
                n = 1
                for d in sf.get_slice(key).get_shape():
                    n *= d
                nbytes = n * names[key].itemsize
                if chunks[-1] and size + nbytes > chunk_bytes:
                    chunks.append([])
                    size = 0
                chunks[-1].append((str(f), key))
                size += nbytes
                seen.add(key)
    missing = sorted(set(names) - seen)
    if missing:
        raise DistributedSetupError(f"meta-device start-up: the weights in {files[0].parent} lack "
                                    f"{len(missing)} tensor(s) of the model, e.g. {missing[0]!r}")
    return [c for c in chunks if c]


def materialize(model: nn.Module, build: EmptyBuild, *, chunk_mb: float = DEFAULT_CHUNK_MB) -> None:
    """Every rank (collective): the sharded meta ``model`` gets its shards on ``build.device``, its buffers
    as its constructor computed them, and the weights of ``build.path`` (read by rank 0, broadcast)."""
    import torch.distributed as dist
    from safetensors import safe_open
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    from .collectives import broadcast_object

    if getattr(model, "peft_config", None):
        raise DistributedSetupError("meta-device start-up: a LoRA (peft) model is not supported; wrap it after "
                                    "loading the base model in full (distributed.options.meta_init=false)")
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    tied_before = _canonical_names(model)[1]
    model.to_empty(device=torch.device(build.device))
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    names, aliases = _canonical_names(model)
    if aliases != tied_before:  # to_empty swaps tensors in place, so ties survive; refuse if that ever changes
        raise DistributedSetupError(f"meta-device start-up: to_empty untied {sorted(set(tied_before) - set(aliases))}")
    plan: object = None
    if dist.get_rank() == 0:
        files = weight_files(build.path)
        try:
            if not files:
                raise DistributedSetupError(f"meta-device start-up: no *.safetensors weights in {build.path}")
            plan = _plan(files, names, aliases, int(chunk_mb * 2**20))
        except DistributedSetupError as e:
            plan = e
    plan = broadcast_object(plan)
    if isinstance(plan, Exception):
        raise plan
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    for chunk in plan:
        state: dict[str, torch.Tensor] = {}
        if dist.get_rank() == 0:
            for f in dict.fromkeys(f for f, _ in chunk):
                with safe_open(f, framework="pt") as sf:
                    for g, key in chunk:
                        if g == f:
                            state[key] = sf.get_tensor(key).to(names[key])
        set_model_state_dict(model, state, options=options)
        del state
