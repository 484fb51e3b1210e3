"""The ways to place a model over ranks, chosen by name (:data:`PARALLEL`): ``none`` (one process),
``ddp`` (replicas) and ``fsdp`` (shards).

Each mode is an object with one interface, used by :func:`oblr.distributed.step.data_parallel_gradient`:

- ``prepare(model) -> model``: make the model ready on every rank (ddp: every rank gets rank 0's
  parameters and buffers; fsdp: :func:`oblr.distributed.fsdp.shard_model`, which also fills a model
  built on the meta device -- fsdp's ``meta_init``, on by default, asks the trainer for one);
- ``grad_sink()``: what the book-keeping path does with each parameter's gradient increment (None:
  ``.grad +=``, the ddp way; fsdp: a :class:`~oblr.distributed.fsdp.ShardedGradSink`);
- ``reduce_grads(params)``: after the step's accumulation, make ``.grad`` the sum over ranks (ddp: one
  bucketed all-reduce of every gradient; fsdp: flush the sink -- the plain path was reduced by FSDP2);
- ``generation(model)``: a context for sampling, in which a rank may run any number of forwards (ranks
  generate different prompts, whose lengths differ): nothing for none and ddp; fsdp gathers the whole
  model once on entry (one all-gather per FSDP module) and reshards it on exit, so decoding runs no
  collective;
- ``save_state(run_dir, step, model, tokenizer, optimizer, state, *, keep, final, store)`` and
  ``load_state(path, model, optimizer, state, *, store)``: the training state in a checkpoint folder,
  called by every rank: none and ddp write the full weights and optimizer state from rank 0; fsdp writes
  every rank's shards with torch.distributed.checkpoint (:mod:`oblr.distributed.sharded_state`) and, at
  the end of the run (``final``), the consolidated weights. ``store`` is the run folder's checkpoint
  functions (:mod:`oblr.train.checkpoint`: ``save_checkpoint``, ``load_weights_into``,
  ``begin_checkpoint``, ``write_state``, ``commit_checkpoint``), passed in by the caller: this layer sits
  below the trainer and does not import it. The trainer never asks which strategy it has.

``ddp`` does not wrap the model in ``torch.nn.parallel.DistributedDataParallel``: the book-keeping
backward computes no weight gradients through autograd, so DDP's all-reduce hooks would never fire.
``benchmarks/scaling.py`` measures the alternative that makes DDP's reducer do it (a forward through the
DDP wrapper, then a backward of the parameters themselves with the book-keeping gradient) against this
bucketed all-reduce; docs/distributed.md has the numbers and the choice.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Annotated, Literal

from oblr.checks import Range
from oblr.registry import Registry

from .defaults import DEFAULT_BUCKET_MB

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    from torch import nn

    from .fsdp import ShardedGradSink


PARALLEL = Registry("distributed strategy")


class _FullState:
    """Checkpoints of a model whose every rank holds all of it: rank 0 writes, every rank reads."""

    def save_state(self, run_dir, step: int, model, tokenizer, optimizer, state: dict, *, keep: int,
                   final: bool, store) -> None:
        from .env import is_main

        if is_main():
            store.save_checkpoint(run_dir, step, model, tokenizer, {**state, "optimizer": optimizer.state_dict()},
                                  keep=keep)

    def load_state(self, path, model, optimizer, state: dict, *, store) -> None:
        store.load_weights_into(model, path)
        optimizer.load_state_dict(state["optimizer"])


@PARALLEL.register("none")
class Single(_FullState):
    """One process: the model as it is, ``.grad`` filled in place, nothing to reduce."""

    name = "none"

    def prepare(self, model: nn.Module) -> nn.Module:
        return model

    def grad_sink(self):
        return None

    def reduce_grads(self, params) -> None:
        pass

    def generation(self, model: nn.Module):
        return nullcontext()


@PARALLEL.register("ddp")
class Replicated(_FullState):
    """Data parallel with a full replica per rank; gradients summed by one bucketed all-reduce per step."""

    name = "ddp"

    def __init__(self, bucket_mb: Annotated[float, Range(gt=0, le=1e6)] = DEFAULT_BUCKET_MB):
        self.bucket_mb = bucket_mb

    def prepare(self, model: nn.Module) -> nn.Module:
        """Every rank gets rank 0's parameters and buffers (as DDP's constructor does)."""
        import torch
        import torch.distributed as dist

        from .env import is_distributed

        if is_distributed():
            with torch.no_grad():
                for t in list(model.parameters()) + list(model.buffers()):
                    dist.broadcast(t.data, src=0)
        return model

    def grad_sink(self):
        return None

    def reduce_grads(self, params) -> None:
        from .collectives import all_reduce_grads

        all_reduce_grads(params, bucket_mb=self.bucket_mb)

    def generation(self, model: nn.Module):
        return nullcontext()


@PARALLEL.register("fsdp")
class Sharded:
    """FSDP2: parameters, gradients and optimizer state sharded over ranks (``fully_shard``)."""

    name = "fsdp"

    def __init__(self, param_dtype: Literal["float32", "bfloat16", "float16"] | None = None,
                 reduce_dtype: Literal["float32", "bfloat16"] = "float32",
                 bucket_mb: Annotated[float, Range(gt=0, le=1e6)] = DEFAULT_BUCKET_MB,
                 reshard_after_forward: bool = True, meta_init: bool = True,
                 load_chunk_mb: Annotated[float, Range(gt=0, le=1e7)] = 64.0):
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.bucket_mb, self.reshard_after_forward = bucket_mb, reshard_after_forward
        # meta_init: the trainer builds the model with its parameters on the meta device and prepare() fills
        # each rank's shards from rank 0's read of the weights (oblr.distributed.meta_init); False: every rank
        # loads the whole model first, then shards it
        self.meta_init, self.load_chunk_mb = meta_init, load_chunk_mb
        self._sink: ShardedGradSink | None = None

    def prepare(self, model: nn.Module) -> nn.Module:
        """``fully_shard`` the model; a model built on the meta device gets its shards filled here."""
        from .env import require_launch
        from .fsdp import shard_model

        require_launch("parallel mode 'fsdp'")
        return shard_model(model, param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype,
                           reshard_after_forward=self.reshard_after_forward, chunk_mb=self.load_chunk_mb)

    def grad_sink(self) -> ShardedGradSink:
        from .fsdp import ShardedGradSink

        self._sink = ShardedGradSink(self.bucket_mb)
        return self._sink

    def reduce_grads(self, params) -> None:
        if self._sink is not None:
            self._sink.flush()
            self._sink = None

    @contextmanager
    def generation(self, model: nn.Module):
        """The whole model unsharded for sampling (memory: one full copy of the parameters per rank while
        it lasts); the forwards inside run no collective, so ranks may run different numbers of them."""
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for m in modules:  # the same order on every rank: one all-gather each
            m.unshard()
        model.set_reshard_after_forward(False)
        try:
            yield
        finally:
            model.set_reshard_after_forward(self.reshard_after_forward)
            for m in modules:
                m.reshard()


    def save_state(self, run_dir, step: int, model, tokenizer, optimizer, state: dict, *, keep: int,
                   final: bool, store) -> None:
        """Rank 0 opens the temporary checkpoint folder, every rank writes its shards of the model and
        optimizer state into ``sharded/`` (torch.distributed.checkpoint), rank 0 adds the trainer state, the
        model config and tokenizer -- and, when ``final``, the consolidated Hugging Face weights gathered
        from all ranks -- and commits the folder (manifest, rename, LATEST, pruning)."""
        import shutil
        from pathlib import Path

        from oblr.disk_errors import writes_as_os_errors

        from .collectives import broadcast_object
        from .env import is_main
        from .sharded_state import SHARDED_DIR, full_model_state, save_sharded

        main = is_main()
        tmp = Path(broadcast_object(str(store.begin_checkpoint(run_dir, step)) if main else None))
        with writes_as_os_errors():
            save_sharded(tmp / SHARDED_DIR, model, optimizer)
        full = full_model_state(model) if final else None  # collective
        if not main:
            return
        try:
            with writes_as_os_errors():
                if full is not None:
                    model.save_pretrained(tmp, state_dict=full, safe_serialization=True)
                else:
                    model.config.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                store.write_state(tmp, step, state)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        store.commit_checkpoint(run_dir, step, tmp, keep=keep)

    def load_state(self, path, model, optimizer, state: dict, *, store) -> None:
        """Every rank reads its shards of the model and optimizer state."""
        from pathlib import Path

        from .sharded_state import SHARDED_DIR, load_sharded

        load_sharded(Path(path) / SHARDED_DIR, model, optimizer)


def make_parallel(mode: str, **options):
    """The data-parallel mode ``mode`` (a name of :data:`PARALLEL`) with its options."""
    return PARALLEL.get(mode)(**options)
