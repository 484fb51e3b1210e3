"""Data-parallel scaling of one update step: 1 process vs 2 processes on the same global batch (CPU, gloo).

    python benchmarks/scaling.py                 # the table (a few minutes on 2 shared CPU cores)
    python benchmarks/scaling.py --quick         # a tiny case, ~1 minute: checks that everything runs
    python benchmarks/scaling.py --markdown FILE --plot FILE.png

It launches itself under ``torchrun --standalone --nproc_per_node 2`` (one thread per process). Rounds
are interleaved so that the load of a shared machine hits every variant alike; round r runs, in a
rotated order:

- ``1 process``: rank 0 alone does the step on the WHOLE batch (``oblr.update`` directly) while rank 1
  waits in a barrier (a blocking socket read, no CPU);
- ``2 processes``: both ranks do :func:`oblr.distributed.data_parallel_gradient` on their halves, in
  each data-parallel variant: ``ddp`` (oblr's bucketed all-reduce of ``.grad``), ``ddp_reducer``
  (torch ``DistributedDataParallel``: the forward goes through the DDP wrapper and the book-keeping
  gradient is handed to DDP's reducer by a backward of the parameters themselves, ``autograd.backward
  (params, grads)``, with a summing comm hook; on the plain GRPO path DDP's own hooks reduce during the
  backward) and ``fsdp`` (``fully_shard``, reduce-scatter into DTensor ``.grad``).

A step is ``zero_grad``, the accumulation, and ``SGD.step`` with learning rate 0 (the model never
changes). Time per step: rank 0's wall time between two barriers, median over rounds. The machine's load
average is printed: on a machine shared with other work, 2 processes also get a larger share of it.

The two ways to reduce the book-keeping gradient of a replicated model are also timed alone, on the
step's model and on a larger one (``REDUCE_CASE``), many interleaved calls each from the same random
``.grad``: ``ddp`` (oblr's bucketed all-reduce) and ``ddp_reducer`` (the hand-over to DDP's reducer). Exactness: every
variant's gradient (gathered for fsdp), ``||g_k||^2``, S and V against the 1-process step of the same
run (max relative error). Communication: the payload each variant reduces per step, counted from the
parameter shapes -- here and for Qwen3-4B / Qwen3-8B (configs built on the meta device, nothing downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from step_methods import Case, build_batch, build_model  # noqa: E402

CASE = Case(hidden=256, layers=4, vocab=4096, prompt_len=32, response_len=64, n_prompts=8, group_size=4)
QUICK = Case(hidden=64, layers=2, vocab=512, prompt_len=8, response_len=16, n_prompts=4, group_size=2)
# public Qwen3 configs (config.json of Qwen/Qwen3-4B and Qwen/Qwen3-8B; 4B ties its embeddings)
QWEN3 = {
    "Qwen3-4B": Case(hidden=2560, layers=36, vocab=151936, prompt_len=1, response_len=1, n_prompts=1, group_size=1,
                     heads=32, kv_heads=8, head_dim=128, intermediate=9728, tied=True),
    "Qwen3-8B": Case(hidden=4096, layers=36, vocab=151936, prompt_len=1, response_len=1, n_prompts=1, group_size=1,
                     heads=32, kv_heads=8, head_dim=128, intermediate=12288, tied=False),
}
REDUCE_CASE = Case(hidden=512, layers=8, vocab=16384, prompt_len=1, response_len=1, n_prompts=1, group_size=1)
VARIANTS = ("ddp", "ddp_reducer", "fsdp")
METHODS = {"oblr": ("oblr", True), "grpo": ("grpo", False)}  # name -> (baseline, need_snr)


# ------------------------------------------------------------------------------------------ communication
def param_count(case: Case) -> int:
    """Trainable parameters of the case's Qwen3 model, from its shapes (meta device: nothing allocated)."""
    model = build_model(case, device="meta")
    return sum(p.numel() for p in model.parameters())  # .parameters() yields a tied weight once


