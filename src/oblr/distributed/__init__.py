"""Training on many processes (torchrun): DDP-style replicas or FSDP2 shards, with one-process semantics.

- :mod:`.env` -- process group from torchrun's environment (gloo on CPU, NCCL on CUDA, one device per
  rank), rank helpers, the one-line refusals of impossible setups;
- :mod:`.layout` -- a step's N prompts split over ranks in blocks of whole groups; evaluation shares;
- :mod:`.seeding` -- per-rank sampling seeds (a run is reproducible for a given world size);
- :mod:`.collectives` -- the reductions a step needs (totals, metrics, gradients, norms);
- :mod:`.fsdp` -- ``fully_shard`` for Hugging Face models, the book-keeping gradient into sharded ``.grad``;
- :mod:`.parallel` -- the modes by name: ``ddp`` (replicas, bucketed all-reduce) and ``fsdp``;
- :mod:`.step` -- the data-parallel gradient accumulation, S, V and SNR from collective reductions.

What is reduced, and how, is written out in docs/distributed.md. The names below are imported from their
modules on first use (:mod:`oblr._lazy`): importing this package, or its torch-free :mod:`.parallel`
(the config's choices), does not import torch.
"""

from typing import TYPE_CHECKING

from oblr._lazy import lazy_exports

if TYPE_CHECKING:
    from .collectives import (
        all_gather_cat,
        all_gather_objects,
        all_reduce_grads,
        all_reduce_sum,
        broadcast_,
        broadcast_object,
        global_totals,
        grad_sq_norm,
        reduce_metrics,
    )
    from .env import (
        DistEnv,
        DistributedSetupError,
        init_distributed,
        is_distributed,
        is_main,
        launched,
        rank,
        require_launch,
        resolve_backend,
        shutdown,
        world_size,
    )
    from .layout import check_layout, prompt_slice, row_slice, shard_rows, split_evenly
    from .parallel import PARALLEL, Replicated, Sharded, Single, make_parallel
    from .seeding import rank_seed, seed_all, seed_rank
    from .step import (
        DataParallelUpdate,
        clip_grads_,
        data_parallel_clipped_gradient,
        data_parallel_gradient,
        data_parallel_step_kl,
    )

__all__ = [
    "PARALLEL", "Single", "DataParallelUpdate", "DistEnv", "DistributedSetupError", "Replicated", "Sharded",
    "all_gather_cat", "all_gather_objects", "all_reduce_grads", "all_reduce_sum", "broadcast_", "broadcast_object",
    "check_layout", "clip_grads_", "data_parallel_clipped_gradient", "data_parallel_gradient", "data_parallel_step_kl",
    "global_totals",
    "grad_sq_norm", "init_distributed", "is_distributed", "is_main", "launched", "make_parallel", "prompt_slice",
    "rank", "rank_seed", "reduce_metrics", "require_launch", "resolve_backend", "row_slice", "seed_all",
    "seed_rank", "shard_rows", "shutdown", "split_evenly", "world_size",
]

_EXPORTS = {  # module -> the names this package exports from it (the imports above)
    ".collectives": ["all_gather_cat", "all_gather_objects", "all_reduce_grads", "all_reduce_sum",
            "broadcast_", "broadcast_object", "global_totals", "grad_sq_norm", "reduce_metrics"],
    ".env": ["DistEnv", "DistributedSetupError", "init_distributed", "is_distributed", "is_main", "launched",
            "rank", "require_launch", "resolve_backend", "shutdown", "world_size"],
    ".layout": ["check_layout", "prompt_slice", "row_slice", "shard_rows", "split_evenly"],
    ".parallel": ["PARALLEL", "Replicated", "Sharded", "Single", "make_parallel"],
    ".seeding": ["rank_seed", "seed_all", "seed_rank"],
    ".step": ["DataParallelUpdate", "clip_grads_", "data_parallel_clipped_gradient",
            "data_parallel_gradient", "data_parallel_step_kl"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
