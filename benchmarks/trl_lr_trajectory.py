"""Why the native OBLR-PO's SNR learning rate sits below OBLRGRPOTrainer's in the TRL head-to-head.

Three measurements on the ``benchmarks/trl_h2h.py`` protocol (built-in start model, arithmetic task, 16 prompts x
8 completions, 32 new tokens, AdamW betas (0.9, 0.99), clip 1.0, SNR rule with eta_max ``--lr`` and the default
EMA 0.9 on both paths):

1. per-step statistics: ``oblr train`` (OBLR-PO, SNR rule) for ``--steps`` steps per seed, recording the
   unclamped signal ``||gbar||^2 - V/N``, V and N each step exactly as the schedule receives them (a recording
   schedule registered through :func:`oblr.schedules.register_schedule`) and the lr it sets; ``OBLRGRPOTrainer``
   (as ``trl_h2h.py``'s ``trl-oblr-snr``) for ``--trl-steps`` steps per seed, the same from its ``oblr/`` log;
2. replay: each run's (signal, V, N) sequence through an independent EMA controller written here
   (:func:`replay_lr`); the largest difference to the lr the run logged says whether the two paths turn
   statistics into a learning rate the same way;
3. (``--bf16-batches K``) bf16: OBLRGRPOTrainer runs under TRL's default ``bf16=True``, which accelerate applies
   on the CPU too (the update core's forward in ``torch.autocast(bfloat16)``); ``oblr train`` runs in float32.
   K batches from the start model (oblr's engine), each through the update core twice, float32 and under bf16
   autocast: the paired differences of the signal, V and ||gbar||^2, and the cosine of the two gradients;
4. forced start: ``oblr train`` with its first ``--trl-steps`` learning rates set to the TRL run's logged ones
   (same seed; the rule's EMA still sees every step's statistics) and the rule free afterwards. Its statistics in
   the forced stretch against the TRL run's say whether, on the same lr path, the native statistics are TRL's;
   its lr after the stretch against the free native run's says whether the early lr decides the later one.

Writes ``OUT/summary.md`` and ``OUT/results.json``; with no ``--seeds``, only the bf16 pairing runs.

    python benchmarks/trl_lr_trajectory.py --seeds 0 --extra-seeds 2 3 --steps 45 --trl-steps 30 --out benchmarks/results/trl_h2h/lr_trajectory
    python benchmarks/trl_lr_trajectory.py --seeds --bf16-batches 6 --out benchmarks/results/trl_h2h/lr_trajectory_bf16
"""

from __future__ import annotations

import argparse
import json
import math
import statistics as st
import time
from pathlib import Path

RECORD: list[dict] = []      # filled by the recording schedule, one entry per optimizer step
FORCED: list[float] = []     # learning rates the recording schedule sets instead of the rule's (first steps)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", nargs="*", type=int, default=[0])
    p.add_argument("--bf16-batches", type=int, default=0, help="batches of the float32 / bf16-autocast pairing")
    p.add_argument("--steps", type=int, default=60, help="steps of the native runs (free and forced)")
    p.add_argument("--trl-steps", type=int, default=30, help="steps of the TRL runs = forced steps of the native run")
    p.add_argument("--extra-seeds", nargs="*", type=int, default=[],
                   help="more seeds of the free native run only (the rule's spread over seeds)")
    p.add_argument("--lr", type=float, default=1e-3, help="eta_max of the SNR rule")
    p.add_argument("--ema", type=float, default=0.9, help="EMA of the SNR rule (both paths' default)")
    p.add_argument("--out", default="runs/trl_lr_trajectory")
    p.add_argument("--render-only", action="store_true", help="rewrite OUT/summary.md from OUT/results.json")
    a = p.parse_args(argv)
    if a.bf16_batches == 1 or a.bf16_batches < 0:
        p.error(f"--bf16-batches must be 0 or at least 2 (a standard error needs two), got {a.bf16_batches}")
    if a.trl_steps < 1 or a.steps < a.trl_steps:
        p.error(f"need 1 <= --trl-steps <= --steps, got --trl-steps {a.trl_steps}, --steps {a.steps}")
    return a


def replay_lr(seq, eta_max: float, ema: float) -> tuple[list[float], list[float]]:
    """(lr, smoothed signal) per step of the SNR rule from (signal, V, N) per step, written from its definition:
    EMA of the unclamped signal and V with bias correction 1 - ema^k, clamped at 0 afterwards,
    lr = eta_max * S / (S + V/N) (0 when S = V = 0)."""
    s = v = 0.0
    lrs, smooth = [], []
    for k, (sig, V, n) in enumerate(seq, 1):
        s, v = ema * s + (1 - ema) * sig, ema * v + (1 - ema) * V
        corr = 1 - ema**k
        S, VV = max(s / corr, 0.0), max(v / corr, 0.0)
        den = S + VV / n
        lrs.append(eta_max * S / den if den > 0 else 0.0)
        smooth.append(s / corr)
    return lrs, smooth