def comm_table(cases: dict[str, Case], world: int = 8) -> list[dict]:
    """Bytes each step moves through collectives, from the parameter count P.

    ddp: one all-reduce of the fp32 gradient (payload 4P; ring traffic per rank 2(W-1)/W x payload).
    fsdp: one reduce-scatter of the fp32 gradient per micro-batch (payload 4P; per rank (W-1)/W x
    payload) and two all-gathers of the bf16 parameters per micro-batch (forward, and again in the
    backward because layers are resharded after the forward: 2 x 2P; per rank (W-1)/W x payload).
    The step's other collectives (totals, metrics, per-prompt norms, S/V) are O(N) numbers.
    """
    rows = []
    for name, case in cases.items():
        P = param_count(case)
        rows.append({"model": name, "params": P, "ddp_allreduce_bytes": 4 * P,
                     "ddp_per_rank_bytes": 2 * (world - 1) / world * 4 * P,
                     "fsdp_reduce_scatter_bytes": 4 * P, "fsdp_allgather_bytes": 2 * 2 * P,
                     "fsdp_per_rank_bytes": (world - 1) / world * (4 * P + 4 * P), "world": world})
    return rows


# ------------------------------------------------------------------------------------------ worker
class TorchDDPReducer:
    """The alternative to oblr's ``ddp`` mode: torch DDP's reducer sums the gradients (see module doc)."""

    name = "ddp_reducer"

    def __init__(self, book_keeping: bool):
        self.book_keeping = book_keeping

    def prepare(self, model):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        def sum_hook(state, bucket):  # DDP averages by default; the factors c_i already divide by the batch
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

        ddp = DDP(model)
        ddp.register_comm_hook(None, sum_hook)
        return ddp

    def grad_sink(self):
        return None

    def reduce_grads(self, params) -> None:
        if self.book_keeping:  # hand the book-keeping gradient to DDP's reducer through its autograd hooks
            params = [p for p in params if p.grad is not None]
            grads = [p.grad for p in params]
            for p in params:
                p.grad = None
            torch.autograd.backward(params, grads)


