"""``OBLRGRPOTrainer``: TRL's ``GRPOTrainer`` with OBLR-PO's exact weighted baseline and SNR learning rate.

Whose code: oblr's -- the update core's call on each generation batch (advantages, w_i, the folded
gradient, the SNR lr, the ``oblr/*`` metrics); TRL's -- ``GRPOTrainer``'s generation, rewards, training loop,
logging, checkpointing and (under DeepSpeed) loss and backward. It hooks into them through private TRL,
transformers and DeepSpeed names, each listed with the version checked in docs/integrations_private_api.md.

Used exactly like ``GRPOTrainer`` (same arguments) with an :class:`~oblr.integrations.trl.OBLRGRPOConfig`.
What changes, per generation batch (``_generate_and_score_completions``, after TRL has generated and
rewarded the completions): the local rows (whole groups; the config guarantees it) go through oblr's
update core, :func:`oblr.update.accumulate_policy_gradient` (the function ``oblr train`` and its
data-parallel step call) -- one forward and one activation-only backward per micro-batch of whole groups
(``per_device_train_batch_size`` rows) gives the exact ``w_i`` of the policy being trained, the advantages
of ``oblr_baseline`` (leave-one-out within each group) and, from the same records:

- without DeepSpeed (one process or DDP): the weighted gradient itself is written into ``.grad`` (the
  folded backward: TRL's own loss forward/backward is skipped; ``training_step`` only generates),
  summed over processes with one all-reduce; then ``||gbar||^2`` of the synchronised gradient and S, V,
  SNR from the per-prompt norms (all-reduced), by :func:`oblr.distributed.step.step_statistics` as in
  ``oblr train`` on ranks (float64), and the lr is set before the optimizer step;
- with DeepSpeed (ZeRO-1/2/3): TRL's loss and backward run with oblr's advantages (DeepSpeed owns the
  gradient); the per-prompt norms are all-reduced at generation time and the lr is set from DeepSpeed's
  pre-clip global gradient norm in a pre-step hook of the inner optimizer, before its update.

KL and nucleus (no DeepSpeed): ``beta > 0`` is oblr's KL term, not TRL's per-token one: the loss adds
``beta * sum_i c_i KL_i`` with ``KL_i`` the sequence k3 KL (:func:`oblr.losses.sequence_kl`, the summed
per-token ``exp(d) - d - 1``, ``d = ref - logp``) and ``c_i = 1 / (generation_batch_size x
max_completion_length)`` the dr_grpo factor, so ``beta`` weighs the same per-token k3 as in TRL's dr_grpo
loss; the reference is TRL's (``ref_model``, or the peft model with adapters disabled); the KL gradient is in
the per-prompt gradients S and V are computed from, and w_i stays ``c_i^2 ||s_i||^2``. ``top_p < 1``: tokens
are scored (w_i, the gradient, the KL) under the nucleus the sampler used (``temperature`` then ``top_p``).

Every rank sets the same lr on its optimizer every optimizer step. The schedule (:mod:`.lr`, the trainer's
learning-rate half) is the trainer's ``lr_scheduler`` (saved and restored with checkpoints). Metrics go to TRL's
logs under ``oblr/``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import use_adapter

from oblr.distributed.collectives import all_reduce_grads, all_reduce_sum
from oblr.gradnorm import make_book
from oblr.losses import BatchTotals, sequence_scale
from oblr.update import UpdateSettings, accumulate_policy_gradient, trainable_params

from .config import OBLRGRPOConfig
from .lr import LearningRateMixin


@dataclass
class GenerationBatch:
    """This process's rows of one TRL generation batch, as the update core takes them. Rows prompt-major:
    row ``k*G + j`` is completion j of prompt k."""

    input_ids: torch.Tensor       # [B, T] prompt (left-padded) then completion (right-padded)
    attention_mask: torch.Tensor  # [B, T]
    response_mask: torch.Tensor   # [B, T] 1 on completion tokens that enter the loss
    rewards: torch.Tensor         # [n, G]
    seq_scale: torch.Tensor       # [B] c_i: TRL's loss is -sum_i A_i c_i l_i (dr_grpo, times vLLM's ratio)

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)


class _AdapterOffReference:
    """Callable like a causal LM: ``model(**kw)`` with the peft adapters disabled (TRL's ``use_adapter``; the
    adapter named ``ref`` when the model has one), i.e. the reference TRL uses for a peft model."""

    def __init__(self, model, peft_model):
        self.model, self.peft_model = model, peft_model

    def __call__(self, **kwargs):
        name = "ref" if "ref" in self.peft_model.peft_config else None
        with use_adapter(self.peft_model, adapter_name=name):
            return self.model(**kwargs)

    def __getattr__(self, name):  # config, get_output_embeddings, named_modules, ... (the chunked output layer)
        if name in ("model", "peft_model"):
            raise AttributeError(name)
        return getattr(self.model, name)


class OBLRGRPOTrainer(LearningRateMixin, GRPOTrainer):
    """``GRPOTrainer`` whose advantages, gradient and learning rate are OBLR-PO's. See the module docstring."""

    _tag_names = ["trl", "grpo", "oblr"]

    def __init__(self, model, reward_funcs=None, args: OBLRGRPOConfig | None = None, *pargs, **kwargs):
        if not isinstance(args, OBLRGRPOConfig):
            raise TypeError(f"OBLRGRPOTrainer needs args=OBLRGRPOConfig(...), got {type(args).__name__}")
        if kwargs.get("rollout_func") is not None:
            raise ValueError("OBLRGRPOTrainer: rollout_func is not supported: completions generated outside the "
                             "policy being trained cannot be checked to be on-policy; use TRL's generation (or vLLM)")
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        if self._is_vlm:
            raise ValueError("OBLRGRPOTrainer: vision-language models are not supported (no per-sequence "
                             "gradient-norm rules for vision towers); use a text model")
        if args.oblr_logit_chunk_tokens:
            from oblr.logprobs import check_chunkable

            try:
                check_chunkable(getattr(self.model.config, "model_type", None), "oblr_logit_chunk_tokens")
            except ValueError as e:
                raise ValueError(f"OBLRGRPOTrainer: {e}") from None
        if self.is_fsdp_enabled:
            raise ValueError("OBLRGRPOTrainer: FSDP is not supported (untested: accelerate does not apply FSDP on "
                             "a CPU-only machine, where oblr is tested); use "
                             "DeepSpeed ZeRO-3 (accelerate config with a deepspeed_plugin)")
        if args.activation_checkpointing and self.is_deepspeed_enabled and args.deepspeed_plugin.zero_stage == 3:
            raise ValueError("OBLRGRPOTrainer: activation_checkpointing=True is not supported under DeepSpeed ZeRO-3 "
                             "(untested there, and TRL forces reentrant checkpointing for peft models); use "
                             "activation_checkpointing=False or ZeRO-1/2")
        # the engine the update core will build (oblr.gradnorm.ENGINES): fails now, naming the module, if a layer
        # has no rule
        make_book(self.model, engine=args.oblr_checkpointed_engine)
        self._oblr_fold = not self.is_deepspeed_enabled
        self._oblr_check_kl()
        self._oblr_rewards_per_func = None
        if self.is_deepspeed_enabled and args.oblr_snr_lr and args.oblr_lr_schedule == "auto":
            raise ValueError("OBLRGRPOTrainer: oblr_lr_schedule='auto' is not supported under DeepSpeed (it reads "
                             "the parameters' full .grad, which ZeRO partitions); use oblr_lr_schedule='snr'")
        if self.is_deepspeed_enabled and self._oblr_schedule_has("needs_step_kl"):
            raise ValueError("OBLRGRPOTrainer: oblr_lr_schedule='kl' is not supported under DeepSpeed (its step KL "
                             "is measured by oblr's forward pass after the update, which ZeRO's partitioned "
                             "weights do not run untested); use oblr_lr_schedule='snr' or no DeepSpeed")
        self._oblr_controller = None  # an oblr.schedules controller (snr, snr_adam, auto, kl) once the scheduler exists
        self._oblr_kl_round = None  # kl: (GenerationBatch, old log-probs, UpdateSettings) of the step being taken
        self._oblr_pending: tuple[torch.Tensor, int] | None = None  # (sum_k ||g_k||^2, N) awaiting ||gbar||^2
        self._oblr_round_loss = None
        self.oblr_last_round = None  # (GenerationBatch, UpdateResult) of the last generation batch (tests, debugging)

    # ------------------------------------------------------------------ one generation batch
    def _oblr_check_kl(self) -> None:
        if not self._oblr_fold and self.beta != 0.0:
            raise ValueError(f"OBLRGRPOTrainer: beta={self.beta} is not supported under DeepSpeed (TRL's own loss "
                             f"would run with its own KL term and reference log-probs); use beta=0.0 or no DeepSpeed")

    def _oblr_reference(self, model):
        """The frozen reference of the KL term, as TRL builds it: ``self.ref_model`` (full fine-tuning) or, for a
        peft model, the same model with its adapters off (or its ``ref`` adapter when it has one)."""
        if self.ref_model is not None:
            return self.ref_model
        return _AdapterOffReference(model, self.accelerator.unwrap_model(self.model))

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._oblr_rewards_per_func = rewards_per_func  # [B over all processes, reward functions]
        return rewards_per_func

    def _oblr_batch(self, out: dict) -> GenerationBatch:
        B, G = out["completion_ids"].shape[0], self.num_generations
        rows = slice(self.accelerator.process_index * B, (self.accelerator.process_index + 1) * B)
        per_func = self._oblr_rewards_per_func[rows]
        rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(dim=1)
        unscorable = torch.isnan(per_func).all(dim=1)  # every reward function returned None: reward 0
        self._metrics["train"]["oblr/unscorable_count"].append(float(unscorable.sum()))
        rewards = torch.where(unscorable, torch.zeros_like(rewards), rewards)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        # c_i of TRL's dr_grpo loss: oblr's seq_sum_const over the generation batch at the completion limit
        scale = sequence_scale(loss_mask, "seq_sum_const", max_len=self.max_completion_length,
                               totals=BatchTotals(self.args.generation_batch_size, 0.0, loss_mask.shape[-1]))
        if "importance_sampling_ratio" in out:  # vLLM, sequence-level modes only (config): one ratio per row
            scale = scale * out["importance_sampling_ratio"].reshape(B).to(torch.float32)
        return GenerationBatch(
            input_ids=torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1),
            attention_mask=torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1),
            response_mask=torch.cat([torch.zeros_like(out["prompt_mask"]), loss_mask], dim=1),
            rewards=rewards.view(B // G, G).to(torch.float32),
            seq_scale=scale,
        )

    @contextmanager
    def _oblr_core_model(self):
        """The unwrapped model the update core runs on. With activation checkpointing on (never with ZeRO-3, refused
        in ``__init__``) it is the model as it is, checkpointing included, so the core picks the checkpointed engine
        ``oblr_checkpointed_engine`` names (:func:`oblr.gradnorm.make_book`); TRL's ``unwrap_model_for_generation``
        would switch checkpointing off inside and re-enable it without its kwargs. Otherwise TRL's context (under ZeRO-3 it gathers the weights)."""
        if self.args.activation_checkpointing:
            yield self.accelerator.unwrap_model(self.model_wrapped)
            return
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as model:
            yield model

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if not self.model.training:  # evaluation: TRL's own advantages and loss
            return out
        self._oblr_check_kl()
        t0 = time.perf_counter()
        batch = self._oblr_batch(out)
        G = self.num_generations
        settings = UpdateSettings(baseline=self.args.oblr_baseline, temperature=self.temperature, top_p=self.top_p,
                                  kl_coef=float(self.beta), micro_batch_groups=max(1, self.args.per_device_train_batch_size // G),
                                  need_snr=self._oblr_schedule_has("needs_snr"), assemble_grad=self._oblr_fold,
                                  logit_chunk_tokens=self.args.oblr_logit_chunk_tokens,
                                  checkpointed_engine=self.args.oblr_checkpointed_engine)
        n_prompts = self.args.generation_batch_size // G
        with self._oblr_core_model() as model:
            res = accumulate_policy_gradient(model, batch, batch.rewards, settings, seq_scale=batch.seq_scale,
                                             n_prompts=n_prompts, autocast=self.accelerator.autocast,
                                             ref_model=self._oblr_reference(model) if self.beta else None)
        self.oblr_last_round = (batch, res)
        if self._oblr_schedule_has("needs_step_kl"):
            self._oblr_kl_round = (batch, res.old_logprobs, settings)
        m_core = res.metrics
        w = res.estimate.weights
        w = w.reshape(-1) if w is not None else torch.zeros(0, device=res.advantages.device)
        n_tok = batch.response_mask.double().sum()
        dev = res.advantages.device
        stats = torch.stack([
            res.per_prompt_sq_norms.double().sum() if res.per_prompt_sq_norms is not None
            else torch.zeros((), dtype=torch.float64, device=dev),
            m_core["baseline/fallback_count"].double().to(dev), w.double().sum(),
            torch.tensor(float(w.numel()), dtype=torch.float64, device=dev),
            m_core["train/entropy"].double().to(dev) * n_tok.clamp(min=1), n_tok,
        ])
        stats = all_reduce_sum(stats)  # identity on one process
        if self._oblr_fold:
            all_reduce_grads(trainable_params(self.model))  # what DDP's backward would have done
        if self.args.oblr_snr_lr:
            self._oblr_pending = (stats[0], n_prompts)
            if self._oblr_fold:
                self._oblr_set_lr()
        out["advantages"] = res.advantages.reshape(-1).to(out["advantages"].dtype)
        self._oblr_round_loss = m_core["optim/loss"] * self.accelerator.num_processes
        m = self._metrics["train"]
        m["oblr/fallback_count"].append(float(stats[1]))
        if res.estimate.weights is not None:
            m["oblr/w_mean"].append(float(stats[2] / stats[3].clamp(min=1)))
        if "actor/kl" in m_core:  # token mean of k3 over this process's rows
            m["oblr/kl"].append(float(m_core["actor/kl"]))
        m["oblr/time_norms"].append(time.perf_counter() - t0)
        if self._oblr_fold:  # TRL's loss forward (which logs the entropy) does not run
            m["entropy"].append(float(stats[4] / stats[5].clamp(min=1)))
        return out

    # ------------------------------------------------------------------ the training step
    def training_step(self, model, inputs, num_items_in_batch=None):
        if not self._oblr_fold:  # DeepSpeed: TRL's loss and backward with oblr's advantages
            return super().training_step(model, inputs, num_items_in_batch)
        t0 = time.perf_counter()
        model.train()
        generate_every = self.args.steps_per_generation * self.num_iterations
        new_round = self._step % generate_every == 0 or self._buffered_inputs is None
        self._prepare_inputs(inputs)  # a new round generates and folds the whole gradient into .grad
        loss = self._oblr_round_loss if new_round else torch.zeros_like(self._oblr_round_loss)
        self._step += 1
        self._current_train_step_time += time.perf_counter() - t0
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return loss.detach().to(self.args.device)
