"""Typed training configuration: dataclasses with a help line per field, YAML files, dotted overrides.

Everything is validated before any model loads: an unknown key, a wrong type or a bad value raises
:class:`ConfigError` with one message that names the key and says how to fix it. A choice-valued key
names the registry (or table) its choices come from (``opt(..., choices="module:NAME")``), so
``oblr train --help``, validation errors and ``oblr tasks`` list the same names, and a name registered by
user code (``oblr train --plugin MODULE``) is accepted without editing this module.

    cfg = load_config("configs/qwen3-4b-gsm8k.yaml", ["algorithm.baseline=rloo", "train.steps=50"])
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


def opt(default, help: str, **kw):
    """A dataclass field with a help line (shown by ``oblr train --help``). ``choices="module:NAME"`` names
    the :class:`oblr.registry.Registry` (or tuple of names) whose names the value must be one of."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    name_or_path: str = opt("builtin", "Hugging Face checkpoint directory or hub id; 'builtin' = the tiny "
                                       "arithmetic model oblr builds and caches on first use")
    dtype: str = opt("float32", "parameter dtype", choices="oblr.models:DTYPES")
    device: str = opt("auto", "auto | cpu | cuda | cuda:N")
    trust_remote_code: bool = opt(False, "passed to from_pretrained")
    lora_rank: int = opt(0, "train LoRA adapters of this rank instead of all weights (0 = full fine-tuning)")
    lora_alpha: float = opt(16.0, "LoRA alpha")
    lora_targets: list = opt(["q_proj", "k_proj", "v_proj", "o_proj"], "module names LoRA adapts")


@dataclass
class TaskConfig:
    name: str = opt("arithmetic", "task name (see `oblr tasks`)", choices="oblr.tasks:TASKS")
    options: dict = opt({}, "task options passed to the task factory (e.g. difficulty, n_train, template)")
    eval_size: int = opt(200, "held-out prompts used by periodic evaluation (0 = none; capped at the split size)")


@dataclass
class RolloutConfig:
    group_size: int = opt(8, "G: sampled outputs per prompt")
    prompts_per_step: int = opt(16, "N: prompts per training step (N*G sequences per step)")
    max_new_tokens: int = opt(32, "generation length limit")
    temperature: float = opt(1.0, "sampling temperature for training rollouts")
    top_p: float = opt(1.0, "nucleus sampling threshold")
    batch_size: int = opt(256, "sequences generated per batch")
    engine: str = opt("hf", "rollout engine that generates the samples", choices="oblr.rollout:ENGINES")
    engine_options: dict = opt({}, "extra options of the rollout engine's factory, e.g. {memory_fraction: 0.3} "
                                   "for vllm (see docs/rollout.md)")


@dataclass
class AlgorithmConfig:
    baseline: str = opt("oblr", "baseline/advantage estimator", choices="oblr.estimators:ESTIMATORS")
    lr_schedule: str = opt("snr", "learning-rate schedule (snr = OBLR-PO)", choices="oblr.schedules:SCHEDULES")
    aggregation: str = opt("seq_sum_const", "loss aggregation (seq_sum_const is the unbiased one)",
                           choices="oblr.losses:AGGREGATIONS")
    max_len: int = opt(0, "the constant of seq_sum_const (0 = rollout.max_new_tokens)")
    baseline_options: dict = opt({}, "extra options of the estimator, e.g. {scale_std: false} for grpo")
    epochs: int = opt(1, "policy updates per batch of rollouts (>1 uses importance ratios and clipping)")
    clip_eps: float = opt(0.2, "PPO clip range for epochs > 1")
    kl_coef: float = opt(0.0, "weight of the k3 KL penalty to the initial (frozen) policy; 0 = off")
    norms_method: str = opt("auto", "how exact gradient norms are computed (loop = the slow reference)",
                            choices="oblr.gradnorm:NORMS_METHODS")
    track_snr: bool = opt(False, "compute and log S, V, SNR even when the schedule does not use them")
    micro_batch_groups: int = opt(0, "prompt groups per forward/backward micro-batch (0 = all at once)")


