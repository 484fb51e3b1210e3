"""A memory plan for ``oblr train``: checkpointing on or off (for exact norms: the one-pass, the recompute or
the two-pass engine) and the micro-batch, chosen from :mod:`oblr.memory_model` under a per-device budget
(torch-free).

``algorithm.memory_plan`` (the registry :data:`MEMORY_PLANS`) says what the planner may choose:

- ``none`` (default): no planning; the run uses ``model.activation_checkpointing``,
  ``algorithm.checkpointed_engine`` and ``algorithm.micro_batch_groups`` as given (today's behaviour, bit for bit);
- ``auto``: exact-norm methods (the book-keeping path: exact weights, or S and V for the schedule) may use
  the one-pass :class:`~oblr.gradnorm.BookKeeper` (no checkpointing), the
  :class:`~oblr.gradnorm.RecomputeBookKeeper` (checkpointing on, one backward, per-row contributions kept) or the
  two-pass :class:`~oblr.gradnorm.TwoPassBookKeeper` (checkpointing on, nothing kept per layer, a second
  backward); methods without exact norms (GRPO family) keep ``model.activation_checkpointing`` as set and only
  the micro-batch is chosen;
- ``one_pass`` / ``recompute`` / ``two_pass``: that engine only (``recompute`` and ``two_pass`` turn activation
  checkpointing on and set ``algorithm.checkpointed_engine``; ``one_pass`` with
  ``model.activation_checkpointing=true`` is a contradiction, refused by the config).

The budget is ``algorithm.memory_budget_gb`` (decimal GB per device, i.e. per rank), or, on CUDA without one,
the free memory of the device before the model loads. Choice rule (:func:`choose_plan`): among the allowed
engines, the largest micro-batch (whole prompt groups, at most the rank's groups and at most a
``micro_batch_groups`` the user set) whose predicted peak fits; on a tie, the cheaper engine: one-pass (no
recomputation), then recompute (one recomputation), then two-pass (a recomputation and a second backward). So a
generous budget gives the one-pass engine on the whole batch, a tighter one the recompute engine (whose kept
per-row gradients are small for LoRA and small models), a tighter one the two-pass engine, a tighter one a
smaller micro-batch, and a budget no plan meets is refused with the smallest budget that would work
(:class:`PlanError`, one line).

Predicted peak per device = resident state + :func:`oblr.memory_model.step_peak_bytes` of one micro-batch of
``groups * G`` sequences of ``prompt + max_new_tokens`` tokens (with ``model.logit_chunk_tokens``, the output
layer in chunks: refused with the one-pass engine, so ``auto`` then plans checkpointed engines only); when the
rank's batch takes several micro-batches, the later ones start with the earlier ones' gradients held, and the
prediction counts them (``grads_live``). Resident: parameters in ``model.dtype`` and
the optimizer's state (AdamW: two moments in the parameters' dtype; SGD with momentum: one; without: none),
plus a frozen reference copy when ``algorithm.kl_coef > 0``; under FSDP2 the sharded share of these plus the
gathered layers of :func:`oblr.memory_model.resident_bytes`. Not modelled: generation (the rollout engine's
KV cache), LoRA's smaller optimizer state (the full model's state is assumed: conservative), allocator
overhead; docs/scale.md says what the memory model itself leaves out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from oblr import memory_model as mm
from oblr.checks import ConfigError
from oblr.config import uses_exact_norms
from oblr.registry import Registry

GB = 10**9

#: memory plan name -> the exact-norm engines the planner may choose among, cheapest first (empty: no planning;
#: for methods without exact norms the user's ``model.activation_checkpointing`` is kept whatever the plan)
MEMORY_PLANS = Registry("memory plan")
MEMORY_PLANS.register("none", ())
MEMORY_PLANS.register("auto", ("one_pass", "recompute", "two_pass"))
MEMORY_PLANS.register("one_pass", ("one_pass",))
MEMORY_PLANS.register("recompute", ("recompute",))
MEMORY_PLANS.register("two_pass", ("two_pass",))

ENGINES = ("one_pass", "recompute", "two_pass")  # cheapest first: the tie-break of choose_plan
CHECKPOINTED = {"one_pass": False, "recompute": True, "two_pass": True}
ENGINE_NAMES = {"one_pass": "one-pass", "recompute": "recompute", "two_pass": "two-pass"}
MODEL_KEYS = {"one_pass": "oblr", "recompute": "oblr_recompute", "two_pass": "oblr_ckpt"}  # oblr.memory_model
HINT_CHUNK = 512  # the model.logit_chunk_tokens a refusal without chunking suggests
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(ConfigError):
    """No plan fits the budget, or the budget is not a budget (one line, like every config refusal)."""


@dataclass(frozen=True)
class Plan:
    """The chosen plan. ``micro_batch_groups`` is the value the run uses (0 = the rank's whole batch)."""

    exact_norms: bool
    checkpointing: bool
    groups: int                # groups per micro-batch (>= 1)
    micro_batch_groups: int    # groups, or 0 when that is all of the rank's groups
    sequences: int             # groups * G
    tokens: int                # prompt + response tokens per sequence
    peak_bytes: int
    resident_bytes: int
    budget_bytes: int
    budget_source: str         # "algorithm.memory_budget_gb" or "free CUDA memory"
    logit_chunk: int = 0       # model.logit_chunk_tokens the prediction assumed (0 = whole logits)
    checkpointed_engine: str = "two_pass"  # algorithm.checkpointed_engine of the run (with checkpointing)

    @property
    def engine(self) -> str:
        if self.exact_norms:
            return ENGINE_NAMES[self.checkpointed_engine if self.checkpointing else "one_pass"]
        return f"checkpointing {'on' if self.checkpointing else 'off'} (no exact norms)"

    def line(self) -> str:
        """``plan: two-pass, micro-batch 2 groups, predicted peak 61.0 GB of 80.0`` (and what it counts)."""
        chunk = f", output layer in chunks of {self.logit_chunk} positions" if self.logit_chunk else ""
        return (f"plan: {self.engine}, micro-batch {self.groups} group{'s' * (self.groups != 1)} "
                f"({self.sequences} sequences of {self.tokens} tokens){chunk}, predicted peak {_gb(self.peak_bytes)} GB "
                f"of {_gb(self.budget_bytes)} per device ({self.budget_source}; resident "
                f"{_gb(self.resident_bytes)} GB)")

    def as_dict(self) -> dict:
        return {**asdict(self), "engine": self.engine}


def _gb(n: float) -> str:
    """Decimal GB, 3 significant digits (61.2, 0.0123)."""
    return f"{n / GB:.3g}"


def _gb_up(n: float) -> float:
    """``n`` bytes in GB rounded up to 0.1 (a budget the planner then accepts)."""
    return math.ceil(n / GB * 10 - 1e-9) / 10


def shape_from_hf_config(conf: dict) -> mm.Shape:
    """The :class:`~oblr.memory_model.Shape` of a decoder from its Hugging Face ``config.json`` (no weights).
    Keys: ``num_hidden_layers``, ``hidden_size``, ``intermediate_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (default: the heads), ``head_dim`` (default: hidden / heads), ``vocab_size``,
    ``tie_word_embeddings`` (default false). A config without them raises :class:`PlanError`."""
    conf = conf.get("text_config", conf) if isinstance(conf.get("text_config"), dict) else conf
    need = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    missing = [k for k in need if not isinstance(conf.get(k), int)]
    if missing:
        raise PlanError(f"config key 'algorithm.memory_plan': the model's config.json lacks {', '.join(missing)}, "
                        "so its memory cannot be predicted (the memory model needs a Qwen3/Llama-style decoder); "
                        "set algorithm.memory_plan=none")
    heads = conf["num_attention_heads"]
    head_dim = conf.get("head_dim") or conf["hidden_size"] // heads
    return mm.Shape(layers=conf["num_hidden_layers"], hidden=conf["hidden_size"],
                    intermediate=conf["intermediate_size"], heads=heads,
                    kv_heads=conf.get("num_key_value_heads") or heads, head_dim=int(head_dim),
                    vocab=conf["vocab_size"], tied=bool(conf.get("tie_word_embeddings", False)))


def optimizer_state_bytes(optimizer: str, momentum: float, param_bytes: int) -> int:
    """Optimizer state per trainable parameter: AdamW (and any optimizer not known here) two moments, SGD one
    momentum buffer when ``momentum > 0``, else none."""
    if optimizer == "sgd":
        return param_bytes if momentum > 0 else 0
    return 2 * param_bytes


def resident(shape: mm.Shape, *, param_bytes: int, optim_bytes: int, world: int = 1, sharded: bool = False,
             reference: bool = False) -> int:
    """What a device holds before a step: parameters and optimizer state (a frozen reference copy too when
    ``reference``); sharded (FSDP2): their ``1/world`` share plus the gathered layers and embedding of
    :func:`oblr.memory_model.resident_bytes`. Gradients are counted in the step's peak."""
    copies = param_bytes * (2 if reference else 1)
    if sharded:
        return mm.resident_bytes(shape, world, param_bytes=copies, grad_bytes=0, optim_bytes=optim_bytes)
    return mm.n_params(shape) * (copies + optim_bytes)


def _engine(e) -> str:
    """An engine name; ``False`` / ``True`` (the checkpointing setting) mean ``one_pass`` / ``two_pass``."""
    if isinstance(e, bool):
        return "two_pass" if e else "one_pass"
    if e not in CHECKPOINTED:
        raise ValueError(f"unknown engine {e!r}; known: {', '.join(ENGINES)}")
    return e


def predicted_peak(shape: mm.Shape, *, exact_norms: bool, checkpointing: bool | str, sequences: int, tokens: int,
                   param_bytes: int, resident_bytes: int, world: int = 1, sharded: bool = False,
                   logit_chunk: int = 0, head_trainable: bool = True, lora_rank: int = 0,
                   lora_targets: tuple = mm.LORA_TARGETS, split: bool = False, groups: int = 0) -> int:
    """Resident state plus the memory model's step peak for one micro-batch of ``sequences``; ``checkpointing``:
    an engine name (``one_pass``, ``recompute``, ``two_pass``) or the checkpointing setting (False / True =
    one-pass / two-pass; without exact norms only whether checkpointing is on counts). ``lora_rank`` /
    ``lora_targets``: LoRA adapters, which the recompute engine's kept contributions are priced for (the other
    plans count the full model's gradients: conservative). ``split``: the rank's batch takes more than one
    micro-batch, so the later ones run with the earlier ones' gradients held (``grads_live``). ``groups``: prompt
    groups in the micro-batch (the exact-norm assembly's group sums; 0: one per sequence, conservative)."""
    e = _engine(checkpointing)
    key = MODEL_KEYS[e] if exact_norms else ("grpo_ckpt" if CHECKPOINTED[e] else "grpo")
    extra = {}
    if key == "oblr_recompute" and lora_rank and lora_targets and set(lora_targets) <= {n for n, *_ in mm.linears(shape)}:
        extra = {"lora_rank": lora_rank, "lora_targets": tuple(lora_targets)}  # other targets: priced as full
    return resident_bytes + mm.step_peak_bytes(shape, key, sequences, tokens, act_bytes=param_bytes,
                                               grad_bytes=param_bytes, grad_shards=world if sharded else 1,
                                               logit_chunk=logit_chunk, head_trainable=head_trainable,
                                               grads_live=split, groups=groups, **extra)


def choose_plan(shape: mm.Shape, *, budget_bytes: float, exact_norms: bool, allowed: tuple,
                groups: int, group_size: int, tokens: int, param_bytes: int, resident_bytes: int,
                world: int = 1, sharded: bool = False, max_groups: int = 0,
                budget_source: str = "algorithm.memory_budget_gb", logit_chunk: int = 0,
                head_trainable: bool = True, lora_rank: int = 0, lora_targets: tuple = mm.LORA_TARGETS) -> Plan:
    """The plan (module docstring) for a rank with ``groups`` prompt groups of ``group_size`` sequences of
    ``tokens`` tokens; ``allowed``: the engines it may use (``one_pass``, ``recompute``, ``two_pass``; False /
    True stand for one-pass / two-pass, and without exact norms for checkpointing off / on); ``max_groups``: a
    micro-batch the user set (0 = none). Raises :class:`PlanError` (one line) for a budget of 0 or below, one
    below the resident state, or one no plan meets -- then with the smallest budget, rounded up to 0.1 GB, at
    which this function returns a plan."""
    key = "config key 'algorithm.memory_budget_gb'"
    if not allowed:
        raise ValueError("allowed must name at least one engine")
    allowed = tuple(sorted(dict.fromkeys(_engine(e) for e in allowed), key=ENGINES.index))
    if not exact_norms:  # only the checkpointing setting counts
        allowed = tuple(dict.fromkeys("two_pass" if CHECKPOINTED[e] else "one_pass" for e in allowed))
    if not budget_bytes > 0:
        raise PlanError(f"{key}: the budget must be > 0 GB, got {budget_bytes / GB:g} ({budget_source})")
    if budget_bytes < resident_bytes:
        raise PlanError(f"{key}: {budget_bytes / GB:g} GB per device ({budget_source}) is below the model's own "
                        f"resident size, {_gb(resident_bytes)} GB (parameters and optimizer state"
                        f"{', sharded over ' + str(world) + ' ranks' if sharded else ''}); "
                        f"no micro-batch can run")
    top = min(groups, max_groups) if max_groups > 0 else groups

    def peak(engine: str, g: int, chunk: int = logit_chunk) -> int:
        return predicted_peak(shape, exact_norms=exact_norms, checkpointing=engine, sequences=g * group_size,
                              tokens=tokens, param_bytes=param_bytes, resident_bytes=resident_bytes, world=world,
                              sharded=sharded, logit_chunk=chunk, head_trainable=head_trainable, lora_rank=lora_rank,
                              lora_targets=lora_targets, split=g < groups, groups=g)

    def _chunk_hint() -> str:
        """What chunked logits would need, when they are off, a checkpointed engine is allowed and they would help
        (the allowed checkpointed engine that needs least with them: two-pass or recompute)."""
        ckpt = [e for e in allowed if CHECKPOINTED[e]]
        if logit_chunk or not ckpt or tokens - 1 <= HINT_CHUNK:
            return ""
        e = min(ckpt, key=lambda e: peak(e, 1, HINT_CHUNK))
        chunked = peak(e, 1, HINT_CHUNK)
        if chunked >= min(peak(x, 1) for x in allowed):
            return ""
        return (f" (with the output layer in chunks, model.logit_chunk_tokens={HINT_CHUNK}, {ENGINE_NAMES[e]} needs "
                f"{_gb(chunked)} GB: docs/scale.md)" if exact_norms else
                f" (with the output layer in chunks, model.logit_chunk_tokens={HINT_CHUNK}, it needs {_gb(chunked)} GB: "
                "docs/scale.md)")

    best = None  # (groups, the cheaper engine) is the order of preference
    for e in allowed:
        g = next((g for g in range(top, 0, -1) if peak(e, g) <= budget_bytes), 0)
        if g and (best is None or g > best[0]):
            best = (g, e)
    if best is None:
        need = min(peak(e, 1) for e in allowed)
        per = ", ".join(f"{ENGINE_NAMES[e] if exact_norms else ('checkpointed' if CHECKPOINTED[e] else 'not checkpointed')} "
                        f"{_gb(peak(e, 1))} GB" for e in allowed)
        raise PlanError(f"{key}: no plan fits {budget_bytes / GB:g} GB per device ({budget_source}): one group of "
                        f"{group_size} sequences of {tokens} tokens needs {per}; the smallest budget that works is "
                        f"{_gb_up(need):.1f} GB" + _chunk_hint())
    g, e = best
    return Plan(exact_norms=exact_norms, checkpointing=CHECKPOINTED[e], groups=g,
                micro_batch_groups=0 if g == groups else g, sequences=g * group_size, tokens=tokens,
                peak_bytes=peak(e, g), resident_bytes=resident_bytes, budget_bytes=int(budget_bytes),
                budget_source=budget_source, logit_chunk=logit_chunk,
                checkpointed_engine=e if CHECKPOINTED[e] and exact_norms else "two_pass")


# ------------------------------------------------------------------------------ at the start of a run
def checkpointing_support(hf_config) -> bool | None:
    """``supports_gradient_checkpointing`` of the causal-LM class a Hugging Face config builds (read off the
    class: no weights); None when the class is not known without loading (remote code)."""
    from transformers import AutoModelForCausalLM

    mapping = AutoModelForCausalLM._model_mapping
    if type(hf_config) not in mapping:
        return None
    return bool(getattr(mapping[type(hf_config)], "supports_gradient_checkpointing", False))


def check_checkpointing(hf_config) -> None:
    """Refuse ``model.activation_checkpointing`` (or a plan that needs it) on a model class that cannot
    checkpoint, in one line, before the weights load."""
    if checkpointing_support(hf_config) is False:
        from transformers import AutoModelForCausalLM

        cls = AutoModelForCausalLM._model_mapping[type(hf_config)]
        raise ConfigError(f"config key 'model.activation_checkpointing': {cls.__qualname__} does not support "
                          "activation checkpointing (its supports_gradient_checkpointing is not True); "
                          "set it false (and algorithm.memory_plan one_pass or none)")


def prompt_tokens(tokenizer, prompts: list[str]) -> int:
    """The longest prompt in tokens (every prompt counted: the step's sample is not known in advance)."""
    return max((len(ids) for ids in tokenizer(list(prompts))["input_ids"]), default=0)


def plan_run(cfg, hf_config, *, prompt_len: int, world: int, device) -> Plan | None:
    """The plan of ``cfg`` (None for ``memory_plan: none``): the shape from ``hf_config`` (a
    ``PretrainedConfig``, no weights), ``prompt_len`` tokens of prompt, this launch's ``world`` size and
    ``device`` (a ``torch.device``: on CUDA without a budget, its free memory is the budget)."""
    a, m = cfg.algorithm, cfg.model
    choices = MEMORY_PLANS.get(a.memory_plan)
    if not choices:
        return None
    shape = shape_from_hf_config(hf_config.to_dict())
    if a.memory_budget_gb is not None:
        budget, source = a.memory_budget_gb * GB, "algorithm.memory_budget_gb"
    elif getattr(device, "type", str(device)) == "cuda":
        import torch

        budget, source = torch.cuda.mem_get_info(device)[0], "free CUDA memory"
    else:
        raise PlanError(f"config key 'algorithm.memory_budget_gb': algorithm.memory_plan {a.memory_plan!r} on "
                        f"{device} needs a budget (the free memory is read on CUDA only); set "
                        "algorithm.memory_budget_gb")
    exact = uses_exact_norms(cfg)
    sharded = cfg.distributed.strategy == "fsdp"
    if exact:
        allowed = tuple(e for e in choices
                        if CHECKPOINTED[e] or not (m.activation_checkpointing or m.logit_chunk_tokens))
        if a.norms_method != "auto":  # the recompute engine's kept contributions are priced for auto only
            allowed = tuple(e for e in allowed if e != "recompute")
        if checkpointing_support(hf_config) is False:  # a checkpointed engine alone: refused below
            allowed = tuple(e for e in allowed if not CHECKPOINTED[e]) or allowed
    else:
        allowed = ("two_pass" if m.activation_checkpointing else "one_pass",)
    if any(CHECKPOINTED[e] for e in allowed):
        check_checkpointing(hf_config)
    param_bytes = DTYPE_BYTES[m.dtype]
    res = resident(shape, param_bytes=param_bytes, world=world, sharded=sharded, reference=a.kl_coef > 0,
                   optim_bytes=optimizer_state_bytes(cfg.optim.optimizer, cfg.optim.momentum, param_bytes))
    return choose_plan(shape, budget_bytes=budget, exact_norms=exact, allowed=allowed,
                       groups=cfg.rollout.prompts_per_step // world, group_size=cfg.rollout.group_size,
                       tokens=prompt_len + cfg.rollout.max_new_tokens, param_bytes=param_bytes, resident_bytes=res,
                       world=world, sharded=sharded, max_groups=a.micro_batch_groups, budget_source=source,
                       logit_chunk=m.logit_chunk_tokens, head_trainable=m.lora_rank == 0, lora_rank=m.lora_rank,
                       lora_targets=tuple(m.lora_targets))


def apply_plan(cfg, plan: Plan | None):
    """``cfg`` with the plan's checkpointing, checkpointed engine and micro-batch (a copy; ``cfg`` itself, as
    saved in the run folder and compared on resume, keeps what the user wrote). No plan: ``cfg`` unchanged."""
    if plan is None:
        return cfg
    import copy

    out = copy.deepcopy(cfg)
    out.model.activation_checkpointing = plan.checkpointing
    if plan.exact_norms and plan.checkpointing:
        out.algorithm.checkpointed_engine = plan.checkpointed_engine
    out.algorithm.micro_batch_groups = plan.micro_batch_groups
    return out
