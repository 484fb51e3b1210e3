"""torchrun worker of tests/test_distributed_step.py: every scenario's data-parallel step; rank 0 saves them.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_worker.py OUT.pt
"""

from __future__ import annotations

import sys

import torch
from conftest import tiny_qwen3
from distributed_helpers import SCENARIOS, data_parallel_step
from torch.distributed.tensor import DTensor

from oblr.distributed import init_distributed, make_parallel, shutdown


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    env = init_distributed("gloo", "cpu")
    results = {"world_size": env.world_size}
    for sc in SCENARIOS:
        parallel = make_parallel(sc.mode, bucket_mb=sc.bucket_mb)
        model = parallel.prepare(tiny_qwen3().train())
        ref = parallel.prepare(tiny_qwen3().requires_grad_(False)) if sc.kl_coef else None
        out = data_parallel_step(model, ref, sc, parallel, env.rank, env.world_size)
        for key in ("grads", "grads2", "params"):
            if key in out:
                out[key] = [_full(t).detach().clone() for t in out[key]]
        out["param_types"] = sorted({type(p).__name__ for p in model.parameters()})
        results[sc.name] = out
    if env.is_main:
        torch.save(results, out_path)
    shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
