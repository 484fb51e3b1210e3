"""S and V in Adam's metric, measured: does ``S_D / V_D`` (the signal and noise of the step Adam takes) equal
the Euclidean ``S / V`` that ``snr`` and ``snr_adam`` use?

``snr_adam`` (docs/algorithm.md) needs ``S_D = ||D G||^2`` and ``V_D = tr(D^2 Sigma)`` with
``D = diag(1/(sqrt(vhat) + eps))`` Adam's denominator, and uses the Euclidean S and V in their place (the
gradient's noise spread over coordinates like its signal). This script measures both on real states: for each
run folder it resumes the run's newest checkpoint (weights and AdamW state) in a scratch copy, draws the next
step's batch exactly as training would (``N x G`` rollouts, the run's own prompts and seed), and forms each
prompt's gradient ``g_k`` by its own backward (``oblr.update.accumulate_policy_gradient`` on that prompt's
rows, with the whole batch's loss factors). From the ``g_k`` it computes, with :func:`oblr.snr.snr_statistics`
in both metrics, over ``--batches`` independent batches at the same weights (their signal and V averaged, as
the EMA default averages over steps), ``N signal / V`` (Euclidean), ``N signal_D / V_D`` (Adam's) and the same with one number per tensor
(``1/(sqrt(mean vhat) + eps)``: what a per-parameter weight on the engine's norm totals could give), and the
factors each rule would apply (unclamped ratios; the factors clamp the averaged signal at 0).
The per-prompt Euclidean norms are checked against the exact-norm engine's ``per_prompt_sq_norms`` of the same
batch (one backward for all prompts) before anything is reported.

    python benchmarks/adam_metric_snr.py RUN_DIR [RUN_DIR ...] --out benchmarks/results/paper-regime/adam-metric

Writes ``adam_metric.json`` (one record per run) and ``adam_metric.md`` (the table). One thread; a run of
the paper's regime (1,024 sequences) takes a few minutes here. The runs are not changed (scratch copies).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch


def adam_denominator(optimizer) -> dict:
    """``({param: D}, {param: d_p}, steps)``: ``D = 1/(sqrt(exp_avg_sq / (1 - beta2^step)) + eps)`` from an
    Adam-family optimizer's state (the denominator of the step it takes next), ``d_p = 1/(sqrt(mean_p vhat) + eps)``
    one number per tensor (a block-constant metric, which per-parameter norm totals could carry), and the
    state's step count."""
    out, block, steps = {}, {}, set()
    for group in optimizer.param_groups:
        beta2, eps = group["betas"][1], group["eps"]
        for p in group["params"]:
            st = optimizer.state.get(p)
            if not st or "exp_avg_sq" not in st:
                raise SystemExit("adam_metric_snr: the checkpoint's optimizer has no Adam state (exp_avg_sq): an "
                                 "AdamW run that took at least one step is needed")
            k = int(st["step"])
            steps.add(k)
            vhat = st["exp_avg_sq"].double() / (1 - beta2**k)
            out[p] = 1.0 / (vhat.sqrt() + eps)
            block[p] = 1.0 / (float(vhat.mean()) ** 0.5 + eps)  # one number per tensor: its RMS second moment
    return out, block, max(steps)


def rows_of(batch, k0: int, k1: int, group_size: int):
    """The rows of prompts k0..k1-1 of a rollout batch (prompt-major rows), as a batch of its own."""
    rows = slice(k0 * group_size, k1 * group_size)
    kw = {}
    for f in dataclasses.fields(batch):
        v = getattr(batch, f.name)
        if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch.input_ids.shape[0]:
            v = v[rows]
        elif isinstance(v, list):
            v = v[rows]
        kw[f.name] = v
    kw["group_ids"] = kw["group_ids"] - k0
    return type(batch)(**kw)


def metric_statistics(per_prompt_grads, weights: list | None):
    """(``sum_k ||g_k||_M^2`` as [N], ``||gbar||_M^2``) in the metric ``M = diag(weights)`` (None: Euclidean);
    ``per_prompt_grads``: one list of per-parameter tensors per prompt."""
    n = len(per_prompt_grads)
    sq = torch.zeros(n, dtype=torch.float64)
    total = None
    for k, grads in enumerate(per_prompt_grads):
        acc = torch.zeros((), dtype=torch.float64)
        for i, g in enumerate(grads):
            acc += (g * g * (weights[i] if weights is not None else 1.0)).sum()
        sq[k] = acc
        total = [g.clone() for g in grads] if total is None else [t + g for t, g in zip(total, grads)]
    mean_sq = sum(((t / n) ** 2 * (weights[i] if weights is not None else 1.0)).sum() for i, t in enumerate(total))
    return sq, mean_sq


