"""Do ``oblr train`` and ``OBLRGRPOTrainer`` see the same per-batch SNR statistics on the same model?

From the built-in start model, K batches of 16 prompts x 8 samples are drawn two ways: with oblr's own
rollout engine (as ``oblr train`` does) and with TRL's generation (``GRPOTrainer._generate_and_score_completions``,
as ``OBLRGRPOTrainer`` calls it). Each batch goes through the same update core
(:func:`oblr.update.accumulate_policy_gradient`, the default OBLR-PO settings, no optimizer step), and the
script prints, for each way, the mean (sd) over batches of the signal ``||gbar||^2 - V/N``, of V, of
``||gbar||^2`` and of the lr factor ``S/(S+V/N)``. Used by docs/trl.md (head-to-head).

    python benchmarks/trl_native_stats.py --batches 12 --out benchmarks/results/trl_native_stats
"""

from __future__ import annotations

import argparse
import json
import random
import statistics as st
import tempfile
from pathlib import Path

N, G = 16, 8


def main(argv=None) -> dict:
    import torch

    from oblr.config import load_config
    from oblr.distributed.step import step_statistics
    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, task_dataset
    from oblr.models import load_model_and_tokenizer
    from oblr.rollout import generate_and_score, make_engine
    from oblr.tasks import get_task, reward_scorer
    from oblr.update import UpdateSettings, accumulate_policy_gradient, trainable_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--out", default=None, help="folder for summary.md and results.json")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    random.seed(0)
    task = get_task("arithmetic")
    model, tok = load_model_and_tokenizer("builtin")
    settings = UpdateSettings.from_config(load_config(None, ["rollout.max_new_tokens=32"]), schedule_needs_snr=True)

    def stats(batch, rewards):
        for p in model.parameters():
            p.grad = None
        model.train()
        res = accumulate_policy_gradient(model, batch, rewards.reshape(N, G), settings)
        gsq, st = step_statistics(trainable_params(model), res.per_prompt_sq_norms, float64=False)  # oblr train's
        return float(st.signal), float(st.V), float(gsq)

    native, engine, score = [], make_engine("hf", model, tok), reward_scorer(task)
    for k in range(a.batches):
        model.eval()
        batch, rewards = generate_and_score(engine, random.sample(task.train, N), score, num_samples=G,
                                            max_new_tokens=32, temperature=1.0)
        native.append(stats(batch, rewards))
        print(f"[trl_native_stats] oblr engine batch {k + 1}/{a.batches}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = OBLRGRPOConfig(output_dir=tmp, per_device_train_batch_size=N * G, num_generations=G,
                              max_completion_length=32, max_steps=a.batches, save_strategy="no", report_to=[],
                              seed=0, use_cpu=True, disable_tqdm=True, learning_rate=1e-3, adam_beta2=0.99)
        trainer = OBLRGRPOTrainer(model=model, reward_funcs=TaskReward(task), args=args,
                                  train_dataset=task_dataset(task.train), processing_class=tok)
        batches, trl = iter(trainer.get_train_dataloader()), []
        for k in range(a.batches):
            out = super(OBLRGRPOTrainer, trainer)._generate_and_score_completions(next(batches))  # TRL's own
            batch = trainer._oblr_batch(out)
            trl.append(stats(batch, batch.rewards))
            print(f"[trl_native_stats] TRL generation batch {k + 1}/{a.batches}", flush=True)
    summary = {}
    lines = ["| rollouts | batches | signal mean (sd) | V mean | gbar^2 mean | factor S/(S+V/N) mean |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, xs in (("oblr engine (oblr train)", native), ("TRL generation (OBLRGRPOTrainer)", trl)):
        sig, V, g = [x[0] for x in xs], [x[1] for x in xs], [x[2] for x in xs]
        fac = [max(0.0, s) / (max(0.0, s) + v / N) for s, v in zip(sig, V)]
        summary[name] = {"signal": sig, "V": V, "gbar_sq": g, "factor": fac}
        lines.append(f"| {name} | {len(xs)} | {st.mean(sig):.2e} ({st.stdev(sig):.2e}) | {st.mean(V):.3f} | "
                     f"{st.mean(g):.4f} | {st.mean(fac):.3f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.md").write_text(md)
        (out / "results.json").write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
