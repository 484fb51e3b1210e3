"""Typed training configuration: dataclasses with a help line per field, YAML files, dotted overrides.

Everything is validated before any model loads: an unknown key, a wrong type or a bad value raises
:class:`ConfigError` with one line that names every offending key and says how to fix it (no problem is
dropped: all overrides are checked and all their problems reported). A choice-valued key names the
registry (or table) its choices come from (``opt(..., choices="module:NAME")``), so ``oblr train --help``,
validation errors and ``oblr tasks`` list the same names, and a name registered by user code
(``oblr train --plugin MODULE``) is accepted without editing this module. Every numeric key declares its
:class:`Range` beside its field (``opt(..., range=Range(...))``); a value must also be finite. The
dict-valued keys ``task.options``, ``algorithm.baseline_options``, ``algorithm.schedule_options`` and ``rollout.engine_options`` are
checked against the signature of the registered task, estimator or engine (:func:`oblr.checks.check_options`):
option names, simple types, ``Literal`` choices and ``Annotated[..., Range(...)]`` ranges, so a plugin's
options are checked the same way. This module is the schema, its parsing and :func:`validate`; the value and
option checks are :mod:`oblr.checks`. YAML is read through :mod:`oblr.safe_load` (alias bombs and deep
nesting refused).

    cfg = load_config("configs/qwen3-4b-gsm8k.yaml", ["algorithm.baseline=rloo", "train.steps=50"])
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oblr.checks import (  # noqa: F401  (the checks' names, re-exported: plugins import them from here)
    BIG,
    COUNT,
    COUNT0,
    FLOAT32_MAX,
    INT_MAX,
    MAX_THREADS,
    ConfigError,
    Range,
    _check_value,
    _coerce,
    _label,
    _num,
    _raise,
    _short,
    _simple,
    _type_name,
    check_flags,
    check_options,
    option_problems,
)


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
                                       "arithmetic model oblr builds and caches on first use")
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
                     "ema": "set optim.snr_ema", "grad_clip": "set optim.grad_clip"}


@dataclass
class AlgorithmConfig:
    baseline: str = opt("oblr", "baseline/advantage estimator", choices="oblr.estimators:ESTIMATORS")
    lr_schedule: str = opt("snr", "learning-rate schedule (snr = OBLR-PO; auto = measured step scale, optim.lr its initial guess; measured to work with AdamW, not SGD: docs/algorithm.md)", choices="oblr.schedules:SCHEDULES")
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
    lr: float = opt(1e-3, "peak learning rate (eta_max of the SNR rule, or the constant/cosine peak)",
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


# ----------------------------------------------------------------------------------------------- parsing
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _from_dict(cls, data: Any, prefix: str, problems: list[str]):
    """``cls(**data)`` with every unknown key and wrong type appended to ``problems`` (and left out)."""
    if not isinstance(data, dict):
        problems.append(f"config section '{prefix.rstrip('.') or '<root>'}' must be a mapping, got {_short(data)}")
        return cls()
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            problems.append(f"unknown config key '{key}'{hint}")
            continue
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _from_dict(tp, v, key + ".", problems)
            continue
        try:
            kwargs[k] = _coerce(v, tp, key)
        except ConfigError as e:
            problems.append(str(e))
    return cls(**kwargs)


def _parse_scalar(text: str, key: str):
    """Parse the value of a ``key=value`` override with YAML rules (so 1e-3, true, [a, b] work); text that
    is not YAML stays text, YAML beyond the limits of :mod:`oblr.safe_load` is refused."""
    from oblr.safe_load import InputError, InputLimitError, load_yaml

    if text == "":
        return ""
    try:
        return load_yaml(text, f"override {key}")
    except InputLimitError as e:
        raise ConfigError(str(e)) from None
    except InputError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply dotted ``section.key=value`` overrides to a nested dict (returns the same dict). Every override
    is applied or reported: the problems of all of them are raised together as one :class:`ConfigError`."""
    problems = []
    for ov in overrides:
        if "=" not in ov:
            problems.append(f"override {ov!r} is not of the form section.key=value (e.g. optim.lr=1e-3)")
            continue
        key, text = ov.split("=", 1)
        parts = key.strip().split(".")
        node = data
        try:
            for p in parts[:-1]:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"override {ov!r}: '{p}' is not a section")
            node[parts[-1]] = _parse_scalar(text, key.strip())
        except ConfigError as e:
            problems.append(str(e))
    _raise(problems)
    return data


