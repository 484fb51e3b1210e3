"""``OBLRGRPOConfig``: TRL's ``GRPOConfig`` plus the OBLR-PO options, with the settings that would bias it refused.

Whose code: oblr's -- the ``oblr_*`` fields, the refused settings (:data:`RULES`) and their check in
``__post_init__``; TRL's -- ``GRPOConfig`` and all its other fields, read as public dataclass fields. No
private TRL name is touched here (docs/integrations_private_api.md).

Added fields (everything else is TRL's, used exactly as in ``GRPOConfig``):

- ``oblr_baseline`` (default ``"oblr"``): any name in :func:`oblr.estimators.available_estimators`;
- ``oblr_snr_lr`` (default True): set the learning rate every optimizer step by the gradient SNR,
  ``lr = learning_rate * S / (S + V/N)`` (``learning_rate`` is eta_max), :class:`oblr.snr.SNRLearningRate`;
- ``oblr_eta_min`` (default 0) and ``oblr_snr_ema`` (default 0.9): the lr floor and the EMA factor on S and V;
- ``oblr_lr_schedule`` (default ``"snr"``): the schedule oblr applies when ``oblr_snr_lr`` is True, ``snr`` (the
  paper's rule, ``learning_rate`` is eta_max), ``snr_adam`` (the same factor counting Adam's momentum,
  :class:`oblr.snr.AdamSNRLearningRate`; Adam-family ``optim`` only) or ``auto`` (the measured step scale of
  :mod:`oblr.step_scale`,
  ``learning_rate`` is its initial guess; ``learning_rate="auto"`` selects it with the guess 1e-3) or ``kl``
  (the lr that moves the policy by a target per-token KL each step, :mod:`oblr.kl_rate`, ``oblr train``'s
  default; ``learning_rate`` is the guess of its scale, the first step a probe at a tenth of it; the KL is
  measured after each optimizer step by one forward pass without gradients over the step's rows; not under
  DeepSpeed); ``oblr_schedule_options``: that schedule's own options (``auto``: max_change, scale_ema, probe,
  confidence; ``kl``: target, max_change, kl_ema, probe, prompts_per_step, which defaults to the generation
  batch's prompts). The same schedule objects as ``oblr train`` (:mod:`oblr.schedules`), fed the same
  unclamped statistics.

- ``oblr_logit_chunk_tokens`` (default 0): the update's output layer in chunks of this many positions
  (:func:`oblr.logprobs.chunked_response_logprobs`, ``model.logit_chunk_tokens`` of ``oblr train``); with exact
  norms it needs ``activation_checkpointing=True``. TRL's own log-prob passes (old and reference log-probs
  when it computes them) are TRL's and keep whole logits.

- ``oblr_checkpointed_engine`` (default ``"two_pass"``): the exact-norm engine with activation checkpointing on
  (``algorithm.checkpointed_engine`` of ``oblr train``, :data:`oblr.gradnorm.CHECKPOINTED_ENGINES`): ``two_pass``
  (:class:`oblr.gradnorm.TwoPassBookKeeper`, nothing kept per layer, a second backward) or ``recompute``
  (:class:`oblr.gradnorm.RecomputeBookKeeper`, one backward, up to B x the trainable parameters of float32
  per-row gradients kept: LoRA and small models); another value needs ``activation_checkpointing=True``.

Activation checkpointing (``activation_checkpointing=True``, or its deprecated alias ``gradient_checkpointing``) is
accepted non-reentrant: ``use_reentrant=False`` is added to ``activation_checkpointing_kwargs`` when not given, and
``use_reentrant=True`` is refused; the update core then runs on the engine ``oblr_checkpointed_engine`` names
(the two-pass norm engine by default). It stays off by default (TRL turns it on), since it costs recomputation.

Defaults that differ from ``GRPOConfig`` are the compatible values (``loss_type="dr_grpo"``,
``scale_rewards="none"``, ``lr_scheduler_type="constant"``, ``router_aux_loss_coef=0.0``) and
``gradient_checkpointing=False``, so ``OBLRGRPOConfig(output_dir=..., per_device_train_batch_size=...,
num_generations=...)`` works as it stands. A value that would make the estimator biased or S and V wrong
(:data:`RULES`, read from TRL 1.16's ``GRPOConfig``/``GRPOTrainer``; docs/trl.md explains each) is refused
in ``__post_init__`` with one line naming the setting and the value to use.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields

from trl import GRPOConfig

from oblr.estimators import available_estimators
from oblr.gradnorm.methods import CHECKPOINTED_ENGINES
from oblr.schedules import check_schedule_options, schedule_options

#: schedules oblr can apply inside TRL (snr, snr_adam, auto read the step's S and V; kl the KL the step moved the
#: policy by); fixed schedules are TRL's own lr_scheduler_type
TRL_SCHEDULES = ("snr", "snr_adam", "auto", "kl")
#: GRPOConfig's learning_rate default (what an unset learning_rate means)
TRL_DEFAULT_LR = next(f.default for f in fields(GRPOConfig) if f.name == "learning_rate")
#: the initial guess of the auto schedule when ``learning_rate="auto"`` (oblr train's default optim.lr)
AUTO_GUESS = 1e-3

#: generation_kwargs keys that change the distribution the completions are sampled from
SAMPLING_KEYS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty",
    "encoder_repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "suppress_tokens",
    "begin_suppress_tokens", "sequence_bias", "do_sample", "num_beams", "num_beam_groups", "diversity_penalty",
    "penalty_alpha", "guidance_scale", "logits_processor", "renormalize_logits", "forced_bos_token_id",
    "forced_eos_token_id", "min_new_tokens", "min_length", "exponential_decay_length_penalty", "top_h",
    "presence_penalty", "frequency_penalty", "min_tokens", "logit_bias", "allowed_token_ids", "bad_words",
})

_OFF_POLICY = ("oblr scores tokens under the tempered distribution truncated by top_p only, so the completions "
               "would be scored off-policy")


@dataclass(frozen=True)
class Rule:
    """One refused setting: ``ok(cfg)`` is False for a value that would bias the estimator or S and V."""

    setting: str
    ok: Callable[[GRPOConfig], bool]
    use: str
    why: str


RULES: tuple[Rule, ...] = (
    Rule("loss_type", lambda c: c.loss_type == "dr_grpo", "loss_type='dr_grpo'",
         "only dr_grpo divides the loss by a constant (batch x max_completion_length); grpo, bnpo, dapo and "
         "cispo divide by sampled lengths or token counts and sapo, luspo, vespo change the objective, which "
         "biases the estimator and the per-sequence weights"),
    Rule("max_completion_length", lambda c: c.max_completion_length is not None,
         "an integer max_completion_length", "it is the constant of the dr_grpo normalisation"),
    Rule("scale_rewards", lambda c: c.scale_rewards == "none", "scale_rewards='none' (oblr_baseline='grpo' "
         "compares with GRPO's std-scaled advantage)", "dividing advantages by a reward std biases the "
         "estimator; the advantage is formed by oblr_baseline"),
    Rule("multi_objective_aggregation", lambda c: c.multi_objective_aggregation == "sum_then_normalize",
         "multi_objective_aggregation='sum_then_normalize'",
         "normalize_then_sum scales each reward function by its group std"),
    Rule("beta", lambda c: c.beta >= 0.0, "beta >= 0 (0: no KL term)", "it is the coefficient of a KL penalty"),
    Rule("num_iterations", lambda c: c.num_iterations == 1, "num_iterations=1",
         "later iterations reuse the batch off-policy (importance ratios, clipping), while w_i, the baseline "
         "and S, V describe the on-policy gradient"),
    Rule("steps_per_generation", lambda c: c.steps_per_generation == c.gradient_accumulation_steps,
         "steps_per_generation=None and generation_batch_size=None (one generation batch per optimizer step)",
         "with more steps per generation batch, groups are split across optimizer steps and later steps are "
         "off-policy"),
    Rule("per_device_train_batch_size",
         lambda c: c.per_device_train_batch_size * c.steps_per_generation % c.num_generations == 0,
         "per_device_train_batch_size x gradient_accumulation_steps a multiple of num_generations",
         "each process gets per_device_train_batch_size x steps_per_generation completions of the generation "
         "batch, and a group of num_generations completions must not be split across processes"),
    Rule("mask_truncated_completions", lambda c: not c.mask_truncated_completions,
         "mask_truncated_completions=False", "dropping completions by their own outcome biases the estimator"),
    Rule("top_entropy_quantile", lambda c: c.top_entropy_quantile == 1.0, "top_entropy_quantile=1.0",
         "masking tokens by entropy makes a sequence's gradient something other than c_i A_i s_i"),
    Rule("entropy_coef", lambda c: c.entropy_coef == 0.0, "entropy_coef=0.0",
         "the entropy bonus's gradient is not part of the estimator S and V describe"),
    Rule("use_adaptive_entropy", lambda c: not c.use_adaptive_entropy, "use_adaptive_entropy=False",
         "the entropy bonus's gradient is not part of the estimator S and V describe"),
    Rule("off_policy_mask_threshold", lambda c: c.off_policy_mask_threshold is None,
         "off_policy_mask_threshold=None", "masking sequences by advantage and KL is an outcome-dependent selection"),
    Rule("delta", lambda c: c.delta is None or c.delta > 1.0, "delta=None (or > 1)",
         "delta <= 1 clips the on-policy ratio 1 and zeroes the gradient"),
    Rule("top_p", lambda c: 0.0 < c.top_p <= 1.0 and (c.top_p == 1.0 or not (c.use_vllm and
                                                                       c.vllm_importance_sampling_correction)),
         "top_p in (0, 1], and top_p=1.0 with vLLM's importance-sampling correction",
         "TRL's vLLM importance ratio divides vLLM's nucleus log-probs by its own untruncated ones, which "
         "biases the per-row factor c_i"),
    Rule("top_k", lambda c: not c.top_k, "top_k=0", "top-k sampling draws from a truncated distribution; "
         + _OFF_POLICY),
    Rule("min_p", lambda c: c.min_p is None, "min_p=None", "min-p sampling draws from a truncated distribution; "
         + _OFF_POLICY),
    Rule("repetition_penalty", lambda c: c.repetition_penalty == 1.0, "repetition_penalty=1.0",
         "the penalty changes the sampling distribution; " + _OFF_POLICY),
    Rule("generation_kwargs", lambda c: not (set(c.generation_kwargs or {}) & SAMPLING_KEYS),
         "generation_kwargs without sampling keys (use temperature=...)",
         "these keys change the sampling distribution; " + _OFF_POLICY),
    Rule("vllm_importance_sampling_mode",
         lambda c: not (c.use_vllm and c.vllm_importance_sampling_correction)
         or c.vllm_importance_sampling_mode in ("sequence_mask", "sequence_truncate"),
         "vllm_importance_sampling_mode='sequence_mask' or 'sequence_truncate'",
         "token-level ratios weight the tokens of a sequence differently, so its gradient is no longer a "
         "multiple of its score s_i"),
    Rule("activation_checkpointing_kwargs", lambda c: not c.activation_checkpointing
         or (c.activation_checkpointing_kwargs or {}).get("use_reentrant") is not True,
         "use_reentrant=False (the default oblr sets when it is not given)",
         "reentrant checkpointing recomputes layers outside autograd's graph, where the checkpointed norm engines "
         "cannot see them"),
    Rule("fp16", lambda c: not c.fp16, "bf16=True or float32",
         "oblr writes unscaled gradients, which fp16 loss scaling would divide again"),
    Rule("torch_compile", lambda c: not c.torch_compile, "torch_compile=False",
         "the per-layer hooks of the norm pass are not verified under torch.compile"),
    Rule("router_aux_loss_coef", lambda c: not c.router_aux_loss_coef, "router_aux_loss_coef=0.0",
         "the MoE load-balancing loss's gradient is not part of the estimator S and V describe"),
    Rule("parallelism_config", lambda c: c.parallelism_config is None, "parallelism_config=None",
         "tensor/context-parallel layers have no per-sequence gradient-norm rule"),
    Rule("fsdp", lambda c: not c.fsdp, "DeepSpeed ZeRO-3 instead of FSDP (or oblr train with distributed.strategy=fsdp)",
         "the path through accelerate's FSDP is untested: accelerate does not apply FSDP on a CPU-only machine, "
         "where oblr is tested"),
    Rule("lr_scheduler_type", lambda c: not c.oblr_snr_lr or str(getattr(c.lr_scheduler_type, "value",
                                                                         c.lr_scheduler_type)) == "constant",
         "lr_scheduler_type='constant' (or oblr_snr_lr=False to use a schedule)",
         "the SNR rule sets the learning rate every step (learning_rate is its eta_max)"),
    Rule("oblr_baseline", lambda c: c.oblr_baseline in available_estimators(),
         f"one of {', '.join(available_estimators())}", "it is not a registered estimator"),
    Rule("oblr_snr_ema", lambda c: 0.0 <= c.oblr_snr_ema < 1.0, "a value in [0, 1)", "it is an EMA factor"),
    Rule("oblr_lr_schedule", lambda c: c.oblr_lr_schedule in TRL_SCHEDULES, "oblr_lr_schedule='snr', 'snr_adam', 'auto' or 'kl' "
         "(fixed schedules: oblr_snr_lr=False and TRL's lr_scheduler_type)", "it is not a schedule oblr applies in TRL"),
    Rule("optim", lambda c: not c.oblr_snr_lr or c.oblr_lr_schedule != "snr_adam"
         or "adam" in str(getattr(c.optim, "value", c.optim)).lower(),
         "an Adam-family optim (adamw_torch, ...) with oblr_lr_schedule='snr_adam' (or oblr_lr_schedule='snr')",
         "snr_adam counts Adam's momentum, which this optimizer does not have"),
    Rule("oblr_schedule_options", lambda c: c.oblr_lr_schedule not in TRL_SCHEDULES
         or check_schedule_options(c.oblr_lr_schedule, c.oblr_schedule_options or {}) is None,
         "the chosen schedule's own options (" + "; ".join(f"{n}: {', '.join(schedule_options(n)) or 'none'}"
                                                          for n in TRL_SCHEDULES) + ")",
         "they are not options of the chosen schedule"),
    Rule("learning_rate", lambda c: isinstance(c.learning_rate, (int, float)) and not isinstance(c.learning_rate, bool)
         and math.isfinite(c.learning_rate) and c.learning_rate > 0,
         "a positive number (or 'auto')", "it is the SNR rule's eta_max or the auto or kl schedule's initial guess"),
    Rule("oblr_eta_min", lambda c: math.isfinite(c.oblr_eta_min) and 0.0 <= c.oblr_eta_min <= c.learning_rate,
         "a value in [0, learning_rate]", "it is the floor of the SNR learning rate"),
    Rule("oblr_logit_chunk_tokens", lambda c: isinstance(c.oblr_logit_chunk_tokens, int)
         and not isinstance(c.oblr_logit_chunk_tokens, bool) and c.oblr_logit_chunk_tokens >= 0,
         "an integer >= 0 (0 = whole logits)", "it is a number of positions"),
    Rule("oblr_logit_chunk_tokens", lambda c: not c.oblr_logit_chunk_tokens
         or _weights(c.oblr_baseline) != "logit_energy",
         "oblr_logit_chunk_tokens=0 with this baseline", "the baseline weighs outputs by their whole logits"),
    Rule("oblr_logit_chunk_tokens", lambda c: not c.oblr_logit_chunk_tokens or bool(c.activation_checkpointing)
         or not (c.oblr_snr_lr or _weights(c.oblr_baseline) == "exact"),
         "activation_checkpointing=True with it (or oblr_logit_chunk_tokens=0)",
         "with exact norms the chunked output layer needs a checkpointed engine (the one-pass engine keeps every "
         "chunk's logit gradients anyway)"),
    Rule("oblr_checkpointed_engine", lambda c: c.oblr_checkpointed_engine in CHECKPOINTED_ENGINES.names(),
         f"one of {', '.join(CHECKPOINTED_ENGINES.names())}", "it is not a checkpointed exact-norm engine"),
    Rule("oblr_checkpointed_engine", lambda c: c.oblr_checkpointed_engine == "two_pass"
         or bool(c.activation_checkpointing),
         "activation_checkpointing=True with it (or oblr_checkpointed_engine='two_pass')",
         "it is the exact-norm engine used with activation checkpointing, which is off"),
)


def _weights(baseline: str):
    """The weights an estimator needs (None for an unknown name: refused by its own rule)."""
    from oblr.estimators import get_estimator

    try:
        return get_estimator(baseline).weights
    except (KeyError, ValueError):
        return None


def _show(value) -> str:
    """A one-line rendering of a setting's value (enums as their string, objects by type)."""
    value = getattr(value, "value", value)
    if value is None or isinstance(value, (str, int, float, bool, dict, list, tuple)):
        return " ".join(repr(value).split())
    return f"{type(value).__name__}(...)"