def _worker(args) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from oblr.distributed import (
        data_parallel_gradient,
        init_distributed,
        make_parallel,
        row_slice,
        shard_rows,
    )
    from oblr.update import UpdateSettings, accumulate_policy_gradient

    torch.set_num_threads(1)
    if args.malloc == "retain":
        from step_cost import retain_freed_memory

        retain_freed_memory()
    env = init_distributed("gloo", "cpu")
    case = QUICK if args.quick else CASE
    batch, rewards = build_batch(case)
    N, G = rewards.shape
    mine = shard_rows(batch, row_slice(N, G, env.world_size, env.rank))
    my_rewards = rewards[row_slice(N, 1, env.world_size, env.rank)]
    methods = [m for m in args.methods.split(",")]
    full = lambda t: (t.full_tensor() if isinstance(t, DTensor) else t).detach().float().reshape(-1)  # noqa: E731

    def settings(m):
        baseline, snr = METHODS[m]
        return UpdateSettings(baseline=baseline, aggregation="seq_sum_const", max_len=case.response_len,
                              need_snr=snr)

    runs = {}  # (method, variant) -> (model, optimizer, parallel)
    for m in methods:
        model = build_model(case)
        runs[(m, "1 process")] = (model, torch.optim.SGD(model.parameters(), lr=0.0), None)
        for v in VARIANTS:
            par = TorchDDPReducer(METHODS[m][1]) if v == "ddp_reducer" else make_parallel(v)
            model = par.prepare(build_model(case))
            runs[(m, v)] = (model, torch.optim.SGD(model.parameters(), lr=0.0), par)

    def step(key):
        m, (model, opt, par) = key[0], runs[key]
        opt.zero_grad(set_to_none=True)
        if par is None:
            res = accumulate_policy_gradient(model, batch, rewards, settings(m))
            gsq = sum(p.grad.double().pow(2).sum() for p in model.parameters())
            out = (res.per_prompt_sq_norms, gsq)
        else:
            up = data_parallel_gradient(model, mine, my_rewards, settings(m), par)
            out = (up.update.per_prompt_sq_norms, up.grad_sq)
        opt.step()
        return out

    def timed(key) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if key[1] != "1 process" or env.rank == 0:
            step(key)
        dist.barrier()
        return time.perf_counter() - t0

    # warm-up + exactness: every variant against the 1-process step of this run
    errors = {}
    for m in methods:
        ref_gk, ref_sq = step((m, "1 process")) if env.rank == 0 else (None, None)
        ref_grads = [full(p.grad) for p in runs[(m, "1 process")][0].parameters()] if env.rank == 0 else None
        dist.barrier()
        for v in VARIANTS:
            gk, sq = step((m, v))
            grads = [full(p.grad) for p in runs[(m, v)][0].parameters()]
            if env.rank == 0:
                err = max(float((a - b).norm() / b.norm()) for a, b in zip(grads, ref_grads))
                if gk is not None:
                    err = max(err, float((gk - ref_gk).norm() / ref_gk.norm()))
                errors[f"{m}/{v}"] = max(err, abs(float(sq) - float(ref_sq)) / float(ref_sq))
    reduction_only = {c.name: _reduction_only(c, args.reduce_repeats, env.rank)
                      for c in ([case] if args.quick else [case, REDUCE_CASE])}
    keys = [(m, v) for m in methods for v in ("1 process", *VARIANTS)]
    times: dict = {f"{m}/{v}": [] for m, v in keys}
    for r in range(args.repeats):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[f"{key[0]}/{key[1]}"].append(timed(key))
        if env.rank == 0:
            print(f"  round {r + 1}/{args.repeats}: " + ", ".join(f"{k} {t[-1]:.3f}s" for k, t in times.items()),
                  file=sys.stderr, flush=True)
    if env.rank == 0:
        n_params = sum(p.numel() for p in runs[(methods[0], "1 process")][0].parameters())
        Path(args.worker).write_text(json.dumps({"case": case.name, "params": n_params, "errors": errors,
                                                 "times": times, "world": env.world_size,
                                                 "reduction_only": reduction_only}))
    dist.destroy_process_group()


def _reduction_only(case: Case, repeats: int, rank: int) -> dict:
    """The book-keeping gradient's reduction alone, ``ddp`` vs ``ddp_reducer``, interleaved: every call
    starts from the same random ``.grad`` (for ``ddp_reducer`` after an untimed one-token forward through
    the DDP wrapper, which DDP needs before its hooks act). Returns the parameter count and the times."""
    import torch.distributed as dist

    from oblr.distributed import make_parallel

    runs = {"ddp": make_parallel("ddp"), "ddp_reducer": TorchDDPReducer(book_keeping=True)}
    runs = {v: (par.prepare(build_model(case)), par) for v, par in runs.items()}
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(p.shape, generator=gen) for p in runs["ddp"][0].parameters()]
    out: dict = {"params": sum(g.numel() for g in grads), "ddp": [], "ddp_reducer": []}
    for r in range(repeats):
        for v in (("ddp", "ddp_reducer") if r % 2 == 0 else ("ddp_reducer", "ddp")):
            model, par = runs[v]
            if v == "ddp_reducer":
                model(input_ids=torch.zeros(1, 1, dtype=torch.long))
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            dist.barrier()
            t0 = time.perf_counter()
            par.reduce_grads(list(model.parameters()))
            out[v].append(time.perf_counter() - t0)
    return out


