"""Where one OBLR-PO update's time goes against one GRPO update, at the default ``oblr train`` shape, on CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/profile_update.py --reps 5 --out FILE.md
    git archive REV src | tar -x -C T && OMP_NUM_THREADS=1 PYTHONPATH=T/src python benchmarks/profile_update.py
                                                            # the same at another revision's src/

Builds the default run (built-in arithmetic task and tiny model, N = 16 prompts x G = 8, 32 new tokens, one
thread) twice from the config, as ``oblr train`` does: GRPO (``algorithm.baseline=grpo
algorithm.lr_schedule=constant``) and OBLR-PO (the defaults: baseline ``oblr``, SNR schedule, the one-pass engine);
the two start from the same seed, so the same weights. One batch is generated and scored by the GRPO run's
engine; each method's **update** is then what ``oblr train`` times as ``time/norms + time/update`` minus the
weight sync: ``zero_grad``, :func:`oblr.distributed.step.data_parallel_gradient` (the accumulation and the step's
statistics), the lr controller's step, gradient clipping and the optimizer step -- repeated ``--reps`` times on
the same batch (weights restored before each call, so every call sees the same numbers), the two methods
alternating, after one warm-up call each.

Reported (stdout, and ``--out`` as markdown): per method the median wall time per update (the machine may be
loaded: read the ratio, and the operator counts and self-time shares, rather than absolute times), the
top-level ``aten::`` operators dispatched per update (those not called from inside another ``aten::``
operator, as ``op_count.py`` counts), the operators by self CPU time (``torch.profiler``), and the Python
functions by own time and the parts of the update (oblr functions) by cumulative time (``cProfile``: where the
time outside operators goes; its own per-call cost inflates Python-heavy parts). Results:
``benchmarks/results/step_cost/issue41/tiny_profile.md``.
"""

from __future__ import annotations

import argparse
import collections
import copy
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

COMMON = ["train.threads=1", "task.eval_size=0", "train.eval_every=0", "train.save_every=0", "train.steps=4",
          "train.plots=false"]
METHODS = {"grpo": ["algorithm.baseline=grpo", "algorithm.lr_schedule=constant"],
           "oblr": ["algorithm.baseline=oblr", "algorithm.lr_schedule=snr"]}


def build(name: str, out_dir: Path):
    """A set-up :class:`oblr.train.trainer.Trainer` of the default run with method ``name``'s overrides."""
    from oblr.config import load_config
    from oblr.models import ensure_builtin_built
    from oblr.train.trainer import Trainer

    cfg = load_config(None, [*COMMON, *METHODS[name], f"train.output_dir={out_dir / name}"])
    t = Trainer(cfg, quiet=True)
    ensure_builtin_built(t._model_name(), distributed=False, local_rank=0, rank=0, timeout_s=600)
    t._setup()
    return t