def _register_recording_schedule() -> None:
    from oblr.schedules import SCHEDULES, SNRSchedule, register_schedule

    if "snr_recorded" in SCHEDULES.names():
        return

    @register_schedule("snr_recorded")
    class RecordedSNR(SNRSchedule):
        """The ``snr`` schedule; records each step's statistics and, for the first ``len(FORCED)`` steps, sets
        the forced lr instead of the rule's (the rule's EMA is updated either way)."""

        def __init__(self, optimizer, *, lr, eta_min=0.0, warmup_steps=0, total_steps=1, ema=0.0):
            super().__init__(optimizer, lr=lr, eta_min=eta_min, warmup_steps=warmup_steps, total_steps=total_steps,
                             ema=ema)
            self.optimizer, self._forced = optimizer, None

        def step(self, stats=None) -> None:
            super().step(stats)
            k = len(RECORD)
            self._forced = FORCED[k] if k < len(FORCED) else None
            if self._forced is not None:
                for g in self.optimizer.param_groups:
                    g["lr"] = self._forced
            RECORD.append({"signal": float(stats.signal), "V": float(stats.V), "n": stats.n,
                           "lr": self.get_last_lr()[0], "rule_lr": self.inner.get_last_lr()[0]})

        def get_last_lr(self) -> list[float]:
            return [self._forced] * len(self.optimizer.param_groups) if self._forced is not None else super().get_last_lr()


def native_run(seed: int, steps: int, a, out: Path, forced: list[float] | None = None) -> dict:
    """``oblr train`` as ``trl_h2h.py``'s ``native-oblr-snr`` (the ``snr`` rule, recorded; ``forced``: first lrs)."""
    import torch

    from oblr.config import load_config
    from oblr.train import train

    _register_recording_schedule()
    RECORD.clear()
    FORCED[:] = forced or []
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    run_dir = out / "run"
    cfg = load_config(None, ["model.name_or_path=builtin", "task.name=arithmetic", f"train.steps={steps}",
                             f"train.seed={seed}", "rollout.prompts_per_step=16", "rollout.group_size=8",
                             "rollout.max_new_tokens=32", "optim.betas=[0.9,0.99]", "optim.weight_decay=0",
                             "optim.grad_clip=1.0", f"optim.lr={a.lr}", f"optim.snr_ema={a.ema}",
                             "algorithm.baseline=oblr", "algorithm.lr_schedule=snr_recorded", "train.eval_every=0",
                             "task.eval_size=0", f"train.save_every={steps}", "train.plots=false", "train.threads=1",
                             f"train.output_dir={run_dir}"])
    train(cfg, resume=False, quiet=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "optim/lr" in r]
    return {"steps": [{**rec, "logged_lr": r["optim/lr"], "grad_sq": r["optim/grad_norm"] ** 2,
                       "reward": r["train/reward_mean"], "entropy": r["train/entropy"]}
                      for rec, r in zip(RECORD, rows)]}


def trl_run(seed: int, steps: int, a, out: Path) -> dict:
    """``OBLRGRPOTrainer`` as ``trl_h2h.py``'s ``trl-oblr-snr``; per-step ``oblr/`` statistics from the log."""
    import torch

    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, task_dataset
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    task = get_task("arithmetic")
    model, tok = load_model_and_tokenizer("builtin")
    cfg = OBLRGRPOConfig(output_dir=str(out / "trainer"), per_device_train_batch_size=16 * 8, num_generations=8,
                         max_completion_length=32, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
                         seed=seed, use_cpu=True, disable_tqdm=True, loss_type="dr_grpo", beta=0.0,
                         lr_scheduler_type="constant", gradient_checkpointing=False, adam_beta2=0.99,
                         weight_decay=0.0, max_grad_norm=1.0, learning_rate=a.lr, oblr_snr_ema=a.ema)
    trainer = OBLRGRPOTrainer(model=model, reward_funcs=TaskReward(task), args=cfg,
                              train_dataset=task_dataset(task.train), processing_class=tok)
    trainer.train()
    hist = [h for h in trainer.state.log_history if "oblr/lr" in h]
    return {"steps": [{"signal": h["oblr/signal"], "V": h["oblr/V"], "n": int(h["oblr/n"]), "lr": h["oblr/lr"],
                       "logged_lr": h["oblr/lr"], "grad_sq": h["oblr/grad_norm"] ** 2, "reward": h["reward"],
                       "entropy": h["entropy"]} for h in hist], "bf16": bool(cfg.bf16)}


