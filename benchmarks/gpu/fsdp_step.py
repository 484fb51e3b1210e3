"""One FSDP2 step on a Qwen3-shaped model on one GPU: exact norms against the loop, OBLR-PO/GRPO step time.

    PYTHONPATH=src python3 benchmarks/gpu/fsdp_step.py --out fsdp_step.json       # H100: Qwen3-0.6B shape, bf16
    PYTHONPATH=src torchrun --nproc_per_node 1 benchmarks/gpu/fsdp_step.py --out fsdp_step.json
    PYTHONPATH=src python3 benchmarks/gpu/fsdp_step.py --tiny --device cpu --out x.json   # CPU path (tested in CI)

The model is built from a config (random init, nothing downloaded): by default Qwen3-0.6B's shape --
hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, MLP 3072, vocab 151936, tied embeddings
(0.60 B parameters). It is sharded with :func:`oblr.distributed.fsdp.shard_model` (a process group of
one rank is made when the script is not started by torchrun).

1. **norms** -- for each parameter dtype in ``--norm-dtypes`` (``float32``: no mixed precision;
   ``bfloat16``: bf16 parameters for compute, fp32 master weights and reductions), the BookKeeper on the
   sharded model gives ``w_i = ||s_i||^2`` for ``--norm-seqs`` sequences and, through the
   :class:`~oblr.distributed.fsdp.ShardedGradSink`, the weighted gradient ``sum_i c_i s_i`` in the
   sharded ``.grad``; both are compared with the loop (one backward per sequence,
   :mod:`oblr.gradnorm.reference`) on an unsharded float32 copy, on a small Qwen3-shaped model
   (``NORM_CASE``: 4 layers, hidden 256, vocab 4096; the loop costs one backward per sequence).
   Reported: max relative errors (bf16 compute differs from the fp32 loop by bf16 rounding, ~1e-2).
2. **step time** -- ``grpo`` (plain path) and ``oblr`` (book-keeping, SNR) through
   :func:`oblr.distributed.data_parallel_gradient` plus an AdamW step (lr 0), median of ``--repeats``
   after one warm-up, interleaved, with the device synchronised around each call, at Qwen3-0.6B shape;
   peak memory per method (above what was allocated before the warm-up call).

Needs only torch (>= 2.8: FSDP2's ``set_force_sum_reduction_for_comms``), transformers (Qwen3 config and
model classes) and this checkout's ``src/`` on ``PYTHONPATH``; no network, no tokenizer, no weights.

Everything is written as JSON to ``--out`` and summarised on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from step_methods import Case, build_batch, build_model  # noqa: E402

QWEN3_06B = Case(hidden=1024, layers=28, vocab=151936, prompt_len=128, response_len=256, n_prompts=8, group_size=4,
                 heads=16, kv_heads=8, head_dim=128, intermediate=3072, tied=True)
# the exactness check runs on a small Qwen3-shaped model (the loop does one backward per sequence)
NORM_CASE = Case(hidden=256, layers=4, vocab=4096, prompt_len=32, response_len=64, n_prompts=4, group_size=2,
                 heads=4, kv_heads=2, head_dim=64, intermediate=768, tied=True)
TINY = Case(hidden=64, layers=2, vocab=256, prompt_len=6, response_len=10, n_prompts=4, group_size=2)


def _one_rank_group(device: str):
    """torchrun's environment for a single process when not launched by it, then the process group."""
    from oblr.distributed import init_distributed, launched

    if not launched():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return init_distributed("auto", device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def check_norms(case: Case, device: torch.device, param_dtype: str | None, n_seqs: int) -> dict:
    """BookKeeper on the sharded model vs the loop on an unsharded float32 copy (w_i and sum_i c_i s_i)."""
    from torch.distributed.tensor import DTensor

    from oblr.distributed import make_parallel
    from oblr.gradnorm import BookKeeper, loop_per_sequence_grads
    from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs

    batch, _ = build_batch(case)
    ids, am, rm = (t[:n_seqs].to(device) for t in (batch.input_ids, batch.attention_mask, batch.response_mask))
    coeffs = torch.linspace(-1.0, 1.0, n_seqs, device=device)
    ref_model = build_model(case, device=str(device))
    per_seq = loop_per_sequence_grads(ref_model, ids, am, rm)  # [n_seqs][params] float32
    w_ref = torch.stack([sum(g.double().pow(2).sum() for g in gs) for gs in per_seq])
    g_ref = [sum(coeffs[i].double() * per_seq[i][j].double() for i in range(n_seqs)) for j in range(len(per_seq[0]))]
    names = [n for n, p in ref_model.named_parameters() if p.requires_grad]
    del per_seq, ref_model

    parallel = make_parallel("fsdp", param_dtype=param_dtype)
    model = parallel.prepare(build_model(case, device=str(device)))
    book = BookKeeper(model, grad_sink=parallel.grad_sink())
    with book.record():
        book.backward(sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm))
    w = book.sq_norms().double()
    book.accumulate_grad(coeffs)
    book.clear()
    parallel.reduce_grads(list(model.parameters()))
    got = dict(model.named_parameters())
    g_err = max(_rel(got[n].grad.full_tensor() if isinstance(got[n].grad, DTensor) else got[n].grad, r)
                for n, r in zip(names, g_ref))
    out = {"param_dtype": param_dtype or "float32", "sequences": n_seqs, "w_rel_err_max": float(((w - w_ref).abs()
           / w_ref).max()), "weighted_grad_rel_err_max": g_err, "w": w.tolist(), "w_loop": w_ref.tolist()}
    del model, book
    return out


