"""torchrun worker of tests/distributed/test_meta_init.py: the FSDP2 start-up on the meta device (weights read
by rank 0, broadcast) against the full copy on every rank, on the same saved model; rank 0 saves the results.

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/meta_init_worker.py MODEL BROKEN OUT.pt

MODEL holds the tied tiny Qwen3 in float32; BROKEN the same with one tensor left out of its safetensors.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from distributed_helpers import SCENARIOS, data_parallel_step
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from oblr.distributed import (
    DistributedSetupError,
    all_gather_objects,
    init_distributed,
    make_parallel,
)
from oblr.distributed.env import exit_worker
from oblr.distributed.meta_init import build_empty
from oblr.distributed.sharded_state import full_model_state
from oblr.models import place_for_training

# the scenario with a KL reference (a deep copy of the meta model, filled on its own), gradient clipping,
# micro-batches and a second clipped epoch
SCENARIO = next(s for s in SCENARIOS if s.name == "fsdp-oblr-microbatch-kl-2epochs")


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _state(model) -> dict:
    """Everything to compare after set-up: the full weights (rank 0), buffers, tie and parameter types."""
    return {"weights": full_model_state(model),
            "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
            "tied": model.lm_head.weight is model.model.embed_tokens.weight,
            "types": sorted({type(p).__name__ for p in model.parameters()}),
            "dtypes": sorted({str(p.dtype) for p in model.parameters()})}


def _set_up(path: str, meta: bool, dtype: torch.dtype, **options):
    """``(policy, reference)`` as the trainer places them: loaded (empty or in full), then place_for_training."""
    parallel = make_parallel("fsdp", meta_init=meta, **options)
    if meta:
        model = build_empty(path, dtype=dtype, device="cpu")
        assert all(p.device.type == "meta" for p in model.parameters())
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    cfg = SimpleNamespace(model=SimpleNamespace(activation_checkpointing=False, lora_rank=0),
                          algorithm=SimpleNamespace(kl_coef=SCENARIO.kl_coef))
    policy, ref = place_for_training(model.train(), cfg, parallel)
    return parallel, policy, ref


def main(model_dir: str, broken_dir: str, out_path: str) -> None:
    torch.set_num_threads(1)
    env = init_distributed("gloo", "cpu")
    results = {"world_size": env.world_size}
    for name, meta, options in (("full", False, {}), ("meta", True, {"load_chunk_mb": 0.002})):  # 2 KB: many chunks
        parallel, policy, ref = _set_up(model_dir, meta, torch.float32, **options)
        r = {"setup": _state(policy), "ref": _state(ref)}
        out = data_parallel_step(policy, ref, SCENARIO, parallel, env.rank, env.world_size)
        r["step"] = {k: [_full(t).detach().clone() for t in out[k]] for k in ("grads", "grads2", "params")}
        r["after"] = _state(policy)
        results[name] = r
    for name, meta in (("full-bf16", False), ("meta-bf16", True)):  # a float32 file into a bfloat16 model
        results[name] = _state(_set_up(model_dir, meta, torch.bfloat16)[1])
    try:
        _set_up(broken_dir, True, torch.float32)
        broken = None
    except DistributedSetupError as e:
        broken = str(e)
    results["broken"] = all_gather_objects([broken])  # every rank's refusal, before any weight was sent
    if env.is_main:
        torch.save(results, out_path)
    exit_worker(0)  # not interpreter teardown: gloo's threads can abort it (SIGABRT) after a finished run


if __name__ == "__main__":
    main(*sys.argv[1:4])