def bf16_pairs(batches: int) -> list[dict]:
    """Signal, V, ||gbar||^2 of the same batch through the update core in float32 and under bf16 autocast."""
    import random

    import torch

    from oblr.config import load_config
    from oblr.distributed.step import step_statistics
    from oblr.models import load_model_and_tokenizer
    from oblr.rollout import generate_and_score, make_engine
    from oblr.tasks import get_task, reward_scorer
    from oblr.update import UpdateSettings, accumulate_policy_gradient, trainable_params

    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    task = get_task("arithmetic")
    model, tok = load_model_and_tokenizer("builtin")
    settings = UpdateSettings.from_config(load_config(None, ["rollout.max_new_tokens=32"]), schedule_needs_snr=True)
    engine, score = make_engine("hf", model, tok), reward_scorer(task)

    def core(batch, rewards, autocast):
        for p in model.parameters():
            p.grad = None
        model.train()
        t0 = time.perf_counter()
        r = accumulate_policy_gradient(model, batch, rewards.reshape(16, 8), settings, autocast=autocast)
        gsq, st = step_statistics(trainable_params(model), r.per_prompt_sq_norms, float64=False)  # oblr train's
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
        return float(st.signal), float(st.V), float(gsq), grad, time.perf_counter() - t0

    out = []
    for k in range(batches):
        model.eval()
        batch, rewards = generate_and_score(engine, random.sample(task.train, 16), score, num_samples=8,
                                            max_new_tokens=32, temperature=1.0)
        f = core(batch, rewards, None)
        b = core(batch, rewards, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        out.append({"fp32": f[:3], "bf16": b[:3], "cos": float(torch.dot(f[3], b[3]) / (f[3].norm() * b[3].norm())),
                    "seconds": [f[4], b[4]]})
        print(f"[trl_lr_trajectory] bf16 pair {k + 1}/{batches}", flush=True)
    return out


def bf16_table(pairs: list[dict]) -> str:
    def ms(xs):
        return f"{st.mean(xs):.2e} ± {st.stdev(xs) / math.sqrt(len(xs)):.1e}"

    rows = ["| quantity | float32 mean | bf16 autocast mean | paired difference (bf16 - float32) mean ± se |",
            "|---|---:|---:|---:|"]
    for i, name in enumerate(("signal", "V", "gbar^2")):
        f, b = [p["fp32"][i] for p in pairs], [p["bf16"][i] for p in pairs]
        rows.append(f"| {name} | {st.mean(f):.3e} | {st.mean(b):.3e} | {ms([y - x for x, y in zip(f, b)])} |")
    cos = [p["cos"] for p in pairs]
    secs = [p["seconds"] for p in pairs]
    return (f"Same batch, two precisions ({len(pairs)} batches of 16 x 8 from the start model): cosine of the two "
            f"gradients {min(cos):.4f} to {max(cos):.4f}; update-core time {st.mean(s[0] for s in secs):.1f} s "
            f"(float32) and {st.mean(s[1] for s in secs):.1f} s (bf16 autocast) per batch on one CPU thread.\n\n"
            + "\n".join(rows) + "\n")


def describe(steps: list[dict], a, lo: int = 0, hi: int | None = None) -> dict:
    """Summary of steps[lo:hi] of one run, with the replay of the whole run through :func:`replay_lr`."""
    lrs, smooth = replay_lr([(s["signal"], s["V"], s["n"]) for s in steps], a.lr, a.ema)
    rule = [s.get("rule_lr", s["logged_lr"]) for s in steps]
    part = steps[lo:hi]
    sig = [s["signal"] for s in part]
    return {"steps": f"{lo + 1}-{lo + len(part)}", "mean_lr": st.mean(s["logged_lr"] for s in part),
            "zero_lr": sum(s["logged_lr"] == 0 for s in part),
            "signal_mean": st.mean(sig), "signal_se": st.stdev(sig) / math.sqrt(len(sig)) if len(sig) > 1 else 0.0,
            "signal_neg": sum(x < 0 for x in sig) / len(sig),
            "smoothed_neg": sum(x < 0 for x in smooth[lo:hi]) / len(sig),
            "V_mean": st.mean(s["V"] for s in part), "gbar_sq_mean": st.mean(s["grad_sq"] for s in part),
            "reward_mean": st.mean(s["reward"] for s in part),
            "replay_max_abs_diff": max(abs(x - y) for x, y in zip(lrs, rule))}


def render(a, runs: dict, pairs: list[dict]) -> str:
    """summary.md from the runs (``main``'s dict, or ``results.json``'s ``runs``) and the bf16 pairs."""
    K, T = a.trl_steps, a.steps
    head = ["| run | steps | mean lr | steps at lr 0 | raw signal mean ± se | raw signal < 0 | smoothed signal < 0 | "
            "V mean | gbar^2 mean | reward mean | replay max abs(lr diff) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    table = []
    for seed in a.seeds:
        for name, lo, hi in ((f"trl seed {seed}", 0, K), (f"native seed {seed}", 0, K),
                             (f"native forced seed {seed}", 0, K), (f"native seed {seed}", K, T),
                             (f"native forced seed {seed}", K, T)):
            d = describe(runs[name]["steps"], a, lo, hi)
            label = {"trl": "OBLRGRPOTrainer", "native": "oblr train"}[name.split()[0]]
            if "forced" in name:
                label += f", lr of steps 1-{K} forced to OBLRGRPOTrainer's" + ("" if lo < K else ", free after")
            table.append(f"| {label}, seed {seed} | {d['steps']} | {d['mean_lr']:.2e} | {d['zero_lr']} | "
                         f"{d['signal_mean']:.2e} ± {d['signal_se']:.1e} | {100 * d['signal_neg']:.0f} % | "
                         f"{100 * d['smoothed_neg']:.0f} % | {d['V_mean']:.3f} | {d['gbar_sq_mean']:.4f} | "
                         f"{d['reward_mean']:.3f} | {d['replay_max_abs_diff']:.1e} |")
    for seed in a.extra_seeds:
        for lo, hi in ((0, K), (K, T)):
            d = describe(runs[f"native seed {seed}"]["steps"], a, lo, hi)
            table.append(f"| oblr train, seed {seed} | {d['steps']} | {d['mean_lr']:.2e} | {d['zero_lr']} | "
                         f"{d['signal_mean']:.2e} ± {d['signal_se']:.1e} | {100 * d['signal_neg']:.0f} % | "
                         f"{100 * d['smoothed_neg']:.0f} % | {d['V_mean']:.3f} | {d['gbar_sq_mean']:.4f} | "
                         f"{d['reward_mean']:.3f} | {d['replay_max_abs_diff']:.1e} |")
    bf16 = any(r.get("bf16") for r in runs.values())
    return (f"Built-in model, arithmetic task, 16 prompts x 8 completions, 32 new tokens, SNR rule eta_max {a.lr:g}, "
            f"EMA {a.ema:g}, AdamW betas (0.9, 0.99), clip 1.0; seeds {a.seeds} (free oblr train also "
            f"{a.extra_seeds}); OBLRGRPOTrainer {K} steps"
            f"{' (TRL default bf16=True: bf16 autocast on CPU)' if bf16 else ''}, oblr train {T} steps. "
            f"'raw signal' is ||gbar||^2 - V/N of the step, 'smoothed' its bias-corrected EMA (the rule's S before "
            f"the clamp); 'replay' recomputes every step's lr from the logged (signal, V, N) with an independent "
            f"controller (`replay_lr`).\n\n" + "\n".join(head + table) + "\n"
            + ("\n" + bf16_table(pairs) if pairs else ""))


def _args(a) -> dict:
    return {k: v for k, v in vars(a).items() if k != "out"}  # no machine path in the committed output


def main(argv=None) -> dict:
    import os

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.render_only:
        res = json.loads((out / "results.json").read_text())
        md = render(a, res["runs"], res.get("bf16_pairs", []))
        (out / "summary.md").write_text(md)
        print(md)
        return res["runs"]
    runs = {}
    for seed in a.seeds:
        t0 = time.perf_counter()
        runs[f"native seed {seed}"] = native_run(seed, a.steps, a, out / f"native_seed{seed}")
        runs[f"trl seed {seed}"] = trl_run(seed, a.trl_steps, a, out / f"trl_seed{seed}")
        forced = [s["logged_lr"] for s in runs[f"trl seed {seed}"]["steps"]]
        runs[f"native forced seed {seed}"] = native_run(seed, a.steps, a, out / f"forced_seed{seed}", forced=forced)
        print(f"[trl_lr_trajectory] seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    for seed in a.extra_seeds:
        runs[f"native seed {seed}"] = native_run(seed, a.steps, a, out / f"native_seed{seed}")
    pairs = bf16_pairs(a.bf16_batches) if a.bf16_batches > 1 else []
    if not a.seeds:
        md = bf16_table(pairs) if pairs else ""
        (out / "summary.md").write_text(md)
        (out / "results.json").write_text(json.dumps({"args": _args(a), "bf16_pairs": pairs}, indent=1))
        print("\n" + md)
        return {"bf16_pairs": pairs}
    md = render(a, runs, pairs)
    (out / "summary.md").write_text(md)
    (out / "results.json").write_text(json.dumps({"args": _args(a), "runs": runs, "bf16_pairs": pairs}, indent=1))
    print("\n" + md)
    return runs


if __name__ == "__main__":
    main()