def _ratio(n: int, signal: float, V: float) -> float:
    """``n signal / V``; NaN when V <= 0 (no reward variance in the batch)."""
    return n * signal / V if V > 0 else math.nan


def measure(run: Path, batches: int = 4) -> dict:
    """The record of one run folder (see the module docstring)."""
    from oblr.config import load_config
    from oblr.losses import BatchTotals
    from oblr.rollout import generate_and_score
    from oblr.snr import momentum_noise_share, snr_factor, snr_statistics
    from oblr.tasks.base import step_prompt_indices
    from oblr.train.trainer import Trainer
    from oblr.update import accumulate_policy_gradient

    if not (run / "checkpoints" / "LATEST").is_file():
        raise SystemExit(f"adam_metric_snr: {run} has no checkpoint (checkpoints/LATEST)")
    with tempfile.TemporaryDirectory(prefix="adam-metric-") as tmp:
        scratch = Path(tmp) / run.name
        shutil.copytree(run, scratch, ignore=shutil.ignore_patterns("samples", "plots"))
        cfg = load_config(str(scratch / "config.yaml"), [f"train.output_dir={scratch}", "train.threads=1",
                                                          "train.plots=false"])
        if cfg.optim.optimizer != "adamw":
            raise SystemExit(f"adam_metric_snr: {run} is a {cfg.optim.optimizer} run; Adam's metric needs adamw")
        tr = Trainer(cfg, resume=True, quiet=True)
        tr._setup()  # what Trainer.run does first: the model, the restored optimizer state, the task, the engine
        step = tr.start_step
        N, G = cfg.rollout.prompts_per_step, cfg.rollout.group_size
        params = [p for p in tr.model.parameters() if p.requires_grad]
        D, block, adam_steps = adam_denominator(tr.optimizer)
        weights = [D[p] ** 2 for p in params]
        block_weights = [torch.full_like(D[p], block[p] ** 2) for p in params]
        settings = dataclasses.replace(tr.settings, need_snr=True, micro_batch_groups=0)
        one = dataclasses.replace(settings, need_snr=False)
        per_batch, worst, seconds, rewards_mean = [], 0.0, 0.0, []
        for b in range(batches):  # independent batches at the same weights: the prompts of steps step .. step+b
            order = step_prompt_indices(cfg.train.seed, step + b, len(tr.task.train), N)
            examples = [tr.task.train[i] for i in order[:N]]
            tr.model.eval()
            batch, rewards = generate_and_score(tr.engine, examples, tr.score, num_samples=G,
                                                max_new_tokens=cfg.rollout.max_new_tokens,
                                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
            rewards = rewards.view(N, G)
            rewards_mean.append(float(rewards.float().mean()))
            tr.model.train()
            # the engine's exact per-prompt norms of the whole batch (one backward): the check
            tr.optimizer.zero_grad(set_to_none=True)
            whole = accumulate_policy_gradient(tr.model, batch, rewards, settings, ref_model=tr.ref_model)
            engine_sq = whole.per_prompt_sq_norms.double()
            totals = BatchTotals.of(batch.response_mask.float())
            grads = []
            t0 = time.perf_counter()
            for k in range(N):
                tr.optimizer.zero_grad(set_to_none=True)
                accumulate_policy_gradient(tr.model, rows_of(batch, k, k + 1, G), rewards[k:k + 1], one,
                                           ref_model=tr.ref_model, totals=totals)
                grads.append([N * p.grad.double() if p.grad is not None else torch.zeros_like(p, dtype=torch.float64)
                              for p in params])
            seconds += time.perf_counter() - t0
            sq_e, mean_e = metric_statistics(grads, None)
            live = engine_sq > 0
            rel = float(((sq_e - engine_sq).abs()[live] / engine_sq[live]).max()) if live.any() else 0.0
            if not (rel < 1e-3 and bool((sq_e[~live] == 0).all())):
                raise SystemExit(f"adam_metric_snr: per-prompt norms disagree with the engine's (max rel {rel:.2e})")
            worst = max(worst, rel)
            sq_d, mean_d = metric_statistics(grads, weights)
            sq_b, mean_b = metric_statistics(grads, block_weights)
            st_e, st_d, st_b = (snr_statistics(sq_e, mean_e, N), snr_statistics(sq_d, mean_d, N),
                                snr_statistics(sq_b, mean_b, N))
            per_batch.append({"signal_euclid": float(st_e.signal), "V_euclid": float(st_e.V),
                              "signal_adam": float(st_d.signal), "V_adam": float(st_d.V),
                              "signal_block": float(st_b.signal), "V_block": float(st_b.V)})
        mean = {k: sum(r[k] for r in per_batch) / batches for k in per_batch[0]}
        beta1 = tr.optimizer.param_groups[0]["betas"][0]
        kappa = momentum_noise_share(beta1, adam_steps + 1)
        S_e, V_e = max(mean["signal_euclid"], 0.0), mean["V_euclid"]
        S_d, V_d = max(mean["signal_adam"], 0.0), mean["V_adam"]
        rec = {"run": f"{run.parent.name}/{run.name}", "task": cfg.task.name, "method": cfg.algorithm.lr_schedule,
               "baseline": cfg.algorithm.baseline, "lr": cfg.optim.lr, "step": step, "n": N, "g": G,
               "batches": batches, "reward_mean": sum(rewards_mean) / batches, "per_prompt_seconds": seconds,
               "engine_check_max_rel": worst, "per_batch": per_batch, **mean,
               "nsnr_euclid": _ratio(N, mean["signal_euclid"], V_e), "nsnr_adam": _ratio(N, mean["signal_adam"], V_d),
               "nsnr_block": _ratio(N, mean["signal_block"], mean["V_block"]),
               "nsnr_euclid_batches": [_ratio(N, r["signal_euclid"], r["V_euclid"]) for r in per_batch],
               "nsnr_adam_batches": [_ratio(N, r["signal_adam"], r["V_adam"]) for r in per_batch],
               "kappa": kappa,
               "factor_snr": snr_factor(S_e, V_e, N), "factor_snr_adam": snr_factor(S_e, kappa * V_e, N),
               "factor_adam_metric": snr_factor(S_d, kappa * V_d, N),
               "factor_block_metric": snr_factor(max(mean["signal_block"], 0.0), kappa * mean["V_block"], N)}
        tr.logger.close() if hasattr(tr.logger, "close") else None
        return rec


def table(records: list[dict]) -> str:
    head = ("| run | task | step | reward | N signal / V (Euclidean) | N signal_D / V_D (Adam's metric) | ratio | "
            "per tensor (RMS vhat) | per batch: Euclidean / Adam's | paper's factor | snr_adam's factor | "
            "snr_adam's factor in Adam's metric | in the per-tensor metric |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in records:
        ratio = r["nsnr_adam"] / r["nsnr_euclid"] if r["nsnr_euclid"] and r["nsnr_euclid"] > 0 else math.nan
        lines.append(f"| {r['run']} | {r['task']} | {r['step']} | "
                     f"{r['reward_mean']:.3f} | {r['nsnr_euclid']:.3g} | {r['nsnr_adam']:.3g} | {ratio:.3g} | "
                     f"{r['nsnr_block']:.3g} | "
                     f"{' '.join(f'{x:.2g}' for x in r['nsnr_euclid_batches'])} / "
                     f"{' '.join(f'{x:.2g}' for x in r['nsnr_adam_batches'])} | "
                     f"{r['factor_snr']:.3f} | {r['factor_snr_adam']:.3f} | {r['factor_adam_metric']:.3f} | "
                     f"{r['factor_block_metric']:.3f} |")
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders of AdamW runs with a checkpoint")
    ap.add_argument("--out", type=Path, required=True, help="folder for adam_metric.json and adam_metric.md")
    ap.add_argument("--batches", type=int, default=4, help="independent batches per run (S, V averaged over them)")
    args = ap.parse_args(argv)
    if args.batches < 1:
        raise SystemExit("adam_metric_snr: --batches must be at least 1")
    torch.set_num_threads(1)
    missing = [str(r) for r in args.runs if not (r / "config.yaml").is_file()]
    if missing:
        raise SystemExit(f"adam_metric_snr: not run folders (no config.yaml): {', '.join(missing)}")
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    for i, run in enumerate(args.runs, 1):
        print(f"[adam-metric] {i}/{len(args.runs)} {run}", file=sys.stderr, flush=True)
        records.append(measure(run, args.batches))
        (args.out / "adam_metric.json").write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
        (args.out / "adam_metric.md").write_text(table(records), encoding="utf-8")
    print(table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