@dataclass
class OptimConfig:
    optimizer: str = opt("adamw", "optimizer", choices="oblr.train.optimizers:OPTIMIZERS")
    lr: float = opt(1e-3, "peak learning rate (eta_max of the SNR rule, or the constant/cosine peak)")
    eta_min: float = opt(0.0, "learning-rate floor")
    snr_ema: float = opt(0.9, "EMA factor for S and V in the SNR rule (0 = current batch only, as in the paper; "
                                    "the per-batch estimate is noisy at small N, see docs/algorithm.md)")
    warmup_steps: int = opt(0, "linear warm-up steps")
    weight_decay: float = opt(0.0, "AdamW weight decay")
    betas: list = opt([0.9, 0.99], "AdamW betas")
    momentum: float = opt(0.0, "SGD momentum")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)")


@dataclass
class TrainConfig:
    steps: int = opt(200, "training steps")
    seed: int = opt(0, "seed for data order, sampling and initialisation")
    output_dir: str = opt("", "run folder (default: runs/<time>-<baseline>-<schedule>)")
    eval_every: int = opt(25, "evaluate every this many steps (and at the start and the end); 0 = only at the end")
    eval_samples: int = opt(4, "samples per held-out prompt for the sampled accuracy")
    eval_greedy: bool = opt(True, "also measure greedy accuracy")
    save_every: int = opt(50, "checkpoint every this many steps (and at the end); 0 = only at the end")
    keep_checkpoints: int = opt(2, "how many recent checkpoints to keep")
    max_bad_steps: int = opt(5, "stop after this many consecutive steps skipped for NaN/Inf")
    tensorboard: bool = opt(False, "also log to TensorBoard")
    wandb: bool = opt(False, "also log to Weights & Biases (offline mode unless WANDB_MODE says otherwise)")
    plots: bool = opt(True, "write PNG plots to the run folder at the end")
    threads: int = opt(0, "torch CPU threads (0 = all cores)")


@dataclass
class DistributedConfig:
    strategy: str = opt("none", "how ranks started by torchrun (or oblr train --nproc K) share the model: none "
                        "(one process), ddp (replicas), fsdp (FSDP2 shards; torch.distributed.checkpoint "
                        "checkpoints, consolidated weights at the end)",
                        choices="oblr.distributed.parallel:PARALLEL")
    backend: str = opt("auto", "auto (nccl on CUDA, gloo on CPU) | gloo | nccl")
    timeout_s: float = opt(600.0, "collective timeout: a dead rank stops the others after this long")


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


# ----------------------------------------------------------------------------------------------- parsing
def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp, key: str):
    """Check (and gently coerce: int -> float) ``value`` against the annotation ``tp``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                pass
        raise ConfigError(f"config key '{key}': expected {tp}, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp in (dict, list):
        if isinstance(value, tp):
            return value
    raise ConfigError(f"config key '{key}': expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _from_dict(cls, data: dict, prefix: str = ""):
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix.rstrip('.') or '<root>'}' must be a mapping, got {data!r}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            close = difflib.get_close_matches(k, names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key '{key}'{hint}")
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _from_dict(tp, v, key + ".")
        else:
            kwargs[k] = _coerce(v, tp, key)
    return cls(**kwargs)


def _parse_scalar(text: str):
    """Parse the value of a ``key=value`` override with YAML rules (so 1e-3, true, [a, b] work)."""
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply dotted ``section.key=value`` overrides to a nested dict (returns the same dict)."""
    for ov in overrides:
        if "=" not in ov:
            raise ConfigError(f"override {ov!r} is not of the form section.key=value (e.g. optim.lr=1e-3)")
        key, text = ov.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {ov!r}: '{p}' is not a section")
        node[parts[-1]] = _parse_scalar(text)
    return data


def config_from_dict(data: dict) -> Config:
    cfg = _from_dict(Config, data or {})
    validate(cfg)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply dotted overrides, type-check and validate."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections, got {type(data).__name__}")
    apply_overrides(data, list(overrides or []))
    return config_from_dict(data)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# ------------------------------------------------------------------------------------------- validation
def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")


def _choices(f: dataclasses.Field) -> tuple[str, list[str]] | None:
    """``(kind, names)`` of a choice-valued field (None for other fields); imports the registry's module."""
    ref = f.metadata.get("choices")
    if ref is None:
        return None
    module, _, attr = ref.partition(":")
    table = getattr(importlib.import_module(module), attr)
    if hasattr(table, "names"):  # a Registry
        return table.kind, table.names()
    return f.name, list(table)


