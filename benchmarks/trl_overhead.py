"""OBLRGRPOTrainer against plain GRPOTrainer inside TRL: whole-iteration time ratio and held-out accuracy.

Same model (a fresh copy of the same weights per run), data, seed, batch and sampling settings; GRPOTrainer
runs the same objective family (``loss_type='dr_grpo'``, ``beta=0``, ``scale_rewards='group'``: TRL's GRPO)
with a constant lr. The two trainers are alternated in one process (GRPO, OBLR, GRPO, OBLR, ...; ``--rounds``
pairs of ``--steps`` steps); every optimizer step is timed by a callback from ``on_step_begin`` to
``on_step_end`` (generation, rewards, norm pass, backward, optimizer step). The first step of each run is
dropped (warm-up). Prints one markdown table and writes ``--out`` (JSON).

    python benchmarks/trl_overhead.py                       # built-in model, CPU, 1 thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per run")
    p.add_argument("--rounds", type=int, default=2, help="alternated (GRPO, OBLR) pairs of runs")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-problems", type=int, default=50, help="held-out problems (x4 samples) after each run")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision (GPU)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/trl_overhead.json")
    return p.parse_args(argv)


def _step_timer():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self._t0)

    return StepTimer()


def run_once(kind: str, a, task, tokenizer_model) -> dict:
    import torch
    from trl import GRPOConfig, GRPOTrainer

    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, heldout_accuracy, task_dataset
    from oblr.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(tokenizer_model)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    common = dict(output_dir=f"runs/trl_overhead/{kind}", per_device_train_batch_size=a.prompts * a.num_generations,
                  num_generations=a.num_generations, max_completion_length=a.max_completion_length,
                  learning_rate=a.lr, max_steps=a.steps, logging_steps=1, save_strategy="no", report_to=[],
                  seed=a.seed, use_cpu=not torch.cuda.is_available(), bf16=a.bf16, disable_tqdm=True,
                  loss_type="dr_grpo", beta=0.0, lr_scheduler_type="constant", gradient_checkpointing=False)
    if kind == "grpo":
        cfg, cls = GRPOConfig(**common, scale_rewards="group"), GRPOTrainer
    else:
        cfg, cls = OBLRGRPOConfig(**common), OBLRGRPOTrainer
    timer = _step_timer()
    trainer = cls(model=model, reward_funcs=TaskReward(task), args=cfg, train_dataset=task_dataset(task.train),
                  processing_class=tok, callbacks=[timer])
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    acc = None
    if a.eval_problems:
        acc = heldout_accuracy(trainer.model, tok, task, n_problems=a.eval_problems,
                               max_new_tokens=a.max_completion_length, seed=a.seed + 12345)
    norms = [h["oblr/time_norms"] for h in trainer.state.log_history if "oblr/time_norms" in h]
    return {"kind": kind, "step_times": timer.times, "accuracy": acc, "norm_pass_times": norms, "peak_mib": peak}


def main(argv=None) -> dict:
    a = parse_args(argv)
    import torch

    from oblr.tasks import get_task

    torch.set_num_threads(a.threads)
    task = get_task("arithmetic", seed=a.seed)
    runs = []
    for r in range(a.rounds):
        for kind in ("grpo", "oblr"):
            res = run_once(kind, a, task, a.model)
            runs.append(res)
            print(f"[trl_overhead] round {r + 1}/{a.rounds} {kind}: median step "
                  f"{statistics.median(res['step_times'][1:]):.3f} s, held-out accuracy {res['accuracy']}", flush=True)

    def steps(kind):
        return [t for x in runs if x["kind"] == kind for t in x["step_times"][1:]]

    g, o = statistics.median(steps("grpo")), statistics.median(steps("oblr"))
    peak = {k: max((x["peak_mib"] or 0.0) for x in runs if x["kind"] == k) or None for k in ("grpo", "oblr")}
    norm = statistics.median([t for x in runs if x["kind"] == "oblr" for t in x["norm_pass_times"][1:]])
    acc = {k: [x["accuracy"] for x in runs if x["kind"] == k] for k in ("grpo", "oblr")}
    summary = {"args": vars(a), "median_step_s": {"grpo": g, "oblr": o}, "ratio": o / g,
               "oblr_norm_pass_median_s": norm, "peak_mib": peak, "accuracy": acc, "runs": runs}
    print(f"\n{a.prompts} prompts x {a.num_generations} completions, {a.max_completion_length} new tokens, "
          f"{a.steps} steps x {a.rounds} alternated rounds, {a.threads} thread(s)\n")
    print("| trainer | step time (s, median) | time / GRPO | held-out accuracy after each run |")
    print("|---|---:|---:|---|")
    print(f"| GRPOTrainer (dr_grpo, scale_rewards=group) | {g:.3f} | 1.00 | {acc['grpo']} |")
    print(f"| OBLRGRPOTrainer (oblr baseline, SNR lr) | {o:.3f} | {o / g:.2f} | {acc['oblr']} |")
    if peak["grpo"]:
        print(f"\npeak GPU memory (MiB): GRPOTrainer {peak['grpo']:.0f}, OBLRGRPOTrainer {peak['oblr']:.0f} "
              f"({peak['oblr'] / peak['grpo']:.2f}x)")
    print(f"\nOBLR norm pass (forward + activation-only backward + folded gradient), median: {norm:.3f} s/step")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
