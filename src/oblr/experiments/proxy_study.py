"""How closely do the forward-only proxies of w_i track the exact gradient norms, and does it matter?

For one model and one batch of rollouts (N prompts x G outputs, rows prompt-major):

- exact ``w_i = c_i^2 ||s_i||^2`` (:func:`oblr.gradnorm.sequence_grad_sq_norms`, scaled by the loss
  aggregation's per-sequence factor ``c_i`` exactly as :mod:`oblr.update` does), and the proxies
  ``length`` (:func:`oblr.gradnorm.length_weights`) and ``logit_energy``
  (:func:`oblr.gradnorm.logit_energy_weights`), unscaled as in training;
- per group, the Spearman rank correlation between exact w and each proxy (ties get average ranks;
  NaN where either is constant within the group);
- the leave-one-out weighted baselines ``b_i = sum_{j!=i} w_j F_j / sum_{j!=i} w_j`` (estimator ``oblr``)
  computed with each weight, and the uniform one (``rloo``); their mean absolute difference to the exact
  baseline over the outputs of *informative* groups (rewards not all equal; elsewhere every weighting
  gives the same baseline), and ``captured = 1 - sum|b_proxy - b_exact| / sum|b_uniform - b_exact|``:
  the share of the exact weighting's move away from the uniform mean that the proxy reproduces
  (1 = same baselines as exact, 0 = no better than uniform, < 0 = worse than uniform).

:func:`run_proxy_study` repeats this over a run's checkpoints (the policy's own rollouts at each point)
and writes ``proxy_study.csv`` (one row per point), ``proxy_study_groups.csv`` (one row per group),
``proxy_study.md`` and ``proxy_study.png``. CLI: ``oblr proxy-study``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch


PROXIES = ("length", "logit_energy")


# ------------------------------------------------------------------------------------------------ math
def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks within each row, ties averaged: ``r_i = #{j: x_j < x_i} + (#{j: x_j = x_i} + 1) / 2``.

    x [N, G] -> [N, G] float64. O(N G^2), fine for group sizes ~8-64.
    """
    if x.dim() != 2:
        raise ValueError(f"average_ranks: expected [N, G], got shape {tuple(x.shape)}")
    x = x.double()
    less = (x[:, None, :] < x[:, :, None]).sum(-1)
    equal = (x[:, None, :] == x[:, :, None]).sum(-1)
    return less.double() + (equal.double() + 1.0) / 2.0