def batch_of(t):
    """One generated and scored batch of the default shape (as ``Trainer.train_step`` makes it)."""
    from oblr.rollout import generate_and_score
    from oblr.tasks.base import step_prompt_indices

    cfg = t.cfg
    order = step_prompt_indices(cfg.train.seed, 0, len(t.task.train), cfg.rollout.prompts_per_step)
    examples = [t.task.train[i] for i in order]
    t.model.eval()
    with t.parallel.generation(t.model):
        batch, rewards = generate_and_score(t.engine, examples, t.score, num_samples=cfg.rollout.group_size,
                                            max_new_tokens=cfg.rollout.max_new_tokens,
                                            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
    return batch, rewards.view(cfg.rollout.prompts_per_step, cfg.rollout.group_size)


def update_fn(t, batch, rewards):
    """One update of trainer ``t`` on ``batch`` (module docstring), weights and optimizer state restored first."""
    from oblr.distributed.step import clip_grads_, data_parallel_gradient
    from oblr.params import trainable_params

    params = trainable_params(t.model)
    weights = [p.detach().clone() for p in params]
    opt_state = copy.deepcopy(t.optimizer.state_dict())
    ctrl_state = copy.deepcopy(t.lr_ctrl.__dict__)

    def fn():
        with torch.no_grad():
            for p, w in zip(params, weights):
                p.copy_(w)
        t.optimizer.load_state_dict(opt_state)
        t.lr_ctrl.__dict__.update(copy.deepcopy(ctrl_state))
        t.model.train()
        t.optimizer.zero_grad(set_to_none=True)
        up = data_parallel_gradient(t.model, batch, rewards, t.settings, t.parallel, ref_model=t.ref_model)
        t.lr_ctrl.step(up.snr)
        if t.cfg.optim.grad_clip > 0:
            clip_grads_(params, t.cfg.optim.grad_clip, up.grad_sq)
        t.optimizer.step()
        return up

    return fn


def top_level_ops(prof) -> collections.Counter:
    return collections.Counter(e.name for e in prof.events() if e.name.startswith("aten::")
                               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def profile(fn, reps: int):
    """(profiler of ``reps`` calls, top-level operator counts per call, cProfile stats of ``reps`` calls)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
    ops = top_level_ops(prof)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(reps):
        fn()
    pr.disable()
    return prof, ops, pr


def self_times(prof, reps: int, top: int) -> list[tuple[str, float, int]]:
    """(operator, self CPU ms per update, calls per update) of the ``top`` operators by self CPU time."""
    rows = [(e.key, e.self_cpu_time_total / 1e3 / reps, e.count // reps) for e in prof.key_averages()]
    return sorted(rows, key=lambda r: -r[1])[:top]


def py_own_times(pr, reps: int, top: int) -> list[tuple[str, float, int]]:
    """(function, own ms per update, calls per update) of the ``top`` Python functions by own time."""
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (file, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        where = file.split("/src/")[-1] if "/src/" in file else Path(file).name
        rows.append((f"{where}:{line}({func})", tt * 1e3 / reps, nc // reps))
    return sorted(rows, key=lambda r: -r[1])[:top]


def py_cum_times(pr, reps: int, names: list[str]) -> list[tuple[str, float, int]]:
    """(function, cumulative ms per update, calls per update) of the oblr functions whose name is in ``names``."""
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = []
    for (file, line, func), (cc, nc, tt, ct, callers) in st.stats.items():
        if "oblr" in file and func in names:
            rows.append((f"{file.split('/src/')[-1]}:{line}({func})", ct * 1e3 / reps, nc // reps))
    return sorted(rows, key=lambda r: -r[1])


#: the oblr functions whose cumulative time splits an OBLR-PO update into its parts
PARTS = ["accumulate_policy_gradient", "data_parallel_gradient", "step_statistics", "record", "backward",
         "_scored_logprobs", "forward_logits", "sq_norms", "accumulate_grad_with_group_norms", "_fold", "form_slabs",
         "_add", "estimate", "token_windows", "from_groups", "step", "clip_grads_", "_assemble", "total",
         "slab_sums", "grouped_sums", "regroup_for_products", "hook", "materialize", "fn", "_entropy_sum",
         "response_token_logprobs", "sequence_logprobs", "rule", "linear_rule", "embedding_rule"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="profiled updates per method (default 5)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None, help="markdown file to write")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="profile_update_") as tmp:
        trainers = {name: build(name, Path(tmp)) for name in METHODS}
        batch, rewards = batch_of(trainers["grpo"])
        fns = {name: update_fn(t, batch, rewards) for name, t in trainers.items()}
        for fn in fns.values():
            fn()  # warm-up
        walls = {name: [] for name in fns}
        for _ in range(args.reps):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                walls[name].append(time.perf_counter() - t0)
        res = {name: profile(fn, args.reps) for name, fn in fns.items()}
        for t in trainers.values():
            t.engine.close()
    rm = batch.response_mask
    lines = [f"`OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/profile_update.py {' '.join(argv or sys.argv[1:])}`",
             "",
             f"Batch: {rm.shape[0]} rows x {rm.shape[1]} positions, {int(rm.sum())} response tokens "
             f"(mean reward {float(rewards.float().mean()):.3f}); torch {torch.__version__}, "
             f"{torch.get_num_threads()} thread.", "",
             "| | GRPO | OBLR-PO | ratio |", "|---|---:|---:|---:|"]
    med = {n: statistics.median(w) * 1e3 for n, w in walls.items()}
    lines.append(f"| median wall ms / update ({args.reps} each, alternating; restore of weights included) | "
                 f"{med['grpo']:.1f} | {med['oblr']:.1f} | {med['oblr'] / med['grpo']:.2f} |")
    n_ops = {n: sum(r[1].values()) / args.reps for n, r in res.items()}
    lines.append(f"| top-level aten ops / update | {n_ops['grpo']:.0f} | {n_ops['oblr']:.0f} | "
                 f"{n_ops['oblr'] / n_ops['grpo']:.2f} |")
    cpu = {n: sum(e.self_cpu_time_total for e in r[0].key_averages()) / 1e3 / args.reps for n, r in res.items()}
    lines.append(f"| operator self CPU ms / update (profiler) | {cpu['grpo']:.1f} | {cpu['oblr']:.1f} | "
                 f"{cpu['oblr'] / cpu['grpo']:.2f} |")
    for name, (prof, ops, pr) in res.items():
        lines += ["", f"## {name}: operators by self CPU time (per update)", "",
                  "| operator | self ms | calls |", "|---|---:|---:|"]
        lines += [f"| {k} | {ms:.2f} | {c} |" for k, ms, c in self_times(prof, args.reps, args.top)]
        lines += ["", f"## {name}: top-level operators dispatched (per update)", "",
                  ", ".join(f"{op.removeprefix('aten::')} {c // args.reps}" for op, c in ops.most_common(args.top))]
        lines += ["", f"## {name}: Python functions by own time (cProfile, per update)", "",
                  "| function | own ms | calls |", "|---|---:|---:|"]
        lines += [f"| {f} | {ms:.2f} | {c} |" for f, ms, c in py_own_times(pr, args.reps, args.top)]
        lines += ["", f"## {name}: oblr functions by cumulative time (cProfile, per update)", "",
                  "| function | cum ms | calls |", "|---|---:|---:|"]
        lines += [f"| {f} | {ms:.2f} | {c} |" for f, ms, c in py_cum_times(pr, args.reps, PARTS)]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        args.out.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
