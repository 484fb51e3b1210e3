"""FSDP2 for models that do not fit on one device: sharding a Hugging Face causal LM with ``fully_shard``,
and the book-keeping gradient into the sharded ``.grad``.

:func:`shard_model` applies ``fully_shard`` to every decoder layer (the classes the model lists in
``_no_split_modules``) and then to the root (embeddings, final norm and head: a tied embedding stays ONE
parameter there), with an optional :class:`MixedPrecisionPolicy` (e.g. bf16 parameters for compute and
fp32 gradient reductions). Parameters become DTensors sharded on dim 0 (``Shard(0)``, uneven shards as
``torch.chunk`` cuts them); the forward all-gathers each layer's parameters and frees them again. A model
built on the meta device (:mod:`oblr.distributed.meta_init`) is sharded first and then filled, so that no
rank holds a full copy of it at start-up.
The gradient divide factor is set to 1: the loss factors c_i already divide by the global batch, so the
gradient is the SUM over ranks (FSDP2's default would average).

The book-keeping path (:class:`oblr.gradnorm.BookKeeper`) records full activations inside each unsharded
layer and never lets autograd produce weight gradients, so FSDP2's own reduce-scatter has nothing to
reduce; the engine assembles each parameter's increment at its full (global) shape instead.
:class:`ShardedGradSink` takes those increments (as the BookKeeper's ``grad_sink``), packs them into
buckets laid out like FSDP2's own reduce-scatter input (each parameter padded to ``W * ceil(d0 / W)``
rows), reduce-scatters each bucket (sum, float32) and, on :meth:`ShardedGradSink.flush`, wraps each
rank's rows with ``DTensor.from_local`` using the parameter's own mesh, placements, shape and stride.
The plain path (an ordinary ``loss.backward()``, e.g. GRPO without SNR) goes through FSDP2 itself.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from .defaults import DEFAULT_BUCKET_MB
from .env import DistributedSetupError, is_distributed
from .meta_init import is_empty, materialize

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules to shard one by one: instances of the classes in the model's ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise DistributedSetupError(f"FSDP: cannot find the decoder layers of {type(model).__name__} (it names no "
                                    "layer classes in _no_split_modules); shard it with fully_shard yourself")
    return layers


def mixed_precision(param_dtype: str | None, reduce_dtype: str = "float32") -> MixedPrecisionPolicy:
    """FSDP2 policy: parameters all-gathered and used in ``param_dtype`` (None: as stored), gradients
    reduced in ``reduce_dtype``."""
    for what, name in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if name is not None and name not in DTYPES:
            raise DistributedSetupError(f"FSDP {what} {name!r} is unknown; known: {', '.join(DTYPES)}")
    return MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype] if param_dtype else None,
                                reduce_dtype=DTYPES[reduce_dtype])


def shard_model(model: nn.Module, *, param_dtype: str | None = None, reduce_dtype: str = "float32",
                reshard_after_forward: bool = True, mesh=None, chunk_mb: float | None = None) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root; gradients summed over ranks. Returns ``model``.

    Needs an initialised process group (torchrun). The model must already be on this rank's device, or
    have its parameters on the meta device (:func:`oblr.distributed.meta_init.build_empty`): then each rank
    allocates only its shards and they are filled from rank 0's read of the weights
    (:func:`oblr.distributed.meta_init.materialize`, ``chunk_mb`` MiB at a time).
    FSDP2 finishes its set-up lazily at the first forward; a one-token forward without gradients is run
    here so that it happens outside :meth:`oblr.gradnorm.BookKeeper.record` (which switches
    ``requires_grad`` off while it records, and FSDP2 would then take every parameter as frozen).
    """
    if not is_distributed():
        raise DistributedSetupError("FSDP needs a distributed launch (torchrun --nproc_per_node K ...): "
                                    "no process group is initialised")
    policy = mixed_precision(param_dtype, reduce_dtype)
    kw = {"mp_policy": policy, "reshard_after_forward": reshard_after_forward}
    if mesh is not None:
        kw["mesh"] = mesh
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    for m in model.modules():  # both setters act on one module's parameter group, not recursively
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM, 1.0 needs no scaling
    if is_empty(model):
        build = getattr(model, "oblr_empty_build", None)
        if build is None:
            raise DistributedSetupError("FSDP: the model has parameters on the meta device but no record of where "
                                        "its weights are (build it with oblr.distributed.meta_init.build_empty)")
        materialize(model, build, **({} if chunk_mb is None else {"chunk_mb": chunk_mb}))
    device = next(model.parameters()).to_local().device
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device))
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


