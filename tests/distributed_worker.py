"""torchrun worker of tests/test_distributed_step.py: every scenario's data-parallel step, the collectives and
fsdp's generation context; rank 0 saves the results.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/distributed_worker.py OUT.pt
"""

from __future__ import annotations

import sys

import torch
from conftest import tiny_qwen3
from distributed_helpers import BF16_SCENARIO, SCENARIOS, data_parallel_step, engines_used
from torch.distributed.tensor import DTensor

from oblr.distributed import (
    all_gather_objects,
    all_reduce_grads,
    broadcast_object,
    global_totals,
    init_distributed,
    make_parallel,
)
from oblr.distributed.env import exit_worker


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def collectives(rank: int) -> dict:
    """The small collectives on rank-dependent inputs (results checked by the test on rank 0's copy)."""
    a, b, c = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    a.grad = torch.full((3,), float(rank + 1))  # on every rank
    if rank == 0:
        b.grad = torch.ones(3)  # on rank 0 only; c on no rank
    all_reduce_grads([a, b, c], bucket_mb=1e-6)  # one parameter per bucket
    mask = torch.ones(2 + rank, 5 + 2 * rank)
    return {"a": a.grad, "b": b.grad, "c_is_none": c.grad is None,
            "objects": all_gather_objects([f"r{rank}"] * (rank + 1)), "chosen": broadcast_object(f"run-{rank}"),
            "totals": global_totals(mask)}


def generation(rank: int) -> dict:
    """fsdp's generation context: rank r runs r + 2 forwards (as ranks decoding prompts of different lengths
    do), then the ranks meet in a collective; afterwards the model is sharded again and trains as before."""
    parallel = make_parallel("fsdp")
    model = parallel.prepare(tiny_qwen3())
    ids = torch.arange(1, 9).view(2, 4)
    with torch.no_grad(), parallel.generation(model):
        inside = sorted({type(p).__name__ for p in model.parameters()})
        for _ in range(rank + 2):
            logits = model(input_ids=ids).logits
    met = all_gather_objects([rank])  # reached by both ranks: no collective was left pending inside
    after = sorted({type(p).__name__ for p in model.parameters()})
    model(input_ids=ids).logits.sum().backward()  # the ordinary sharded forward/backward still works
    return {"logits": logits, "met": met, "inside": inside, "after": after,
            "grad_types": sorted({type(p.grad).__name__ for p in model.parameters()})}


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    env = init_distributed("gloo", "cpu")
    results = {"world_size": env.world_size, "collectives": collectives(env.rank), "generation": generation(env.rank)}
    for sc in SCENARIOS:
        parallel = make_parallel(sc.mode, bucket_mb=sc.bucket_mb)
        model = parallel.prepare(sc.policy(tiny_qwen3().train()))
        ref = parallel.prepare(tiny_qwen3().requires_grad_(False)) if sc.kl_coef else None
        with engines_used() as engines:
            out = data_parallel_step(model, ref, sc, parallel, env.rank, env.world_size)
        out["engines"] = sorted(set(engines))
        for key in ("grads", "grads2", "params"):
            if key in out:
                out[key] = [_full(t).detach().clone() for t in out[key]]
        out["param_types"] = sorted({type(p).__name__ for p in model.parameters()})
        results[sc.name] = out
    sc = BF16_SCENARIO
    parallel = make_parallel(sc.mode, param_dtype="bfloat16")
    model = parallel.prepare(tiny_qwen3().train())
    out = data_parallel_step(model, None, sc, parallel, env.rank, env.world_size)
    results[sc.name] = {k: float(out[k]) for k in ("grad_sq", "S", "V", "lr")}
    if env.is_main:
        torch.save(results, out_path)
    exit_worker(0)  # not interpreter teardown: gloo's threads can abort it (SIGABRT) after a finished run


if __name__ == "__main__":
    main(sys.argv[1])