def spearman_within_groups(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Spearman rank correlation of each row of x [N, G] with the same row of y: the Pearson correlation
    of their average ranks. [N] float64; NaN for a row where x or y is constant."""
    import torch

    if x.shape != y.shape:
        raise ValueError(f"spearman_within_groups: shapes differ, {tuple(x.shape)} vs {tuple(y.shape)}")
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(-1, keepdim=True), ry - ry.mean(-1, keepdim=True)
    num = (rx * ry).sum(-1)
    den = (rx.pow(2).sum(-1) * ry.pow(2).sum(-1)).sqrt()
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.full_like(num, math.nan))


def sequence_weights(model, batch, *, aggregation: str = "seq_sum_const", max_len: int | None = None,
                     norms_method: str = "auto") -> dict[str, torch.Tensor]:
    """``{"exact", "length", "logit_energy"}`` -> [B] float32 weights of the rows of ``batch``
    (``input_ids``, ``attention_mask``, ``response_mask`` [B, T]); ``exact`` = c_i^2 ||s_i||^2."""
    import torch

    from oblr.gradnorm import length_weights, logit_energy_weights, sequence_grad_sq_norms
    from oblr.logprobs import forward_logits
    from oblr.losses import sequence_scale

    ids, am, rm = batch.input_ids, batch.attention_mask, batch.response_mask
    c = sequence_scale(rm.float(), aggregation, max_len=max_len)
    exact = sequence_grad_sq_norms(model, ids, am, rm, method=norms_method) * c.pow(2)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        energy = logit_energy_weights(forward_logits(model, ids, am), ids, rm)
    return {"exact": exact.float(), "length": length_weights(rm), "logit_energy": energy.float()}


def compare_weights(weights: dict[str, torch.Tensor], rewards: torch.Tensor) -> tuple[dict, dict]:
    """Per-group comparison and its summary for ``weights[name]`` [N, G] (must hold "exact") and rewards [N, G].

    Per group ([N] each): ``reward_mean``, ``informative`` (rewards not all equal), ``rho_<proxy>``,
    ``absdiff_<name>`` = mean_i |b_name,i - b_exact,i| for each proxy and ``uniform``.
    Summary: ``groups``, ``informative_groups``, ``rho_<proxy>_{mean,median,q25,q75,n}`` (groups where
    defined), ``absdiff_<name>`` (mean over outputs of informative groups), ``captured_<proxy>``.
    """
    import torch

    from oblr.estimators import compute_baselines

    exact = weights["exact"].double()
    N, G = rewards.shape
    rewards = rewards.double()
    b_exact = compute_baselines("oblr", rewards, weights=exact)
    informative = rewards.max(-1).values != rewards.min(-1).values
    per = {"reward_mean": rewards.mean(-1), "informative": informative}
    diffs = {"uniform": (compute_baselines("rloo", rewards) - b_exact).abs()}
    for name in PROXIES:
        w = weights[name].double().view(N, G)
        per[f"rho_{name}"] = spearman_within_groups(exact.view(N, G), w)
        diffs[name] = (compute_baselines("oblr", rewards, weights=w) - b_exact).abs()
    for name, d in diffs.items():
        per[f"absdiff_{name}"] = d.mean(-1)
    summary: dict = {"groups": N, "informative_groups": int(informative.sum())}
    for name in PROXIES:
        rho = per[f"rho_{name}"]
        rho = rho[torch.isfinite(rho)]
        summary[f"rho_{name}_n"] = int(rho.numel())
        for stat, fn in (("mean", torch.mean), ("median", torch.median)):
            summary[f"rho_{name}_{stat}"] = float(fn(rho)) if rho.numel() else math.nan
        for stat, q in (("q25", 0.25), ("q75", 0.75)):
            summary[f"rho_{name}_{stat}"] = float(torch.quantile(rho, q)) if rho.numel() else math.nan
    inf_rows = informative[:, None].expand(N, G)
    uniform_total = float(diffs["uniform"][inf_rows].sum())
    for name, d in diffs.items():
        summary[f"absdiff_{name}"] = float(d[inf_rows].mean()) if bool(informative.any()) else math.nan
        if name != "uniform":
            summary[f"captured_{name}"] = (1.0 - float(d[inf_rows].sum()) / uniform_total
                                           if uniform_total > 0 else math.nan)
    return per, summary


# ------------------------------------------------------------------------------------------- rollouts
def collect_rollouts(model, tokenizer, task, *, n_prompts: int, group_size: int, max_new_tokens: int,
                     temperature: float = 1.0, seed: int = 0, batch_size: int | None = 256):
    """``(batch, rewards [N, G])``: G samples for each of N training prompts chosen by ``seed`` (the same
    prompts for every model), sampled with a private generator (global RNG untouched)."""
    import torch

    from oblr.rollout import generate_and_score, make_engine
    from oblr.tasks import reward_scorer

    if n_prompts > len(task.train):
        raise ValueError(f"proxy study: {n_prompts} prompts asked, the task has {len(task.train)} training prompts")
    idx = torch.randperm(len(task.train), generator=torch.Generator().manual_seed(seed))[:n_prompts].tolist()
    examples = [task.train[i] for i in idx]
    engine = make_engine("hf", model, tokenizer, batch_size=batch_size)
    batch, rewards = generate_and_score(engine, examples, reward_scorer(task), num_samples=group_size,
                                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
    return batch, rewards.view(n_prompts, group_size)


# ---------------------------------------------------------------------------------------- over a run
def study_points(run_dir: str | Path | None, model: str | None) -> list[tuple[int, str]]:
    """``[(step, model path)]``: step 0 = ``model`` (default: the run's ``model.name_or_path``), then every
    complete checkpoint ``run_dir/checkpoints/step_*`` in step order."""
    from oblr.experiments.stats import config_value, run_config

    if run_dir is None:
        return [(0, model or "builtin")]
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"--checkpoints {run_dir}: not a folder")
    cfg = run_config(run_dir)
    if config_value(cfg, "model.lora_rank", 0):
        raise ValueError(f"{run_dir}: LoRA checkpoints hold adapters only; the proxy study needs full weights")
    from oblr.models.task_builtins import builtin_for_task

    # plain ``builtin`` with a task that has its own built-in model (countdown, word_problems) is that model
    start = builtin_for_task(config_value(cfg, "model.name_or_path", "builtin"), config_value(cfg, "task.name", ""))
    points = [(0, model or start)]
    for ck in sorted((run_dir / "checkpoints").glob("step_*")):
        if ck.is_dir() and (ck / "config.json").is_file() and ck.name[5:].isdigit():
            points.append((int(ck.name[5:]), str(ck)))
    if len(points) == 1:
        raise FileNotFoundError(f"{run_dir}: no checkpoints/step_* folder with weights")
    return points


def run_proxy_study(points: list[tuple[int, str]], out_dir: str | Path, *, task_name: str = "arithmetic",
                    task_options: dict | None = None, n_prompts: int = 16, group_size: int = 8,
                    max_new_tokens: int = 48, temperature: float = 1.0, seed: int = 0,
                    aggregation: str = "seq_sum_const", max_len: int | None = None, norms_method: str = "auto",
                    device: str = "cpu", log=print) -> list[dict]:
    """Run :func:`compare_weights` at every ``(step, model path)`` and write the files listed in the module
    docstring into ``out_dir``; returns the per-point summary rows."""
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    task = get_task(task_name, **(task_options or {}))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, group_rows = [], []
    for step, path in points:
        model, tok = load_model_and_tokenizer(path, device=device)
        model.requires_grad_(True)
        batch, rewards = collect_rollouts(model, tok, task, n_prompts=n_prompts, group_size=group_size,
                                          max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        w = sequence_weights(model, batch, aggregation=aggregation, max_len=max_len or max_new_tokens,
                             norms_method=norms_method)
        per, summary = compare_weights({k: v.view(n_prompts, group_size) for k, v in w.items()}, rewards)
        row = {"step": step, "model": str(path), "reward_mean": float(rewards.mean()), **summary}
        rows.append(row)
        for k in range(n_prompts):
            group_rows.append({"step": step, "group": k, **{n: float(v[k]) for n, v in per.items()}})
        log(f"[proxy-study] step {step}: Spearman(exact, length) median {row['rho_length_median']:.2f}, "
            f"(exact, logit_energy) median {row['rho_logit_energy_median']:.2f}; |b - b_exact| length "
            f"{row['absdiff_length']:.4f}, logit_energy {row['absdiff_logit_energy']:.4f}, uniform "
            f"{row['absdiff_uniform']:.4f}")
        del model
    _write_csv(out_dir / "proxy_study.csv", rows)
    _write_csv(out_dir / "proxy_study_groups.csv", group_rows)
    _write_markdown(out_dir / "proxy_study.md", rows, n_prompts, group_size, task_name)
    _plot(out_dir / "proxy_study.png", rows)
    log(f"[proxy-study] wrote {out_dir}/proxy_study.{{csv,md,png}}")
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)


def _f(v: float, digits: int = 3) -> str:
    return "–" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _write_markdown(path: Path, rows: list[dict], n: int, g: int, task: str) -> None:
    lines = ["# Proxy study: exact w_i vs length and logit-energy proxies\n",
             (f"Task `{task}`, {n} prompts x {g} samples per point (the policy's own rollouts). Spearman: median "
             "[q25, q75] over groups where defined (n); abs(b - b_exact): mean over outputs of informative groups; "
             "captured: 1 - sum|b_proxy - b_exact| / sum|b_uniform - b_exact|.\n"),
             ("| step | reward | informative groups | Spearman length | Spearman logit energy | abs(b-b_exact) length | "
             "abs(b-b_exact) logit energy | abs(b-b_exact) uniform | captured length | captured logit energy |"),
             "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        rho = {p: f"{_f(r[f'rho_{p}_median'], 2)} [{_f(r[f'rho_{p}_q25'], 2)}, {_f(r[f'rho_{p}_q75'], 2)}] "
                  f"(n={r[f'rho_{p}_n']})" for p in PROXIES}
        lines.append(f"| {r['step']} | {_f(r['reward_mean'])} | {r['informative_groups']}/{r['groups']} | "
                     f"{rho['length']} | {rho['logit_energy']} | {_f(r['absdiff_length'], 4)} | "
                     f"{_f(r['absdiff_logit_energy'], 4)} | {_f(r['absdiff_uniform'], 4)} | "
                     f"{_f(r['captured_length'], 2)} | {_f(r['captured_logit_energy'], 2)} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _plot(path: Path, rows: list[dict]) -> Path:
    import numpy as np

    from oblr.tracking.plots import PALETTE, new_figure, save_png

    steps = np.array([r["step"] for r in rows])
    fig, (a1, a2) = new_figure(2, "Proxies of w_i vs the exact squared gradient norms")
    for i, p in enumerate(PROXIES):
        med = np.array([r[f"rho_{p}_median"] for r in rows], dtype=float)
        lo = np.array([r[f"rho_{p}_q25"] for r in rows], dtype=float)
        hi = np.array([r[f"rho_{p}_q75"] for r in rows], dtype=float)
        a1.plot(steps, med, color=PALETTE[i], marker="o", ms=3.5, label=f"{p} (median, IQR band)")
        a1.fill_between(steps, lo, hi, color=PALETTE[i], alpha=0.2, lw=0)
    a1.axhline(0.0, color="k", lw=0.8, alpha=0.5)
    a1.set_ylabel("Spearman within groups")
    a1.legend(loc="best", fontsize=8, frameon=False)
    for i, name in enumerate((*PROXIES, "uniform")):
        a2.plot(steps, [r[f"absdiff_{name}"] for r in rows], color=PALETTE[i], marker="o", ms=3.5,
                label=f"{name} weights")
    a2.set_ylabel("mean |b - b_exact|")
    a2.legend(loc="best", fontsize=8, frameon=False)
    return save_png(fig, path)


# ------------------------------------------------------------------------------------------------- CLI
def register_cli(sub) -> None:
    p = sub.add_parser("proxy-study", help="rank correlation of the w_i proxies with the exact w_i over training",
                       description="For the model (and every checkpoint of --checkpoints RUN_DIR), sample rollouts "
                                   "on the task and compare exact w_i with the length and logit-energy proxies.")
    p.add_argument("--model", help="model path or 'builtin' (default: the run's model, else builtin)")
    p.add_argument("--checkpoints", metavar="RUN_DIR", help="run folder whose checkpoints/step_* to study")
    p.add_argument("--out", help="output folder (default: RUN_DIR/proxy_study, else ./proxy-study)")
    p.add_argument("--prompts", type=int, default=16, help="prompts per point (N)")
    p.add_argument("--group-size", type=int, help="samples per prompt (default: the run's, else 8)")
    p.add_argument("--max-new-tokens", type=int, help="generation limit (default: the run's, else 48)")
    p.add_argument("--seed", type=int, default=0, help="prompt choice and sampling seed")
    p.add_argument("--norms-method", default="auto", help="auto | ghost | materialize | loop")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_cmd_proxy_study)


def _cmd_proxy_study(args) -> int:
    from oblr.checks import COUNT, Range, check_flags
    from oblr.distributed.env import resolve_device
    from oblr.experiments.stats import config_value, run_config

    check_flags({"--prompts": (args.prompts, COUNT),
                 "--group-size": (args.group_size, Range(ge=2, le=2**31 - 1)),
                 "--max-new-tokens": (args.max_new_tokens, COUNT), "--seed": (args.seed, Range(ge=0, le=2**32 - 1))})
    resolve_device(args.device)  # a device this machine lacks: one line, before any model loads

    cfg = run_config(args.checkpoints) if args.checkpoints else {}
    points = study_points(args.checkpoints, args.model)
    out = args.out or (str(Path(args.checkpoints) / "proxy_study") if args.checkpoints else "proxy-study")
    run_proxy_study(
        points, out, task_name=config_value(cfg, "task.name", "arithmetic"),
        task_options=config_value(cfg, "task.options", {}) or {}, n_prompts=args.prompts,
        group_size=args.group_size or config_value(cfg, "rollout.group_size", 8),
        max_new_tokens=args.max_new_tokens or config_value(cfg, "rollout.max_new_tokens", 48),
        temperature=config_value(cfg, "rollout.temperature", 1.0), seed=args.seed,
        aggregation=config_value(cfg, "algorithm.aggregation", "seq_sum_const"),
        max_len=config_value(cfg, "algorithm.max_len", 0) or None, norms_method=args.norms_method,
        device=args.device)
    return 0