def time_steps(case: Case, device: torch.device, param_dtype: str | None, repeats: int) -> dict:
    """grpo vs oblr steps on the sharded model (interleaved, median), peak memory per method."""
    from oblr.distributed import data_parallel_gradient, make_parallel
    from oblr.update import UpdateSettings

    batch, rewards = build_batch(case)
    for k in ("input_ids", "attention_mask", "response_mask", "response_lengths"):
        setattr(batch, k, getattr(batch, k).to(device))
    rewards = rewards.to(device)
    parallel = make_parallel("fsdp", param_dtype=param_dtype)
    model = parallel.prepare(build_model(case, device=str(device)))
    opt = torch.optim.AdamW(model.parameters(), lr=0.0)
    methods = {"grpo": UpdateSettings(baseline="grpo", need_snr=False, max_len=case.response_len),
               "oblr": UpdateSettings(baseline="oblr", need_snr=True, max_len=case.response_len)}
    times: dict = {m: [] for m in methods}
    peak: dict = {}

    def call(m: str) -> float:
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        data_parallel_gradient(model, batch, rewards, methods[m], parallel)
        opt.step()
        _sync(device)
        return time.perf_counter() - t0

    for m in methods:  # warm-up (also creates the optimizer state) and peak memory
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        call(m)
        if device.type == "cuda":
            peak[m] = (torch.cuda.max_memory_allocated(device) - base) / 2**30
    names = list(methods)
    for r in range(repeats):
        for m in names[r % 2:] + names[: r % 2]:
            times[m].append(call(m))
        print(f"  repeat {r + 1}/{repeats}: " + ", ".join(f"{m} {times[m][-1]:.3f}s" for m in names), flush=True)
    med = {m: statistics.median(t) for m, t in times.items()}
    return {"param_dtype": param_dtype or "float32", "times_s": times, "median_s": med,
            "oblr_over_grpo": med["oblr"] / med["grpo"], "peak_gib_above_start": peak,
            "params": sum(p.numel() for p in model.parameters()), "batch": f"{case.n_prompts}x{case.group_size}",
            "tokens": f"{case.prompt_len}+{case.response_len}"}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON results file")
    ap.add_argument("--device", default="auto", help="auto | cuda | cpu")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (the CPU path the tests run)")
    ap.add_argument("--param-dtype", default=None, help="timed step's FSDP param dtype (default: bfloat16 on "
                                                        "CUDA, float32 on CPU)")
    ap.add_argument("--norm-dtypes", default=None, help="comma-separated (default: float32,bfloat16 on CUDA, "
                                                        "float32 on CPU)")
    ap.add_argument("--norm-seqs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=None, help="N (default 8; tiny 4)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default 4; tiny 2)")
    ap.add_argument("--response-len", type=int, default=None, help="response tokens (default 256; tiny 10)")
    args = ap.parse_args(argv)
    from oblr.distributed import shutdown

    env = _one_rank_group(args.device)
    try:
        torch.manual_seed(0)
        case = TINY if args.tiny else QWEN3_06B
        over = {"n_prompts": args.prompts, "group_size": args.group_size, "response_len": args.response_len}
        case = Case(**{**case.__dict__, **{k: v for k, v in over.items() if v is not None}})
        cuda = env.device.type == "cuda"
        norm_dtypes = (args.norm_dtypes or ("float32,bfloat16" if cuda else "float32")).split(",")
        param_dtype = args.param_dtype or ("bfloat16" if cuda else "float32")
        t0 = time.perf_counter()
        res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(env.device) if cuda else "cpu",
               "world_size": env.world_size, "case": case.name}
        res["norms"] = []
        for dt in norm_dtypes:
            res["norms"].append(check_norms(TINY if args.tiny else NORM_CASE, env.device, None if dt == "float32" else dt, args.norm_seqs))
            print(f"norms ({dt}): w_i max rel err {res['norms'][-1]['w_rel_err_max']:.2e}, weighted gradient "
                  f"max rel err {res['norms'][-1]['weighted_grad_rel_err_max']:.2e}", flush=True)
        res["step"] = time_steps(case, env.device, None if param_dtype == "float32" else param_dtype, args.repeats)
        res["wall_s"] = time.perf_counter() - t0
        print(f"{res['step']['params'] / 1e9:.3f} B parameters, FSDP2 {res['step']['param_dtype']}: step time "
              f"grpo {res['step']['median_s']['grpo']:.3f} s, oblr {res['step']['median_s']['oblr']:.3f} s, "
              f"oblr/grpo {res['step']['oblr_over_grpo']:.2f}; peak memory above the start (GiB) "
              + ", ".join(f"{m} {v:.2f}" for m, v in res['step']['peak_gib_above_start'].items()), flush=True)
        if env.is_main:
            args.out.write_text(json.dumps(res, indent=2) + "\n")
        return res
    finally:
        shutdown()


if __name__ == "__main__":
    main()
