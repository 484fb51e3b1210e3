"""OBLR-PO inside TRL: train the built-in model on the built-in arithmetic task with ``OBLRGRPOTrainer``.

One process (CPU)::

    python examples/trl_grpo_oblr.py --max-steps 100
    python examples/trl_grpo_oblr.py --max-steps 100 --lr-schedule kl     # the lr from the KL per step

Two processes (CPU, gloo; the generation batch is split by whole groups, S/V/lr are the same on both)::

    accelerate launch --multi_gpu --num_processes 2 --main_process_port 0 examples/trl_grpo_oblr.py --max-steps 100

(``--multi_gpu`` selects accelerate's multi-process launcher; without CUDA the processes run on the CPU with
gloo. ``--cpu --num_processes 2`` would start one process.)

On GPUs, DeepSpeed ZeRO-3 and vLLM colocate: see docs/trl.md. The run writes ``<output-dir>/summary.json``
(held-out sampled accuracy before/after, wall time, TRL's log history with the ``oblr/`` metrics).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="builtin", help="'builtin' or a saved Hugging Face model directory")
    p.add_argument("--output-dir", default="runs/trl-grpo-oblr")
    p.add_argument("--baseline", default="oblr", help="oblr estimator name (oblr, rloo, grpo, dr_grpo, ...)")
    p.add_argument("--no-snr-lr", action="store_true", help="constant learning rate instead of the SNR rule")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate (eta_max of the SNR rule; the guess of "
                                                           "auto and kl)")
    p.add_argument("--lr-schedule", choices=["snr", "snr_adam", "auto", "kl"], default="snr",
                   help="the schedule oblr sets the lr with (oblr_lr_schedule; kl is oblr train's default)")
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--prompts-per-step", type=int, default=16, help="prompts per optimizer step, all processes")
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--eval-problems", type=int, default=200,
                   help="held-out problems (x4 samples; oblr train's default); 0 = skip")
    p.add_argument("--beta2", type=float, default=0.99, help="AdamW beta2 (oblr train's default; TRL's is 0.999)")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter (peft) instead of all weights")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (GPU)")
    p.add_argument("--vllm", choices=["colocate", "server"], default=None,
                   help="generate with vLLM (GPU; needs vllm installed; see docs/trl.md)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process on CPU")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    a = parse_args(argv)
    import torch

    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, heldout_accuracy, task_dataset
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rows = a.prompts_per_step * a.num_generations
    if a.prompts_per_step % world:
        raise SystemExit(f"--prompts-per-step {a.prompts_per_step} must be a multiple of the {world} processes "
                         f"(each process holds whole groups)")
    cpu = not torch.cuda.is_available()
    args = OBLRGRPOConfig(
        output_dir=a.output_dir, per_device_train_batch_size=rows // world, num_generations=a.num_generations,
        max_completion_length=a.max_completion_length, temperature=a.temperature, learning_rate=a.lr,
        oblr_baseline=a.baseline, oblr_snr_lr=not a.no_snr_lr, oblr_lr_schedule=a.lr_schedule,
        max_steps=a.max_steps, logging_steps=1,
        save_strategy="no", report_to=[], seed=a.seed, bf16=a.bf16, use_cpu=cpu, disable_tqdm=True, adam_beta2=a.beta2,
        ddp_backend="gloo" if cpu and world > 1 else None,
        **(dict(use_vllm=True, vllm_mode=a.vllm) if a.vllm else {}))
    model, tokenizer = load_model_and_tokenizer(a.model)
    task = get_task("arithmetic")  # the same train/held-out split as `oblr train`; --seed moves the sampling only
    peft_config = None
    if a.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                 task_type="CAUSAL_LM")
    trainer = OBLRGRPOTrainer(model=model, reward_funcs=TaskReward(task), args=args,
                              train_dataset=task_dataset(task.train), processing_class=tokenizer,
                              peft_config=peft_config)
    main_process = trainer.accelerator.is_main_process

    def accuracy():
        if not (main_process and a.eval_problems):
            return None
        return heldout_accuracy(trainer.accelerator.unwrap_model(trainer.model), tokenizer, task,
                                n_problems=a.eval_problems, temperature=a.temperature,
                                max_new_tokens=a.max_completion_length, seed=a.seed + 12345)

    before = accuracy()
    t0 = time.perf_counter()
    trainer.train()
    summary = {"processes": world, "baseline": a.baseline, "snr_lr": not a.no_snr_lr, "steps": a.max_steps,
               "train_seconds": round(time.perf_counter() - t0, 1), "accuracy_before": before,
               "accuracy_after": accuracy(), "log_history": trainer.state.log_history}
    if main_process:
        Path(a.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(a.output_dir) / "summary.json").write_text(json.dumps(summary, indent=1))
        print(f"[oblr/trl] {world} process(es), {a.max_steps} steps in {summary['train_seconds']} s; held-out "
              f"sampled accuracy {before} -> {summary['accuracy_after']}; summary in {a.output_dir}/summary.json")
    return summary


if __name__ == "__main__":
    main()