# ------------------------------------------------------------------------------------------ report
def markdown(res: dict, comm: list[dict], header: str) -> str:
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    lines = [header, "", f"**{res['case']}** ({res['params'] / 1e6:.2f}M parameters), global batch split over "
             f"{res['world']} processes", "",
             "| method | variant | step time (s, median) | steps/s | speed-up vs 1 process | scaling efficiency | "
             "max rel. error vs 1 process |", "|---|---|---:|---:|---:|---:|---:|"]
    for m in dict.fromkeys(k.split("/")[0] for k in med):
        one = med[f"{m}/1 process"]
        lines.append(f"| {m} | 1 process | {one:.3f} | {1 / one:.2f} | 1.00 | - | - |")
        for v in VARIANTS:
            t = med[f"{m}/{v}"]
            lines.append(f"| {m} | 2 processes, {v} | {t:.3f} | {1 / t:.2f} | {one / t:.2f} | "
                         f"{one / t / res['world']:.2f} | {res['errors'][f'{m}/{v}']:.1e} |")
    lines += ["", "The book-keeping gradient's reduction alone (2 processes, interleaved calls from the same "
              "random fp32 `.grad`):", "", "| model | parameters | calls | ddp: bucketed all-reduce (ms, median) | "
              "ddp_reducer: torch DDP reducer (ms, median) | ddp_reducer / ddp |", "|---|---:|---:|---:|---:|---:|"]
    for name, ro in res["reduction_only"].items():
        a, b = statistics.median(ro["ddp"]), statistics.median(ro["ddp_reducer"])
        lines.append(f"| {name.split(';')[0]} | {ro['params'] / 1e6:.2f}M | {len(ro['ddp'])} | {a * 1e3:.1f} | "
                     f"{b * 1e3:.1f} | {b / a:.2f} |")
    lines += ["", f"Communication per step, from the parameter shapes (W = {comm[0]['world']} ranks, payload = "
              "size of the reduced tensors; per rank = ring traffic each rank sends):", "",
              "| model | parameters | ddp all-reduce (fp32 grad) | ddp per rank | fsdp reduce-scatter (fp32 grad) "
              "| fsdp all-gathers (bf16 params, fwd + bwd) | fsdp per rank |", "|---|---:|---:|---:|---:|---:|---:|"]
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731
    for c in comm:
        lines.append(f"| {c['model']} | {c['params'] / 1e9:.3f} B | {gb(c['ddp_allreduce_bytes'])} | "
                     f"{gb(c['ddp_per_rank_bytes'])} | {gb(c['fsdp_reduce_scatter_bytes'])} | "
                     f"{gb(c['fsdp_allgather_bytes'])} | {gb(c['fsdp_per_rank_bytes'])} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = {k: statistics.median(v) for k, v in res["times"].items()}
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh(list(med)[::-1], [1 / t for t in med.values()][::-1], color="tab:blue")
    ax.set_xlabel("steps per second (same global batch)")
    ax.set_title(f"1 vs {res['world']} processes, CPU gloo, 1 thread each")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny case, to check that everything runs")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; quick 2)")
    ap.add_argument("--methods", default="oblr,grpo", help="comma-separated: oblr (book-keeping) and/or grpo")
    ap.add_argument("--reduce-repeats", type=int, default=40, help="calls of the reduction-only comparison")
    ap.add_argument("--malloc", choices=("retain", "default"), default="retain", help="as in step_cost.py")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    if set(args.methods.split(",")) - set(METHODS):
        ap.error(f"--methods: known methods are {', '.join(METHODS)}")
    if args.worker:
        _worker(args)
        return 0
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"oblr-scaling-{os.getpid()}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
           "--worker", str(out), "--repeats", str(args.repeats), "--methods", args.methods, "--malloc", args.malloc,
           "--reduce-repeats", str(args.reduce_repeats)]
    if args.quick:
        cmd.append("--quick")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], file=sys.stderr)
        return proc.returncode
    res = json.loads(out.read_text())
    out.unlink()
    comm = comm_table(QWEN3)
    header = (f"torch {torch.__version__}, {os.cpu_count()} CPU cores, gloo, 1 thread per process, median of "
              f"{args.repeats} interleaved rounds after 1 warm-up; total {time.perf_counter() - t0:.0f} s; "
              f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    table = markdown(res, comm, header)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({**res, "comm": comm}, indent=2) + "\n")
    if args.plot:
        plot(res, args.plot)
    worst = max(res["errors"].values())
    print(f"exactness: max relative error vs 1 process {worst:.1e}")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
