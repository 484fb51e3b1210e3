"""The config schema: one dataclass per section of a run's config (model, task, rollout, algorithm, optim,
train, distributed) and :class:`Config`, their whole. Each field is an :func:`opt`: its default, its help line
(``oblr train --help``), and where numeric its :class:`oblr.checks.Range`, where choice-valued the registry its
names come from (``choices="module:NAME"``), where dict-valued the registered entry whose options it holds.
Parsing and the facade are :mod:`oblr.config`, the checks :mod:`oblr.config_validate`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from oblr.checks import BIG, COUNT, COUNT0, INT_MAX, MAX_THREADS, Range


def opt(default, help: str, **kw):
    """A dataclass field with a help line (shown by ``oblr train --help``). ``choices="module:NAME"`` names
    the :class:`oblr.registry.Registry` (or tuple of names) whose names the value must be one of;
    ``range=Range(...)`` says where a numeric value must lie (every int and float key has one);
    ``options_of="key"`` marks a dict of options of the registered entry named by the sibling ``key``
    (checked by :func:`option_problems`), ``reserved={option: why}`` the options oblr passes itself."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    name_or_path: str = opt("builtin", "Hugging Face checkpoint directory or hub id; 'builtin' = the tiny "
                                       "model of the task, shipped with oblr (oblr models list)")
    dtype: str = opt("float32", "parameter dtype", choices="oblr.models:DTYPES")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N | mps (checked against this machine before the model "
                              "loads)")
    trust_remote_code: bool = opt(False, "passed to from_pretrained")
    lora_rank: int = opt(0, "train LoRA adapters of this rank instead of all weights (0 = full fine-tuning)",
                         range=Range(ge=0, le=65536))
    lora_alpha: float = opt(16.0, "LoRA alpha", range=Range(gt=0, le=BIG))
    lora_targets: list = opt(["q_proj", "k_proj", "v_proj", "o_proj"], "module names LoRA adapts")
    activation_checkpointing: bool = opt(False, "recompute each decoder block's activations in the backward "
                                                "(Hugging Face non-reentrant checkpointing) to save memory; the "
                                                "exact-norm path then runs a norm pass and a gradient pass "
                                                "(docs/gradnorm.md)")
    logit_chunk_tokens: int = opt(0, "apply the output layer this many positions at a time, each chunk "
                                     "recomputed in the backward, so no [B, T, vocab] logits are held (0 = off; "
                                     "with exact norms needs activation checkpointing); docs/scale.md",
                                  range=COUNT0)


@dataclass
class TaskConfig:
    name: str = opt("arithmetic", "task name (see `oblr tasks`)", choices="oblr.tasks:TASKS")
    options: dict = opt({}, "task options passed to the task factory (e.g. difficulty, n_train, template); "
                            "names, types and ranges are checked against the factory's signature",
                        options_of="name", reserved={"tokenizer": "oblr passes the model's tokenizer itself"})
    eval_size: int = opt(200, "held-out prompts used by periodic evaluation (0 = none; capped at the split size)",
                         range=COUNT0)


@dataclass
class RolloutConfig:
    group_size: int = opt(8, "G: sampled outputs per prompt", range=Range(ge=2, le=INT_MAX))
    prompts_per_step: int = opt(16, "N: prompts per training step (N*G sequences per step)", range=COUNT)
    max_new_tokens: int = opt(32, "generation length limit", range=COUNT)
    temperature: float = opt(1.0, "sampling temperature for training rollouts (greedy is for eval)",
                             range=Range(ge=1e-3, le=100))
    top_p: float = opt(1.0, "nucleus sampling threshold", range=Range(gt=0, le=1))
    batch_size: int = opt(256, "sequences generated per batch", range=COUNT)
    engine: str = opt("hf", "rollout engine that generates the samples", choices="oblr.rollout:ENGINES")
    engine_options: dict = opt({}, "extra options of the rollout engine's factory, e.g. {memory_fraction: 0.3} "
                                   "for vllm (see docs/rollout.md); checked against the factory's signature",
                               options_of="engine", reserved={"batch_size": "set rollout.batch_size instead"})