def choice_fields() -> list[tuple[str, str, list[str]]]:
    """``[(dotted key, kind, names)]`` for every choice-valued key of the config."""
    out = []
    for sec in dataclasses.fields(Config):
        for f in dataclasses.fields(_hints(Config)[sec.name]):
            c = _choices(f)
            if c is not None:
                out.append((f"{sec.name}.{f.name}", *c))
    return out


def _check_choices(cfg: Config) -> None:
    for key, kind, names in choice_fields():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        _check(value in names, key, f"unknown {kind} {value!r}; registered: {', '.join(names)}")


def validate(cfg: Config) -> None:
    """Value checks that need no model or data. Raises ConfigError naming the key."""
    _check_choices(cfg)
    r, a, o, t = cfg.rollout, cfg.algorithm, cfg.optim, cfg.train
    _check(cfg.model.device == "auto" or cfg.model.device.split(":")[0] in ("cpu", "cuda", "mps"),
           "model.device", f"{cfg.model.device!r} is not auto, cpu, cuda or cuda:N")
    _check(cfg.model.lora_rank >= 0, "model.lora_rank", "must be >= 0")
    _check(r.group_size >= 2, "rollout.group_size", f"must be >= 2 for group baselines, got {r.group_size}")
    _check(r.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1")
    _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1")
    _check(r.temperature > 0, "rollout.temperature", "must be > 0 (training samples; greedy is for eval)")
    _check(0 < r.top_p <= 1, "rollout.top_p", "must be in (0, 1]")
    _check(r.batch_size >= 1, "rollout.batch_size", "must be >= 1")
    from oblr.rollout import check_engine

    try:
        check_engine(r.engine)  # e.g. vllm without its package: refused here, before a model loads
    except ValueError as e:
        _check(False, "rollout.engine", str(e))
    _check(a.max_len >= 0, "algorithm.max_len", "must be >= 0")
    _check(a.epochs >= 1, "algorithm.epochs", "must be >= 1")
    _check(a.clip_eps > 0, "algorithm.clip_eps", "must be > 0")
    _check(a.kl_coef >= 0, "algorithm.kl_coef", "must be >= 0")
    _check(a.micro_batch_groups >= 0, "algorithm.micro_batch_groups", "must be >= 0")
    from oblr.schedules import SCHEDULES

    if getattr(SCHEDULES.get(a.lr_schedule), "needs_snr", False) or a.track_snr:
        _check(r.prompts_per_step >= 2, "rollout.prompts_per_step",
               "S and V (SNR schedule, algorithm.track_snr) estimate the noise across prompts; "
               "the step needs at least 2 prompts")
    _check(o.lr > 0, "optim.lr", f"must be > 0, got {o.lr}")
    _check(0 <= o.eta_min <= o.lr, "optim.eta_min", "must be in [0, optim.lr]")
    _check(0 <= o.snr_ema < 1, "optim.snr_ema", "must be in [0, 1)")
    _check(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    _check(len(o.betas) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in o.betas),
           "optim.betas", f"must be two numbers in [0, 1), got {o.betas}")
    _check(o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 = off)")
    _check(t.steps >= 1, "train.steps", "must be >= 1")
    _check(t.eval_every >= 0, "train.eval_every", "must be >= 0")
    _check(t.eval_samples >= 1, "train.eval_samples", "must be >= 1")
    _check(t.save_every >= 0, "train.save_every", "must be >= 0")
    _check(t.keep_checkpoints >= 1, "train.keep_checkpoints", "must be >= 1")
    _check(t.max_bad_steps >= 1, "train.max_bad_steps", "must be >= 1")
    _check(cfg.task.eval_size >= 0, "task.eval_size", "must be >= 0")
    _check(cfg.distributed.backend in ("auto", "gloo", "nccl"), "distributed.backend",
           f"{cfg.distributed.backend!r} is not auto, gloo or nccl")
    _check(cfg.distributed.timeout_s > 0, "distributed.timeout_s", "must be > 0")


def config_help() -> str:
    """One line per key: ``section.key (type, default): help [choices]``, for ``oblr train --help``."""
    lines = []
    for sec in dataclasses.fields(Config):
        cls = _hints(Config)[sec.name]
        lines.append(f"{sec.name}:")
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = _choices(f)
            extra = f" [{' | '.join(choices[1])}]" if choices else ""
            lines.append(f"  {sec.name}.{f.name} ({_type_name(hints[f.name])}, default {default!r}): "
                         f"{f.metadata.get('help', '')}{extra}")
    return "\n".join(lines)