def config_from_dict(data: dict) -> Config:
    """The validated :class:`Config` of a nested dict; all problems in one :class:`ConfigError`."""
    problems: list[str] = []
    cfg = _from_dict(Config, {} if data is None else data, "", problems)
    _raise(problems)
    validate(cfg)
    return cfg


def read_config_file(path: str | Path) -> dict:
    """The mapping of sections in a YAML config file, read through :mod:`oblr.safe_load`."""
    from oblr.safe_load import InputError, load_yaml_file

    p = Path(path)
    try:
        data = load_yaml_file(p, what="config file")
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    except InputError as e:
        raise ConfigError(f"config file {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply dotted overrides, type-check and validate."""
    data = read_config_file(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return config_from_dict(data)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# ------------------------------------------------------------------------------------------- validation
_DEVICE = re.compile(r"auto|(cpu|cuda|mps)(:\d+)?")


def _choices(f: dataclasses.Field) -> tuple[str, list[str]] | None:
    """``(kind, names)`` of a choice-valued field (None for other fields); imports the registry's module."""
    table = _table(f)
    if table is None:
        return None
    if hasattr(table, "names"):  # a Registry
        return table.kind, table.names()
    return f.name, list(table)


def _table(f: dataclasses.Field):
    ref = f.metadata.get("choices")
    if ref is None:
        return None
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _sections():
    """``(section name, section dataclass)`` of :class:`Config`."""
    return [(sec.name, _hints(Config)[sec.name]) for sec in dataclasses.fields(Config)]


def choice_fields() -> list[tuple[str, str, list[str]]]:
    """``[(dotted key, kind, names)]`` for every choice-valued key of the config."""
    out = []
    for sec, cls in _sections():
        for f in dataclasses.fields(cls):
            c = _choices(f)
            if c is not None:
                out.append((f"{sec}.{f.name}", *c))
    return out


def range_fields() -> list[tuple[str, Range]]:
    """``[(dotted key, Range)]`` for every numeric key (all of them have one)."""
    return [(f"{sec}.{f.name}", f.metadata["range"]) for sec, cls in _sections() for f in dataclasses.fields(cls)
            if "range" in f.metadata]


# the optional metric sinks of a run: config key of TrainConfig -> the package it needs (oblr's extra of that name)
SINK_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def sink_problems(train: TrainConfig) -> list[tuple[str, str]]:
    """``[(key, why)]`` for each optional sink that ``train`` turns on whose package is not installed here;
    checked with ``importlib.util.find_spec`` (no import), so a refusal costs nothing and ``--help`` stays light."""
    out = []
    for name, package in SINK_PACKAGES.items():
        if getattr(train, name) and importlib.util.find_spec(package) is None:
            out.append((f"train.{name}", f"needs the '{package}' package, which this environment lacks: "
                                         f"pip install 'oblr[{package}]' (or leave train.{name}=false)"))
    return out


# ------------------------------ the memory plan's keys, between them (the plan itself: oblr.train.plan)
def uses_exact_norms(cfg) -> bool:
    """Whether a step of ``cfg`` takes the book-keeping path (exact weights, or S and V for the schedule or
    ``algorithm.track_snr``) -- the one the exact-norm engines serve (:mod:`oblr.update`)."""
    from oblr.estimators import get_estimator
    from oblr.schedules import SCHEDULES

    a = cfg.algorithm
    return (get_estimator(a.baseline).weights == "exact" or a.track_snr
            or bool(getattr(SCHEDULES.get(a.lr_schedule), "needs_snr", False)))


def plan_problems(cfg) -> list[tuple[str, str]]:
    """``[(key, problem)]`` of the planning keys that need no model (called by :func:`validate` once
    ``algorithm.memory_plan`` is a registered name; the plan itself is :mod:`oblr.train.plan`)."""
    a, out = cfg.algorithm, []
    plan, budget = a.memory_plan, a.memory_budget_gb
    if a.checkpointed_engine == "recompute" and a.norms_method == "loop":
        out.append(("algorithm.checkpointed_engine", "'recompute' is not used with algorithm.norms_method=loop: the "
                    "loop reference runs one backward per sequence on the one-pass engine; set norms_method=auto "
                    "(or ghost / materialize), or leave this key at two_pass"))
    if plan == "none":
        if budget is not None and budget > 0:  # a budget out of range is reported by its range
            out.append(("algorithm.memory_budget_gb", f"a budget ({budget:g} GB) is set but algorithm.memory_plan is "
                        "'none'; set algorithm.memory_plan=auto (or one_pass / recompute / two_pass) to plan under "
                        "it"))
        if a.checkpointed_engine != "two_pass" and not cfg.model.activation_checkpointing:
            out.append(("algorithm.checkpointed_engine", f"{a.checkpointed_engine!r} is the engine used with "
                        "activation checkpointing, but model.activation_checkpointing is false; set it true (or "
                        f"algorithm.memory_plan={a.checkpointed_engine}), or leave this key at two_pass"))
        return out + chunk_problems(cfg)
    if plan in ("one_pass", "recompute", "two_pass"):
        try:
            exact = uses_exact_norms(cfg)
        except (KeyError, ValueError):  # an unknown baseline or schedule is reported on its own
            exact = True
        if not exact:
            out.append(("algorithm.memory_plan", f"{plan!r} chooses an exact-norm engine, but baseline "
                        f"{a.baseline!r} with lr_schedule {a.lr_schedule!r} computes no exact norms; use "
                        "memory_plan=auto (it then chooses the micro-batch) and set model.activation_checkpointing"))
    if plan == "one_pass" and cfg.model.activation_checkpointing:
        out.append(("algorithm.memory_plan", "'one_pass' keeps every layer's activations, but "
                    "model.activation_checkpointing is true; use recompute, two_pass or auto, or turn checkpointing "
                    "off"))
    if plan == "recompute" and a.norms_method != "auto":
        out.append(("algorithm.memory_plan", f"'recompute' is priced for algorithm.norms_method=auto (which keeps "
                    f"per-row gradients where they are smaller than their factors); with {a.norms_method!r} it "
                    "keeps every weight's factors, which the memory model does not price; use norms_method=auto, "
                    "or memory_plan two_pass"))
    if plan in ("auto", "one_pass", "recompute", "two_pass") and a.checkpointed_engine not in ("two_pass", plan):
        out.append(("algorithm.checkpointed_engine", f"{a.checkpointed_engine!r} contradicts algorithm.memory_plan "
                    f"{plan!r}, which sets the engine itself; leave this key at two_pass"
                    + (f" (or set memory_plan={a.checkpointed_engine} to use that engine)" if plan == "auto" else "")))
    return out + chunk_problems(cfg)


def chunk_problems(cfg) -> list[tuple[str, str]]:
    """``[(key, problem)]`` of ``model.logit_chunk_tokens`` against the other keys (no model needed)."""
    from oblr.estimators import get_estimator

    a, m = cfg.algorithm, cfg.model
    if not m.logit_chunk_tokens:
        return []
    key = "model.logit_chunk_tokens"
    try:
        exact, weights = uses_exact_norms(cfg), get_estimator(a.baseline).weights
    except (KeyError, ValueError):  # an unknown baseline or schedule is reported on its own
        return []
    if weights == "logit_energy":
        return [(key, f"baseline {a.baseline!r} weighs outputs by their whole logits, which chunking never "
                 "holds; set it to 0")]
    if exact and a.norms_method == "loop":
        return [(key, "the loop reference (algorithm.norms_method=loop) runs on the one-pass engine, and chunked "
                 "logits need the two-pass engine; use another norms_method, or set it to 0")]
    if exact and a.memory_plan == "one_pass":
        return [(key, "chunked logits need a checkpointed engine (the one-pass engine keeps every chunk's logit "
                 "gradients anyway); use algorithm.memory_plan recompute, two_pass or auto, or set it to 0")]
    if exact and not m.activation_checkpointing and a.memory_plan not in ("recompute", "two_pass", "auto"):
        return [(key, "with exact norms chunked logits need a checkpointed engine: set "
                 "model.activation_checkpointing=true (or algorithm.memory_plan recompute / two_pass / auto), or set "
                 "it to 0")]
    return []


def validate(cfg: Config) -> None:
    """Value checks that need no model or data: choices, ranges, the options of dict-valued keys, and the
    rules between keys. Raises one ConfigError naming every offending key."""
    problems: list[str] = []

    def bad(key: str, msg: str) -> None:
        problems.append(f"config key '{key}': {msg}")

    valid_choice = {}
    for key, kind, names in choice_fields():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        valid_choice[key] = value in names
        if not valid_choice[key]:
            bad(key, f"unknown {kind} {_short(value)}; registered: {', '.join(names)}")
    for key, rng in range_fields():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        problem = None if value is None else rng.problem(value)  # None: an optional key left unset
        if problem:
            bad(key, problem)
    for sec, cls in _sections():  # the options of dict-valued keys, against the chosen entry's signature
        section = getattr(cfg, sec)
        for f in dataclasses.fields(cls):
            of = f.metadata.get("options_of")
            if of is None or not valid_choice.get(f"{sec}.{of}"):
                continue
            registry = _table(next(g for g in dataclasses.fields(cls) if g.name == of))
            checked, found = option_problems(registry, getattr(section, of), getattr(section, f.name),
                                             f"{sec}.{f.name}", f.metadata.get("reserved"))
            setattr(section, f.name, checked)
            problems.extend(found)
    r, a, o = cfg.rollout, cfg.algorithm, cfg.optim
    if not _DEVICE.fullmatch(cfg.model.device):
        bad("model.device", f"{cfg.model.device!r} is not auto, cpu, cuda, cuda:N or mps")
    if valid_choice["rollout.engine"]:
        from oblr.rollout import check_engine

        try:
            check_engine(r.engine)  # e.g. vllm without its package: refused here, before a model loads
        except ValueError as e:
            bad("rollout.engine", str(e))
    for key, why in sink_problems(cfg.train):  # e.g. train.tensorboard without its package: refused before a run
        bad(key, why)  # folder is made or a model loads
    if valid_choice["algorithm.lr_schedule"]:
        from oblr.schedules import SCHEDULES

        if (getattr(SCHEDULES.get(a.lr_schedule), "needs_snr", False) or a.track_snr) and r.prompts_per_step < 2:
            bad("rollout.prompts_per_step", "S and V (SNR schedule, algorithm.track_snr) estimate the noise across "
                "prompts; the step needs at least 2 prompts")
    if o.eta_min > o.lr and not Range().problem(o.eta_min):
        bad("optim.eta_min", f"must be in [0, optim.lr = {o.lr:g}], got {o.eta_min:g}")
    if not (len(o.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                      for b in o.betas)):
        bad("optim.betas", f"must be two numbers in [0, 1), got {_short(o.betas)}")
    if valid_choice["algorithm.memory_plan"]:
        for key, msg in plan_problems(cfg):
            bad(key, msg)
    if cfg.distributed.backend not in ("auto", "gloo", "nccl"):
        bad("distributed.backend", f"{cfg.distributed.backend!r} is not auto, gloo or nccl")
    _raise(problems)


def config_help() -> str:
    """One line per key: ``section.key (type, default): help [choices | range]``, for ``oblr train --help``."""
    lines = []
    for sec, cls in _sections():
        lines.append(f"{sec}:")
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = _choices(f)
            extra = f" [{' | '.join(choices[1])}]" if choices else ""
            if "range" in f.metadata:
                extra = f" [{f.metadata['range']}]"
            lines.append(f"  {sec}.{f.name} ({_type_name(hints[f.name])}, default {default!r}): "
                         f"{f.metadata.get('help', '')}{extra}")
    return "\n".join(lines)