#: schedule arguments oblr sets from other keys (not settable in algorithm.schedule_options)
SCHEDULE_RESERVED = {"optimizer": "oblr passes the optimizer", "lr": "set optim.lr", "eta_min": "set optim.eta_min",
                     "warmup_steps": "set optim.warmup_steps", "total_steps": "set train.steps",
                     "ema": "set optim.snr_ema", "grad_clip": "set optim.grad_clip",
                     "prompts_per_step": "set rollout.prompts_per_step"}


@dataclass
class AlgorithmConfig:
    baseline: str = opt("oblr", "baseline/advantage estimator", choices="oblr.estimators:ESTIMATORS")
    lr_schedule: str = opt("kl", "learning-rate schedule (kl, the default = oblr's own rule, not the paper's: the lr that moves the policy by schedule_options.target nats per token each step, 1.5e-3 x rollout.prompts_per_step / 128 with AdamW, 3e-3 with SGD, optim.lr only a guess; snr = the paper's SNR rule, optim.lr its eta_max; snr_adam = its factor with the noise counted after Adam's momentum, AdamW only; auto = measured step scale, optim.lr its initial guess, measured to work with AdamW, not SGD; constant, cosine: docs/algorithm.md)", choices="oblr.schedules:SCHEDULES")
    aggregation: str = opt("seq_sum_const", "loss aggregation (seq_sum_const is the unbiased one)",
                           choices="oblr.losses:AGGREGATIONS")
    max_len: int = opt(0, "the constant of seq_sum_const (0 = rollout.max_new_tokens)", range=COUNT0)
    baseline_options: dict = opt({}, "extra options of the estimator, e.g. {scale_std: false} for grpo",
                                 options_of="baseline")
    schedule_options: dict = opt({}, "options of the lr schedule beyond the optim keys, e.g. {max_change: 2, probe: "
                                      "0.05} for auto (docs/algorithm.md); checked against the schedule's signature",
                                 options_of="lr_schedule", reserved=SCHEDULE_RESERVED)
    epochs: int = opt(1, "policy updates per batch of rollouts (>1 uses importance ratios and clipping)",
                      range=Range(ge=1, le=1000))
    clip_eps: float = opt(0.2, "PPO clip range for epochs > 1", range=Range(gt=0, le=1))
    kl_coef: float = opt(0.0, "weight of the k3 KL penalty to the initial (frozen) policy; 0 = off",
                         range=Range(ge=0, le=BIG))
    norms_method: str = opt("auto", "how exact gradient norms are computed (loop = the slow reference)",
                            choices="oblr.gradnorm:NORMS_METHODS")
    checkpointed_engine: str = opt("two_pass", "exact-norm engine when model.activation_checkpointing is on: "
                                               "two_pass (nothing kept per layer, a second backward) | recompute "
                                               "(no second backward; keeps each layer's per-row gradients, up to B x "
                                               "the trainable parameters in float32); docs/scale.md",
                                   choices="oblr.gradnorm:CHECKPOINTED_ENGINES")
    track_snr: bool = opt(False, "compute and log S, V, SNR even when the schedule does not use them")
    track_step_kl: bool = opt(False, "measure and log policy/step_kl, the per-token KL(old || new) of each update "
                                     "on its own batch (one more forward pass, no backward); the kl schedule "
                                     "always measures it")
    micro_batch_groups: int = opt(0, "prompt groups per forward/backward micro-batch (0 = all at once)",
                                  range=COUNT0)
    memory_plan: str = opt("none", "choose checkpointing (exact norms: the one-pass, recompute or two-pass engine) "
                                   "and the micro-batch under a memory budget: none (as configured) | auto | "
                                   "one_pass | recompute | two_pass (the last two turn model.activation_checkpointing "
                                   "on); docs/scale.md",
                           choices="oblr.train.plan:MEMORY_PLANS")
    memory_budget_gb: float | None = opt(None, "memory per device (decimal GB) the plan must fit; unset with a "
                                               "memory_plan: the free CUDA memory (required on CPU)",
                                         range=Range(gt=0, le=BIG))


