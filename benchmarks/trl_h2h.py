"""TRL head-to-head: GRPOTrainer, OBLRGRPOTrainer (SNR and auto) and ``oblr train`` on one protocol.

Same start model (the built-in checkpoint, fresh per run), same task and held-out set (the built-in arithmetic
task with its default split), same batch (``--prompts`` x ``--num-generations``, ``--max-completion-length``
new tokens), same optimizer settings (AdamW, betas (0.9, ``--beta2``), no weight decay, gradient clipping at
1.0), same steps and seeds, float32 throughout (TRL's own default, ``bf16=True``, autocasts TRL's forward passes
to bf16 even on the CPU, several times slower there; ``--trl-bf16`` asks for it). Every final model is scored by
the same function (:func:`heldout`): held-out
sampled accuracy (``--eval-problems`` x ``--eval-samples``, temperature 1, a fixed generator seed) and greedy
accuracy, with oblr's HF rollout engine; the start model is scored once the same way. The lr trajectory of
each run is kept (TRL: ``oblr/lr`` or ``learning_rate`` from the log history; native: ``optim/lr``).

Variants (``--variants``):

- ``trl-grpo``: TRL's ``GRPOTrainer`` (``loss_type='dr_grpo'``, ``scale_rewards='group'``, ``beta=0``), constant
  ``--grpo-lr``;
- ``trl-oblr-snr``: ``OBLRGRPOTrainer`` with the SNR rule, ``learning_rate=--lr`` (eta_max);
- ``trl-oblr-auto``: ``OBLRGRPOTrainer`` with ``learning_rate="auto"``;
- ``native-oblr-snr``: ``oblr train`` (python API) with the same settings and ``optim.lr=--lr``;
- ``native-grpo``: ``oblr train`` with GRPO (group mean, std-scaled) at the constant ``--grpo-lr``: the same
  algorithm as ``trl-grpo`` in oblr's own loop, which separates what the framework does from what the
  learning-rate rule does.

Runs go to ``--jobs`` worker processes (one torch thread each). Writes ``OUT/results.json`` (every run), and
``OUT/summary.md`` (the table) and ``OUT/trl_h2h.png`` (accuracies and lr trajectories); ``--doc FILE``
replaces the text between ``<!-- trl_h2h:begin -->`` and ``<!-- trl_h2h:end -->`` in FILE with the table.

    python benchmarks/trl_h2h.py --steps 200 --seeds 0 1 2 --jobs 2 --doc docs/trl.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

VARIANTS = ("trl-grpo", "trl-oblr-snr", "trl-oblr-auto", "native-oblr-snr", "native-grpo")
LABELS = {"trl-grpo": "TRL GRPOTrainer (dr_grpo loss, group-scaled rewards, fixed lr)",
          "trl-oblr-snr": "TRL OBLRGRPOTrainer, SNR rule", "trl-oblr-auto": "TRL OBLRGRPOTrainer, learning_rate='auto'",
          "native-oblr-snr": "oblr train, OBLR-PO (SNR rule)",
          "native-grpo": "oblr train, GRPO (std-scaled, fixed lr)"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin", help="'builtin' or a saved Hugging Face model directory")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=16, help="prompts per optimizer step")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="eta_max of the SNR rule (TRL and native)")
    p.add_argument("--grpo-lr", type=float, default=1e-4, help="GRPOTrainer's constant learning rate")
    p.add_argument("--trl-bf16", action="store_true",
                   help="TRL runs with TRL's default bf16=True (bf16 autocast, on the CPU too); default: float32, as "
                        "oblr train runs")
    p.add_argument("--beta2", type=float, default=0.99, help="AdamW beta2 for every run (oblr train's default)")
    p.add_argument("--eval-problems", type=int, default=200)
    p.add_argument("--eval-samples", type=int, default=4)
    p.add_argument("--jobs", type=int, default=1, help="runs at once (processes, one thread each)")
    p.add_argument("--out", default="runs/trl_h2h")
    p.add_argument("--doc", help="markdown file whose trl_h2h block gets the table")
    return p.parse_args(argv)


def heldout(model, tokenizer, task, a) -> dict:
    """Sampled and greedy held-out accuracy of ``model`` (the same function for every run: the one
    ``oblr train`` evaluates with, :func:`oblr.train.evaluation.heldout_eval`)."""
    import torch

    from oblr.rollout import make_engine
    from oblr.tasks import reward_scorer
    from oblr.train.evaluation import heldout_eval

    model.eval()
    with torch.no_grad():
        h = heldout_eval(make_engine("hf", model, tokenizer), task.eval[: a.eval_problems], reward_scorer(task),
                         samples=a.eval_samples, max_new_tokens=a.max_completion_length, temperature=1.0,
                         seed=12345, greedy=True)
    return {"sampled": h.accuracy_sampled(), "greedy": h.accuracy_greedy()}


def _trl_run(variant: str, seed: int, a, out: Path) -> dict:
    from trl import GRPOConfig, GRPOTrainer

    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, task_dataset
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    task = get_task("arithmetic")
    model, tok = load_model_and_tokenizer(a.model)
    common = dict(output_dir=str(out / "trainer"), per_device_train_batch_size=a.prompts * a.num_generations,
                  num_generations=a.num_generations, max_completion_length=a.max_completion_length,
                  max_steps=a.steps, logging_steps=1, save_strategy="no", report_to=[], seed=seed, use_cpu=True,
                  disable_tqdm=True, loss_type="dr_grpo", beta=0.0, lr_scheduler_type="constant",
                  gradient_checkpointing=False, adam_beta2=a.beta2, weight_decay=0.0, max_grad_norm=1.0,
                  bf16=a.trl_bf16)
    if variant == "trl-grpo":
        cfg, cls = GRPOConfig(**common, learning_rate=a.grpo_lr, scale_rewards="group"), GRPOTrainer
    elif variant == "trl-oblr-snr":
        cfg, cls = OBLRGRPOConfig(**common, learning_rate=a.lr), OBLRGRPOTrainer
    else:
        cfg, cls = OBLRGRPOConfig(**common, learning_rate="auto"), OBLRGRPOTrainer
    trainer = cls(model=model, reward_funcs=TaskReward(task), args=cfg, train_dataset=task_dataset(task.train),
                  processing_class=tok)
    trainer.train()
    hist = trainer.state.log_history
    lr = [h.get("oblr/lr", h.get("learning_rate")) for h in hist if "oblr/lr" in h or "learning_rate" in h]
    return {"final": heldout(trainer.model, tok, task, a), "lr": lr}


def _native_run(variant: str, seed: int, a, out: Path) -> dict:
    from oblr.config import load_config
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task
    from oblr.train import train
    from oblr.train.checkpoint import latest_checkpoint

    run_dir = out / "run"
    algo = ([f"optim.lr={a.lr}", "algorithm.baseline=oblr", "algorithm.lr_schedule=snr"] if variant == "native-oblr-snr"
            else [f"optim.lr={a.grpo_lr}", "algorithm.baseline=grpo", "algorithm.lr_schedule=constant"])
    cfg = load_config(None, [f"model.name_or_path={a.model}", "task.name=arithmetic", f"train.steps={a.steps}",
                             f"train.seed={seed}", f"rollout.prompts_per_step={a.prompts}",
                             f"rollout.group_size={a.num_generations}", f"rollout.max_new_tokens={a.max_completion_length}",
                             f"optim.betas=[0.9,{a.beta2}]", "optim.weight_decay=0", "optim.grad_clip=1.0",
                             *algo,
                             "train.eval_every=0", "task.eval_size=0", f"train.save_every={a.steps}",
                             "train.plots=false", "train.threads=1", f"train.output_dir={run_dir}"])
    train(cfg, resume=False, quiet=True)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    model, tok = load_model_and_tokenizer(str(latest_checkpoint(run_dir)))
    return {"final": heldout(model, tok, get_task("arithmetic"), a), "lr": [r["optim/lr"] for r in rows if "optim/lr" in r]}


PROTOCOL = ("model", "model_sha", "steps", "prompts", "num_generations", "max_completion_length", "lr", "grpo_lr",
            "beta2", "eval_problems", "eval_samples")


def model_sha(name: str) -> str:
    """SHA-256 (first 16 hex digits) over the weight files of the resolved model: the built-in model is
    rebuilt per machine and its weights differ between machines, so runs of another start model are not
    reused."""
    import hashlib

    from oblr.hashing import sha256_file
    from oblr.models import resolve_model_path

    path = Path(resolve_model_path(name, progress=lambda m: print(f"[oblr] {m}", flush=True)))
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    if not files:
        raise SystemExit(f"trl_h2h: no weight files (*.safetensors, *.bin) in {path}")
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}:{sha256_file(f)}".encode())
    return h.hexdigest()[:16]


def run_one(job: tuple) -> dict:
    """Train and score one (variant, seed); a finished run of the same protocol (settings and start model's
    weights) in its folder is reused (``result.json``), so an interrupted benchmark continues where it stopped."""
    variant, seed, a = job
    out = Path(a.out) / variant / f"seed{seed}"
    protocol = {k: getattr(a, k) for k in PROTOCOL}
    if variant.startswith("trl"):  # TRL runs made before --trl-bf16 existed ran in bf16: not reused
        protocol["trl_bf16"] = a.trl_bf16
    done = out / "result.json"
    if done.is_file():
        res = json.loads(done.read_text())
        if res.get("protocol") == protocol:
            return {**res, "reused": True}
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    if (out / "run").exists():  # a native run cut short: start it again
        import shutil

        shutil.rmtree(out / "run")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res = _native_run(variant, seed, a, out) if variant.startswith("native") else _trl_run(variant, seed, a, out)
    res.update(variant=variant, seed=seed, seconds=round(time.perf_counter() - t0, 1), protocol=protocol)
    done.write_text(json.dumps(res))
    return res


def _start(a) -> dict:
    import torch

    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(a.model)
    return heldout(model, tok, get_task("arithmetic"), a)


def _ms(xs: list[float]) -> str:
    if len(xs) < 2:
        return f"{100 * xs[0]:.1f}" if xs else "-"
    return f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"


def table(a, start: dict, runs: list[dict]) -> str:
    lines = [f"Built-in model and arithmetic task, {a.prompts} prompts x {a.num_generations} completions, "
             f"{a.max_completion_length} new tokens, {a.steps} steps, seeds {a.seeds}, AdamW betas (0.9, {a.beta2}), "
             f"clip 1.0, TRL runs in {'bf16 autocast' if a.trl_bf16 else 'float32'}; held-out {a.eval_problems} "
             f"problems (sampled: x{a.eval_samples}, temperature 1; greedy), "
             f"every model scored by the same function. Start model: sampled {100 * start['sampled']:.1f} %, "
             f"greedy {100 * start['greedy']:.1f} %. Mean ± std over seeds.", "",
             "| run | lr | sampled acc. (%) | greedy acc. (%) | mean lr over steps | steps at lr 0 | per-seed sampled / greedy |",
             "|---|---|---:|---:|---:|---:|---|"]
    for v in a.variants:
        rs = sorted((r for r in runs if r["variant"] == v), key=lambda r: r["seed"])
        if not rs:
            continue
        lr_desc = {"trl-grpo": f"{a.grpo_lr:g} fixed", "native-grpo": f"{a.grpo_lr:g} fixed",
                   "trl-oblr-auto": "auto"}.get(v, f"SNR, eta_max {a.lr:g}")
        mean_lr = [statistics.mean(r["lr"]) for r in rs if r["lr"]]
        zeros = [sum(x == 0 for x in r["lr"]) for r in rs]
        per_seed = ", ".join(f"{100 * r['final']['sampled']:.1f} / {100 * r['final']['greedy']:.1f}" for r in rs)
        lines.append(f"| {LABELS[v]} | {lr_desc} | {_ms([r['final']['sampled'] for r in rs])} | "
                     f"{_ms([r['final']['greedy'] for r in rs])} | {statistics.mean(mean_lr):.2e} | "
                     f"{statistics.mean(zeros):.0f} | {per_seed} |")
    return "\n".join(lines) + "\n"


def plot(a, start: dict, runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = [v for v in a.variants if any(r["variant"] == v for r in runs)]
    for j, kind in enumerate(("sampled", "greedy")):
        for i, v in enumerate(names):
            ys = [100 * r["final"][kind] for r in runs if r["variant"] == v]
            x = i + (j - 0.5) * 0.35
            ax1.bar(x, statistics.mean(ys), width=0.33, color=f"C{j}", alpha=0.6, label=kind if i == 0 else None)
            ax1.scatter([x] * len(ys), ys, color="k", s=10, zorder=3)
        ax1.axhline(100 * start[kind], color=f"C{j}", ls="--", lw=1)
    ax1.set_xticks(range(len(names)), [v.replace("-", "\n", 1) for v in names], fontsize=8)
    ax1.set_ylabel("held-out accuracy (%)  (dashed: start model)")
    ax1.legend()
    for i, v in enumerate(names):
        for k, r in enumerate(r for r in runs if r["variant"] == v):
            ax2.plot(range(1, len(r["lr"]) + 1), r["lr"], color=f"C{i}", alpha=0.7, lw=1, label=v if k == 0 else None)
    ax2.set_yscale("symlog", linthresh=1e-6)
    ax2.set_xlabel("step")
    ax2.set_ylabel("learning rate")
    ax2.legend(fontsize=8)
    fig.suptitle(f"TRL head-to-head, {a.steps} steps, seeds {a.seeds}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    a = parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    a.model_sha = model_sha(a.model)
    jobs = [(v, s, a) for s in a.seeds for v in a.variants]
    t0 = time.perf_counter()
    start = _start(a)
    print(f"[trl_h2h] start model: sampled {start['sampled']:.3f}, greedy {start['greedy']:.3f}; "
          f"{len(jobs)} runs, {a.jobs} at a time", flush=True)
    runs = []
    if a.jobs == 1:
        results = map(run_one, jobs)
    else:
        import multiprocessing as mp

        pool = mp.get_context("spawn").Pool(a.jobs)
        results = pool.imap_unordered(run_one, jobs)
    for k, r in enumerate(results, 1):
        runs.append(r)
        print(f"[trl_h2h] {k}/{len(jobs)} {r['variant']} seed {r['seed']}: sampled {r['final']['sampled']:.3f}, "
              f"greedy {r['final']['greedy']:.3f}, {r['seconds']:.0f} s{' (reused)' if r.get('reused') else ''} "
              f"(elapsed {time.perf_counter() - t0:.0f} s)", flush=True)
    md = table(a, start, runs)
    (out / "summary.md").write_text(md)
    (out / "results.json").write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k not in ("out", "doc")}, "start": start,
                                                  "runs": runs}, indent=1))
    plot(a, start, runs, out / "trl_h2h.png")
    print("\n" + md)
    if a.doc:
        doc = Path(a.doc)
        text = doc.read_text()
        begin, end = "<!-- trl_h2h:begin -->", "<!-- trl_h2h:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{doc} has no {begin} ... {end} block")
        head, rest = text.split(begin, 1)
        doc.write_text(head + begin + "\n" + md + rest[rest.index(end):])
    return {"start": start, "runs": runs}


if __name__ == "__main__":
    main()
