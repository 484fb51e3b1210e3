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

Every rank sets the same lr on its optimizer every optimizer step. The SNR controller is the trainer's
``lr_scheduler`` (saved and restored with checkpoints). Metrics go to TRL's logs under ``oblr/``.
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
from oblr.distributed.step import step_statistics
from oblr.gradnorm import make_book
from oblr.losses import BatchTotals, sequence_scale
from oblr.schedules import SCHEDULES, make_lr_controller
from oblr.snr import snr_statistics
from oblr.update import UpdateSettings, accumulate_policy_gradient, step_kl_sums, trainable_params

from .config import OBLRGRPOConfig


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


class _OBLRSchedule:
    """The Trainer's ``lr_scheduler`` when oblr sets the lr (``snr`` or ``auto``, :mod:`oblr.schedules`):
    ``step()`` is a no-op (the controller steps before the optimizer, from the step's statistics),
    ``get_last_lr`` reports the lr it set, state is checkpointed."""

    def __init__(self, controller):
        self.controller = controller

    def step(self, *args, **kwargs) -> None:
        return None

    def get_last_lr(self) -> list[float]:
        return self.controller.get_last_lr()

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


def _innermost_optimizer(opt):
    """The torch optimizer whose ``param_groups`` are stepped (through accelerate/DeepSpeed wrappers)."""
    while isinstance(getattr(opt, "optimizer", None), torch.optim.Optimizer):
        opt = opt.optimizer
    return opt


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