@dataclass
class OptimConfig:
    optimizer: str = opt("adamw", "optimizer", choices="oblr.train.optimizers:OPTIMIZERS")
    lr: float = opt(1e-3, "learning rate: the guess of the scale for kl (the default; its first step runs at 0.1x it) and auto, eta_max of the SNR rules, the constant/cosine peak",
                    range=Range(gt=0, le=BIG))
    eta_min: float = opt(0.0, "learning-rate floor (at most optim.lr)", range=Range(ge=0, le=BIG))
    snr_ema: float = opt(0.9, "EMA factor for S and V in the SNR rule (0 = current batch only, as in the paper; "
                                    "the per-batch estimate is noisy at small N, see docs/algorithm.md)",
                         range=Range(ge=0, lt=1))
    warmup_steps: int = opt(0, "linear warm-up steps", range=COUNT0)
    weight_decay: float = opt(0.0, "AdamW weight decay", range=Range(ge=0, le=BIG))
    betas: list = opt([0.9, 0.99], "AdamW betas (two numbers in [0, 1))")
    momentum: float = opt(0.0, "SGD momentum", range=Range(ge=0, lt=1))
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)", range=Range(ge=0, le=BIG))


@dataclass
class TrainConfig:
    steps: int = opt(200, "training steps", range=COUNT)
    seed: int = opt(0, "seed for data order, sampling and initialisation", range=Range(ge=0, le=2**32 - 1))
    output_dir: str = opt("", "run folder (default: runs/<time>-<baseline>-<schedule>)")
    eval_every: int = opt(25, "evaluate every this many steps (and at the start and the end); "
                          "0 = only at the start and the end", range=COUNT0)
    eval_samples: int = opt(4, "samples per held-out prompt for the sampled accuracy", range=COUNT)
    eval_greedy: bool = opt(True, "also measure greedy accuracy")
    save_every: int = opt(50, "checkpoint every this many steps (and at the end); 0 = only at the end",
                          range=COUNT0)
    keep_checkpoints: int = opt(2, "how many recent checkpoints to keep", range=COUNT)
    max_bad_steps: int = opt(5, "stop after this many consecutive steps skipped for NaN/Inf", range=COUNT)
    tensorboard: bool = opt(False, "also log to TensorBoard")
    wandb: bool = opt(False, "also log to Weights & Biases (offline mode unless WANDB_MODE says otherwise)")
    plots: bool = opt(True, "write PNG plots to the run folder at the end")
    threads: int = opt(0, "torch CPU threads (0 = the cores other work leaves free at the start: torch's own "
                       "count less the busy cores, at least 1; OMP_NUM_THREADS, if set, wins)",
                       range=Range(ge=0, le=MAX_THREADS))


@dataclass
class DistributedConfig:
    strategy: str = opt("none", "how ranks started by torchrun (or oblr train --nproc K) share the model: none "
                        "(one process), ddp (replicas), fsdp (FSDP2 shards; torch.distributed.checkpoint "
                        "checkpoints, consolidated weights at the end)",
                        choices="oblr.distributed.parallel:PARALLEL")
    backend: str = opt("auto", "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")
    timeout_s: float = opt(600.0, "collective timeout: a dead rank stops the others after this long",
                           range=Range(gt=0, le=BIG))
    options: dict = opt({}, "options of the strategy, e.g. {param_dtype: bfloat16} for fsdp (parameters "
                            "all-gathered and used in bf16, gradients reduced in float32) or {bucket_mb: 25}; "
                            "checked against the strategy's signature", options_of="strategy")


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
