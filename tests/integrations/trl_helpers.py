"""Helpers for the TRL integration tests: a small trainer on the built-in task, a one-sequence-at-a-time
reference, a recorder of every generation batch, and the 2-process ``accelerate launch`` (CPU, gloo)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

#: examples/trl_grpo_oblr.py settings for a test-sized run: 2 steps of 4 prompts x 4 completions, 8 new tokens
EXAMPLE_SHORT_ARGS = ["--max-steps", "2", "--prompts-per-step", "4", "--num-generations", "4",
                      "--max-completion-length", "8", "--eval-problems", "4"]


def varied_reward(prompts, completions, **kwargs) -> list[float]:
    """A deterministic reward with spread inside groups even for an untrained model: digit count mod 3."""
    return [float(sum(ch.isdigit() for ch in c) % 3) / 2.0 for c in completions]


def make_trainer(model, tokenizer, out_dir, *, peft_config=None, reward=varied_reward, **cfg):
    """An OBLRGRPOTrainer on the arithmetic prompts (CPU, float32, no clipping, one log line per step)."""
    from oblr.integrations.trl import OBLRGRPOConfig, OBLRGRPOTrainer
    from oblr.integrations.trl.tasks import TaskReward, task_dataset
    from oblr.tasks import get_task

    task = get_task("arithmetic", n_train=256, n_eval=16)
    reward = TaskReward(task) if reward == "task" else reward
    kw = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=12, max_steps=1,
              learning_rate=1e-3, use_cpu=True, bf16=False, report_to=[], save_strategy="no", logging_steps=1,
              disable_tqdm=True, max_grad_norm=1e9, seed=0)
    kw.update(cfg)
    args = OBLRGRPOConfig(output_dir=str(out_dir), **kw)
    return OBLRGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=task_dataset(task.train),
                           processing_class=tokenizer, peft_config=peft_config)


def frozen_copy(trainer, build):
    """A copy of ``trainer.model``'s current weights in a fresh module from ``build()`` (not a deepcopy: TRL's
    patched forward closes over the original model)."""
    ref = build()
    ref.load_state_dict({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    return ref


class GradSnapshot(TrainerCallback):
    """Copies of the trainable parameters' ``.grad`` just before each optimizer step (after synchronisation)."""

    def __init__(self, model_fn):
        self.model_fn = model_fn
        self.grads: list[torch.Tensor] = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        params = [p for p in self.model_fn().parameters() if p.requires_grad]
        self.grads.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                                     .double() for p in params]))


class KeepRounds:
    """Wraps ``trainer._generate_and_score_completions`` to keep every generation batch's
    ``(GenerationBatch, oblr.update.UpdateResult)`` (``trainer.oblr_last_round`` only holds the last one)."""

    def __init__(self, trainer):
        self.rounds: list = []
        self.trainer, self._orig = trainer, trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self

    def __call__(self, inputs):
        out = self._orig(inputs)
        self.rounds.append(self.trainer.oblr_last_round)
        return out


def one_at_a_time_grads(model, input_ids, attention_mask, response_mask, temperature: float = 1.0) -> torch.Tensor:
    """Row i: the gradient of sum_t response_mask log softmax(logits / T) for sequence i ALONE (its padding
    stripped, its own forward and backward), flattened over the trainable parameters. [B, P] float64."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for i in range(input_ids.shape[0]):
        keep = attention_mask[i].bool()
        ids = input_ids[i][keep][None]
        rm = response_mask[i][keep][None].to(torch.float32)
        with torch.enable_grad():
            logits = model(input_ids=ids).logits.float() / temperature
            lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            l_i = (lp * rm[:, 1:]).sum()
            g = torch.autograd.grad(l_i, params, allow_unused=True)
        rows.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1).double()
                               for x, p in zip(g, params)]))
    return torch.stack(rows)


def one_at_a_time_step_kl(before, after, input_ids, attention_mask, response_mask,
                          temperature: float = 1.0) -> tuple[float, float]:
    """``(sum_i,t m_it k3_it, sum_i,t m_it)`` of a step from weights ``before`` to ``after`` (two models, run in
    float64), each sequence ALONE (its padding stripped): ``k3 = exp(d) - d - 1`` with ``d = log pi_after -
    log pi_before`` of the token sampled, under softmax(logits / T), written here from the formula."""
    kl = tokens = 0.0
    for i in range(input_ids.shape[0]):
        keep = attention_mask[i].bool()
        ids = input_ids[i][keep][None]
        rm = response_mask[i][keep][None, 1:].double()
        lps = []
        with torch.no_grad():
            for m in (before, after):
                logits = m(input_ids=ids).logits.double() / temperature
                lps.append(torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1))
        d = lps[1] - lps[0]
        kl += float(((d.exp() - d - 1) * rm).sum())
        tokens += float(rm.sum())
    return kl, tokens


def kl_rule_lrs(step_kls: list[float], guess: float, target: float, probe: float = 0.1, max_change: float = 2.0,
                kl_ema: float = 0.5, warmup: int = 0) -> list[float]:
    """The lr applied at each step under the kl schedule, from the KL each step moved the policy by, written from
    the rule: the rule's lr is ``probe x guess`` at step 1; the lr applied at step t is ``min(1, t / warmup)``
    times the rule's; after step t, ``k_t = KL_t / applied_t^2``, its log averaged (bias-corrected EMA), and the
    rule's lr becomes ``sqrt(target / kbar)``, at most ``max_change`` times the rule's previous lr after the first
    measurement."""
    import math

    def warm(t: int) -> float:
        return min(1.0, t / warmup) if warmup else 1.0

    rule, avg, applied = probe * guess, 0.0, []
    for t, kl in enumerate(step_kls, start=1):
        applied.append(warm(t) * rule)
        avg = kl_ema * avg + (1 - kl_ema) * math.log(kl / applied[-1] ** 2)
        want = math.sqrt(target / math.exp(avg / (1 - kl_ema**t)))
        rule = want if t == 1 else min(want, max_change * rule)
    return applied


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


def accelerate_launch_two_cpu_processes(script: Path, args: list[str], log: Path, timeout: float = 600) -> int:
    """Run ``script args`` as 2 processes under ``accelerate launch`` and return the launcher's exit status.

    ``--multi_gpu`` selects accelerate's multi-process launcher (``torch.distributed.run`` underneath) whatever
    the device; the script asks for the CPU (``use_cpu=True``), so accelerate joins the processes with gloo.
    (``--cpu --num_processes 2`` would start ONE process: accelerate's CPU launcher needs mpirun for more.)
    ``--main_process_port 0``: accelerate picks a free port (its default, the fixed 29500, is left only when
    taken at the moment it checks, which races with other launches on the machine). One thread per process. Output goes to ``log`` (a file, no pipe to fill). On timeout the launcher
    gets SIGTERM (it stops its workers), then everything it started that is still alive gets SIGKILL, and
    ``subprocess.TimeoutExpired`` is raised.
    """
    import psutil  # a dependency of accelerate

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           str(script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                started = psutil.Process(p.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                started = []
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for c in started:
                try:
                    c.kill()
                except psutil.NoSuchProcess:
                    pass
            raise


def log_tail(log: Path, n: int = 6000) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else f"(no log at {log})"