class ShardedGradSink:
    """Book-keeping gradient increments (full shape, every rank) -> their sum over ranks in the sharded ``.grad``.

    Call it as ``sink(param, increment)`` (the BookKeeper's ``grad_sink``) in the same parameter order on
    every rank; buckets of about ``bucket_mb`` MiB are reduce-scattered asynchronously as they fill;
    :meth:`flush` sends the last bucket, waits for all and adds each rank's rows to ``param.grad``
    (created as a DTensor like the parameter if None). Increments are reduced in float32.
    """

    def __init__(self, bucket_mb: float = DEFAULT_BUCKET_MB):
        self.bucket_bytes = int(bucket_mb * 2**20)
        self._bucket: list[tuple[nn.Parameter, torch.Tensor]] = []
        self._bytes = 0
        self._pending: list = []

    def __call__(self, param: nn.Parameter, increment: torch.Tensor) -> None:
        if not isinstance(param, DTensor) or tuple(param.placements) != (Shard(0),):
            what = type(param).__name__ if not isinstance(param, DTensor) else f"placements {param.placements}"
            raise DistributedSetupError(f"ShardedGradSink handles parameters sharded by fully_shard on dim 0 "
                                        f"(Shard(0)), got {what}")
        if self._bucket and self._bucket[0][0].device_mesh is not param.device_mesh:
            self._launch()
        self._bucket.append((param, increment.float()))
        self._bytes += increment.numel() * 4
        if self._bytes >= self.bucket_bytes:
            self._launch()

    def _launch(self) -> None:
        if not self._bucket:
            return
        bucket, self._bucket, self._bytes = self._bucket, [], 0
        group = bucket[0][0].device_mesh.get_group()
        W = dist.get_world_size(group)
        parts, metas = [], []
        for p, inc in bucket:
            d0 = p.shape[0]
            chunk = -(-d0 // W)  # rows per rank, the last ranks' shards padded (as FSDP2 pads them)
            rest = inc[0].numel() if d0 else 0
            padded = inc.new_zeros((W * chunk, *p.shape[1:]))
            padded[:d0].copy_(inc.reshape(p.shape))
            parts.append(padded.view(W, chunk * rest))
            metas.append((p, chunk, rest))
        send = torch.cat(parts, dim=1).reshape(-1)  # [W * S]: rank r's segment holds its rows of every param
        out = send.new_empty(send.numel() // W)
        work = dist.reduce_scatter_tensor(out, send, op=dist.ReduceOp.SUM, group=group, async_op=True)
        self._pending.append((work, out, send, metas))

    def flush(self) -> None:
        """Reduce what is left, wait for every reduce-scatter and add the shards to ``.grad``."""
        self._launch()
        pending, self._pending = self._pending, []
        for work, out, _send, metas in pending:
            work.wait()
            offset = 0
            for p, chunk, rest in metas:
                rows = p.to_local().shape[0]
                local = out[offset: offset + chunk * rest].view(chunk, *p.shape[1:])[:rows]
                offset += chunk * rest
                g = DTensor.from_local(local.to(p.dtype).contiguous(), p.device_mesh, p.placements,
                                       run_check=False, shape=p.shape, stride=p.stride())
                if p.grad is None:
                    p.grad = g
                else:
                    p.grad.add_(g)
