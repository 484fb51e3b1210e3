"""Peak host memory of each rank at FSDP2 start-up: the full copy on every rank against the meta-device build.

    python benchmarks/fsdp_startup_memory.py                        # ~184M-parameter Qwen3 shape, 2 processes
    python benchmarks/fsdp_startup_memory.py --out benchmarks/results/fsdp_startup   # also summary.md + json

A Qwen3-shaped model (random init, tied embeddings, float32) is saved once with ``save_pretrained`` to a
temporary folder. Each start-up mode then runs in a fresh ``torchrun --nproc_per_node 2`` (gloo, CPU, one
thread per process) that does what ``oblr train distributed.strategy=fsdp`` does before its first rollout:

- ``full`` (``distributed.options.meta_init=false``, the start-up before this script): every rank
  ``from_pretrained`` the whole model, then ``fully_shard``;
- ``meta`` (the default): parameters on the meta device, ``fully_shard``, then ``to_empty`` and the
  weights read by rank 0 and broadcast (``set_model_state_dict(broadcast_from_rank0=True)``) in chunks of
  ``load_chunk_mb`` (default 64 MiB);
- ``meta-1GiB``: the same with ``load_chunk_mb=1024``, more than this model: rank 0 holds all of its
  full tensors at once.

Each mode runs twice: with glibc's allocator as it comes (its mmap threshold rises to the size of a freed
block, up to 32 MiB, after which freed tensors stay in the heap and keep counting as resident), and with
``MALLOC_MMAP_THRESHOLD_=131072`` (the threshold fixed at glibc's initial value: large tensors are returned
to the system when freed), which shows what the start-up itself needs.

Measured on each rank right after set-up (``Sharded.prepare``, which ends with FSDP2's warm-up forward):
``VmHWM`` of ``/proc/self/status`` (the peak resident set of the process), and the same before the model was
touched (after the imports and ``init_process_group``) as the baseline; the start-up's own peak is the
difference. The ratio printed is meta / full of that difference, per rank. Also the peak when FSDP2's
warm-up forward starts (a forward pre-hook on the root): the loading alone. The warm-up forward gathers the
root's parameters (here the 125 MiB tied embedding) and one layer at a time; on a GPU those and the shards
are device memory, so the loading column is the closer picture of a GPU node's host memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {"full": {"meta_init": False}, "meta": {"meta_init": True},
         "meta-1GiB": {"meta_init": True, "load_chunk_mb": 1024.0}}
SHAPE = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=12,
             num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=2048,
             tie_word_embeddings=True)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(model_dir: str, mode: str, out: str) -> None:
    """One rank of one start-up (under torchrun); rank 0 writes every rank's numbers to ``out``."""
    import torch
    from transformers import AutoModelForCausalLM

    from oblr.distributed import all_gather_objects, init_distributed, make_parallel, shutdown
    from oblr.distributed.meta_init import build_empty

    torch.set_num_threads(1)
    env = init_distributed("gloo", "cpu")
    all_gather_objects([0])  # the process group's own buffers are in the baseline
    base_kb = _status_kb("VmHWM")
    t0 = time.perf_counter()
    parallel = make_parallel("fsdp", **MODES[mode])
    at_forward: list[int] = []
    if parallel.meta_init:
        model = build_empty(model_dir, dtype=torch.float32, device="cpu")
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    hook = model.register_forward_pre_hook(lambda *_: at_forward.append(_status_kb("VmHWM")) if not at_forward
                                           else None)
    model = parallel.prepare(model.train())
    hook.remove()
    seconds = time.perf_counter() - t0
    local = sum(p.to_local().numel() for p in model.parameters())
    row = {"rank": env.rank, "baseline_peak_mb": base_kb / 1024, "peak_mb": _status_kb("VmHWM") / 1024,
           "rss_after_mb": _status_kb("VmRSS") / 1024, "setup_s": seconds, "local_params": local,
           "params": sum(p.numel() for p in model.parameters())}
    row["startup_peak_mb"] = row["peak_mb"] - row["baseline_peak_mb"]
    row["load_peak_mb"] = at_forward[0] / 1024 - row["baseline_peak_mb"]
    rows = all_gather_objects([row])
    if env.is_main:
        Path(out).write_text(json.dumps(rows))
    shutdown()


def save_model(folder: Path) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, attn_implementation="eager")).float()
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


ALLOCATORS = {"glibc default": {}, "MALLOC_MMAP_THRESHOLD_=131072": {"MALLOC_MMAP_THRESHOLD_": "131072"}}


def run_mode(model_dir: Path, mode: str, tmp: Path, allocator: dict) -> list[dict]:
    out = tmp / f"{mode}.json"
    env = {**os.environ, **allocator, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, "--worker", str(model_dir), mode, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"start-up {mode!r} failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def summary(results: dict, n_params: int) -> str:
    full_mb = n_params * 4 / 2**20
    lines = [f"Qwen3-shaped model, {n_params / 1e6:.0f}M parameters (tied embeddings), float32: "
             f"{full_mb:.0f} MiB of weights, {full_mb / 2:.0f} MiB of shards per rank; 2 processes (torchrun, "
             "gloo, CPU). Start-up peak = VmHWM after set-up minus VmHWM before the model was touched; "
             "x full = that peak over the full-copy start-up's, same rank and allocator.", "",
             "| allocator | start-up | rank | peak RSS (VmHWM) MiB | baseline MiB | start-up peak MiB | x full "
             "| loading peak MiB | x full | RSS after MiB | set-up s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for alloc, modes in results.items():
        full = {r["rank"]: r for r in modes["full"]}
        for mode, rows in modes.items():
            for r in rows:
                f = full[r["rank"]]
                lines.append(f"| {alloc} | {mode} | {r['rank']} | {r['peak_mb']:.0f} | {r['baseline_peak_mb']:.0f} | "
                             f"{r['startup_peak_mb']:.0f} | {r['startup_peak_mb'] / f['startup_peak_mb']:.2f} | "
                             f"{r['load_peak_mb']:.0f} | {r['load_peak_mb'] / f['load_peak_mb']:.2f} | "
                             f"{r['rss_after_mb']:.0f} | {r['setup_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for summary.md and results.json")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = ap.parse_args()
    if "full" not in args.modes:
        raise SystemExit("--modes: 'full' is the reference every ratio is taken against; include it")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        n_params = save_model(tmp / "model")
        results = {alloc: {mode: run_mode(tmp / "model", mode, tmp, env) for mode in args.modes}
                   for alloc, env in ALLOCATORS.items()}
    text = summary(results, n_params)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"shape": SHAPE, "params": n_params, "modes": MODES,
                                                           "allocators": ALLOCATORS, "results": results},
                                                          indent=1) + "\n")
        header = ("# FSDP2 start-up: peak host memory per rank\n\nGenerated by "
                  "`python benchmarks/fsdp_startup_memory.py --out benchmarks/results/fsdp_startup`.\n\n")
        (args.out / "summary.md").write_text(header + text + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