def refusal(cfg: GRPOConfig) -> str | None:
    """The one-line message for the first refused setting of ``cfg``, or None when all are compatible."""
    for r in RULES:
        if not r.ok(cfg):
            return f"OBLRGRPOConfig: {r.setting}={_show(getattr(cfg, r.setting, None))} is not supported: " \
                   f"{r.why}; use {r.use}"
    return None


@dataclass
class OBLRGRPOConfig(GRPOConfig):
    """``GRPOConfig`` for :class:`~oblr.integrations.trl.OBLRGRPOTrainer`. See the module docstring."""

    oblr_baseline: str = field(default="oblr", metadata={
        "help": "baseline/advantage estimator (oblr.estimators.available_estimators(); default oblr: exact "
                "gradient-weighted leave-one-out)"})
    oblr_snr_lr: bool = field(default=True, metadata={
        "help": "set the lr every optimizer step by the gradient SNR: learning_rate * S / (S + V/N)"})
    oblr_eta_min: float = field(default=0.0, metadata={"help": "floor of the SNR learning rate"})
    oblr_snr_ema: float = field(default=0.9, metadata={
        "help": "EMA factor on S and V (0 = current batch only, as in the paper)"})
    oblr_lr_schedule: str = field(default="snr", metadata={
        "help": "snr: learning_rate x S / (S + V/N) (learning_rate is eta_max); snr_adam: the same with V counted "
                "after Adam's momentum (S / (S + kappa V/N)); auto: the measured step scale "
                "(learning_rate is the initial guess; not the paper's rule); kl: the lr that moves the policy by a "
                "target per-token KL each step (learning_rate is a guess of the scale; oblr train's default; "
                "not the paper's rule; not under DeepSpeed)"})
    oblr_schedule_options: dict = field(default_factory=dict, metadata={
        "help": "options of oblr_lr_schedule (auto: max_change, scale_ema, probe, confidence; kl: target, "
                "max_change, kl_ema, probe, prompts_per_step)"})
    oblr_logit_chunk_tokens: int = field(default=0, metadata={
        "help": "apply the output layer this many positions at a time in the update, each chunk recomputed in "
                "the backward (no [B, T, vocab] logits held; 0 = whole logits; with exact norms needs "
                "activation_checkpointing=True)"})
    oblr_checkpointed_engine: str = field(default="two_pass", metadata={
        "help": "exact-norm engine with activation_checkpointing=True: two_pass (nothing kept per layer, a second "
                "backward) or recompute (one backward; keeps up to B x the trainable parameters of float32 "
                "per-row gradients: LoRA and small models)"})

    # TRL defaults replaced by the compatible values
    loss_type: str = field(default="dr_grpo", metadata={"help": "must be dr_grpo (constant normalisation)"})
    scale_rewards: str = field(default="none", metadata={"help": "must be none (no std scaling)"})
    gradient_checkpointing: bool | None = field(default=False, metadata={
        "help": "deprecated alias of activation_checkpointing (off by default: on, the two-pass norm engine "
                "recomputes the layers twice)"})
    lr_scheduler_type: str = field(default="constant", metadata={
        "help": "constant with the SNR learning rate; any with oblr_snr_lr=False"})
    router_aux_loss_coef: float | None = field(default=0.0, metadata={"help": "must be 0 (MoE aux loss)"})

    def __post_init__(self):
        if isinstance(self.learning_rate, str) and self.learning_rate.strip().lower() == "auto":
            self.oblr_lr_schedule, self.learning_rate = "auto", AUTO_GUESS
        super().__post_init__()
        if self.activation_checkpointing:  # non-reentrant unless the user said otherwise (refused below)
            kw = dict(self.activation_checkpointing_kwargs or {})
            kw.setdefault("use_reentrant", False)
            self.activation_checkpointing_kwargs = self.gradient_checkpointing_kwargs = kw
        msg = refusal(self)
        if msg is not None:
            raise ValueError(msg)
        if self.oblr_snr_lr and self.oblr_lr_schedule in ("snr", "snr_adam") and self.learning_rate == TRL_DEFAULT_LR:
            warnings.warn(f"OBLRGRPOConfig: learning_rate={TRL_DEFAULT_LR:g} (TRL's default) is the SNR rule's eta_max, "
                          f"the largest lr it can set; set it above the constant rate GRPO would use (docs/trl.md, "
                          f"'Which learning_rate to set') or learning_rate='auto'", UserWarning, stacklevel=2)
