"""Helpers for the TRL integration tests: a small trainer on the built-in task and a one-sequence-at-a-time reference."""

from __future__ import annotations

import torch
from transformers import TrainerCallback


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


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm().clamp(min=1e-300))