class OBLRGRPOTrainer(GRPOTrainer):
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

    # ------------------------------------------------------------------ learning rate
    def create_scheduler(self, num_training_steps: int, optimizer=None):
        if not self.args.oblr_snr_lr:
            return super().create_scheduler(num_training_steps, optimizer)
        if self.lr_scheduler is None:
            inner = _innermost_optimizer(optimizer if optimizer is not None else self.optimizer)
            if not isinstance(inner, torch.optim.Optimizer):
                raise ValueError(f"OBLRGRPOTrainer: the SNR learning rate needs a torch optimizer, got "
                                 f"{type(inner).__name__} (remove the optimizer section of the DeepSpeed config)")
            a = self.args
            clip = float(a.max_grad_norm) if a.max_grad_norm and a.max_grad_norm > 0 else 0.0
            self._oblr_controller = make_lr_controller(
                a.oblr_lr_schedule, inner, lr=a.learning_rate, eta_min=a.oblr_eta_min, ema=a.oblr_snr_ema,
                warmup_steps=a.get_warmup_steps(num_training_steps), total_steps=num_training_steps, grad_clip=clip,
                **{"prompts_per_step": a.generation_batch_size // self.num_generations,
                   **(a.oblr_schedule_options or {})})
            if self.is_deepspeed_enabled:
                inner.register_step_pre_hook(lambda opt, args, kwargs: self._oblr_lr_from_deepspeed())
            if getattr(self._oblr_controller, "needs_step_kl", False):
                inner.register_step_post_hook(lambda opt, args, kwargs: self._oblr_observe_step_kl())
            self.lr_scheduler = _OBLRSchedule(self._oblr_controller)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def _oblr_schedule_has(self, attribute: str) -> bool:
        """Whether oblr sets the lr with a schedule whose class sets ``attribute`` (``needs_snr``: S and V of
        the step; ``needs_step_kl``: the KL the step moved the policy by), read before the controller exists."""
        return bool(self.args.oblr_snr_lr) and bool(getattr(SCHEDULES.get(self.args.oblr_lr_schedule), attribute,
                                                            False))

    def _oblr_set_lr(self, gbar_sq: torch.Tensor | None = None) -> None:
        """S, V, SNR from the pending per-prompt norms and ``||gbar||^2``; set the lr of every param group.
        ``gbar_sq`` None: the folded gradient is in ``.grad``, and :func:`oblr.distributed.step.step_statistics`
        (the one owner of the step's ``||gbar||^2`` and S, V) sums it; otherwise the squared pre-clip norm of
        the gradient DeepSpeed (or the Trainer) reduced. A schedule that reads no S and V (``kl``) steps on
        None and only its lr is logged."""
        sum_gk, n = self._oblr_pending
        self._oblr_pending = None
        if not self._oblr_controller.needs_snr:
            self._oblr_controller.step(None)
            self._metrics["train"]["oblr/lr"].append(float(self._oblr_controller.get_last_lr()[0]))
            return
        if gbar_sq is None:
            gbar_sq, st = step_statistics(trainable_params(self.model), sum_gk, n)
        else:
            st = snr_statistics(sum_gk.double(), gbar_sq.double(), n)
        self._oblr_controller.step(st)  # the unclamped signal and V, as in oblr train (oblr.schedules)
        lr = self._oblr_controller.get_last_lr()[0]
        m = self._metrics["train"]
        for k, v in (("S", st.S), ("V", st.V), ("snr", st.snr), ("signal", st.signal), ("lr", lr),
                     ("grad_norm", gbar_sq.double().sqrt()), ("n", n)):
            m[f"oblr/{k}"].append(float(v))
        for k, v in self._oblr_controller.metrics().items():
            if k.startswith("auto/"):
                m[f"oblr/{k}"].append(float(v))

    def _oblr_observe_step_kl(self) -> None:
        """Post-step hook of the inner optimizer (the ``kl`` schedule, no DeepSpeed): the per-token
        KL(pi_old || pi_new) the step just taken moved the policy by, on the step's own rows
        (:func:`oblr.update.step_kl_sums`: one forward pass without gradients per micro-batch, the sums added over
        processes, so every rank reads the same KL), fed to the controller, which sets the next step's lr from it
        (:mod:`oblr.kl_rate`). Logged as ``oblr/step_kl`` with the controller's ``oblr/kl/*``, as ``oblr train``
        logs ``policy/step_kl`` and ``kl/*``."""
        if self._oblr_kl_round is None:
            return
        batch, old_logprobs, settings = self._oblr_kl_round
        self._oblr_kl_round = None
        t0 = time.perf_counter()
        with self._oblr_core_model() as model:
            sums = step_kl_sums(model, batch, old_logprobs, settings, self.num_generations,
                                autocast=self.accelerator.autocast)
        kl_sum, tokens = (float(x) for x in all_reduce_sum(sums))  # identity on one process
        kl = kl_sum / tokens if tokens > 0 else 0.0
        self._oblr_controller.observe_step_kl(kl)
        m = self._metrics["train"]
        m["oblr/step_kl"].append(kl)
        for k, v in self._oblr_controller.metrics().items():
            if k.startswith("kl/"):
                m[f"oblr/{k}"].append(float(v))
        m["oblr/time_step_kl"].append(time.perf_counter() - t0)

    def _oblr_lr_from_deepspeed(self) -> None:
        """Pre-step hook of the inner optimizer under DeepSpeed: DeepSpeed has reduced the gradient and stored
        its pre-clip global norm (``_global_grad_norm``) just before this call. ZeRO-3 steps once per sub-group:
        only the first call of an optimizer step has pending statistics."""
        if self._oblr_pending is None:
            return
        norm = getattr(getattr(self.model_wrapped, "optimizer", None), "_global_grad_norm", None)
        if norm is None:
            raise RuntimeError("OBLRGRPOTrainer: DeepSpeed did not compute the gradient norm; set "
                               "zero_optimization.compute_grad_norm=true in the DeepSpeed config")
        gbar = torch.as_tensor(norm, dtype=torch.float64).reshape(())
        self._oblr_set_lr(gbar * gbar)

    def _get_grad_norm(self, model, grad_norm=None):
        norm = super()._get_grad_norm(model, grad_norm)  # pre-clip norm of the synchronised gradient
        if self._oblr_pending is not None and not self.is_deepspeed_enabled:
            gbar = torch.as_tensor(float(norm), dtype=torch.float64)
            self._oblr_set_lr(gbar * gbar)
        return norm

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
