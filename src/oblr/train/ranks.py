"""The trainer on many processes: the checks before anything loads, the process group, the run folder.

``oblr train`` under ``torchrun --nproc_per_node W`` (or ``oblr train --nproc W``) with
``distributed.strategy: ddp`` or ``fsdp`` trains with the semantics of one process on the same global batch
(docs/distributed.md): :func:`check_distributed` refuses
a setup that cannot work in one line before the model loads; :func:`start` initialises the process group
(gloo on CPU, NCCL on CUDA) and makes the strategy (:data:`oblr.distributed.PARALLEL`); rank 0 chooses the
run folder and every rank uses it (:func:`shared_run_dir`). Without a launch everything is one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from oblr.config import Config
from oblr.distributed import (
    DistEnv,
    DistributedSetupError,
    broadcast_object,
    check_layout,
    init_distributed,
    launched,
    make_parallel,
    require_launch,
    resolve_backend,
)

# strategies oblr train runs (every registered one today; a plugin's own strategy would need the trainer's
# checkpoint and generation hooks, so it is refused until it is wired)
TRAINER_STRATEGIES = ("none", "ddp", "fsdp")


def check_distributed(cfg: Config, environ: Mapping[str, str] | None = None) -> None:
    """One-line refusals (:class:`DistributedSetupError`) of a distributed setup, before any model loads."""
    env = os.environ if environ is None else environ
    d, r = cfg.distributed, cfg.rollout
    if d.strategy not in TRAINER_STRATEGIES:
        raise DistributedSetupError(f"distributed.strategy {d.strategy!r} is not wired into oblr train yet "
                                    f"(use one of {', '.join(TRAINER_STRATEGIES)}); see docs/distributed.md")
    world = int(env.get("WORLD_SIZE", "1")) if launched(env) else 1
    if d.strategy != "none":
        require_launch(f"distributed.strategy {d.strategy!r}", env)
    elif world > 1:
        raise DistributedSetupError(f"torchrun started {world} processes but distributed.strategy is 'none'; "
                                    "set distributed.strategy=ddp (or start one process)")
    if d.strategy == "fsdp" and cfg.model.lora_rank > 0:
        raise DistributedSetupError("distributed.strategy 'fsdp' with LoRA (model.lora_rank > 0) is not supported; "
                                    "use ddp, whose replicas train LoRA as one process does")
    if d.strategy == "fsdp" and r.engine != "hf":
        raise DistributedSetupError(f"distributed.strategy 'fsdp' samples with the in-process engine only "
                                    f"(rollout.engine=hf), not {r.engine!r}")
    resolve_backend(d.backend, cfg.model.device)  # NCCL without CUDA, NCCL on CPU tensors
    check_layout(r.prompts_per_step, r.group_size, world, micro_batch_groups=cfg.algorithm.micro_batch_groups)


def start(cfg: Config):
    """``(DistEnv, parallel)``: the process group of this launch (none without one) and the strategy."""
    check_distributed(cfg)
    env: DistEnv = init_distributed(cfg.distributed.backend, cfg.model.device, timeout_s=cfg.distributed.timeout_s)
    return env, make_parallel(cfg.distributed.strategy, **cfg.distributed.options)


def shared_run_dir(resolve: Callable[[], Path], env: DistEnv) -> Path:
    """Rank 0's run folder on every rank; an error rank 0 hit (e.g. the folder holds a run) raised on all."""
    if not env.distributed:
        return resolve()
    result: object
    if env.is_main:
        try:
            result = resolve()
        except Exception as e:  # noqa: BLE001 -- re-raised on every rank below
            result = e
    else:
        result = None
    result = broadcast_object(result)
    if isinstance(result, Exception):
        raise result
    return Path(result)
