"""The learning-rate half of ``OBLRGRPOTrainer``: oblr's schedule as the Trainer's ``lr_scheduler``, stepped
from the step's statistics before each optimizer step, and the ``kl`` schedule's measurement after it.

Whose code: oblr's -- the mixin's methods; transformers' -- ``Trainer.create_scheduler`` and
``Trainer._get_grad_norm`` (private, listed in docs/integrations_private_api.md), which it overrides, and
DeepSpeed's ``_global_grad_norm``, which it reads.

:class:`LearningRateMixin` is mixed into :class:`~oblr.integrations.trl.trainer.OBLRGRPOTrainer` before
``GRPOTrainer`` and reads the trainer's state (``args``, ``model``, ``_metrics``, ``accelerator``, the pending
statistics the generation batch leaves in ``_oblr_pending`` and, for ``kl``, its rows in ``_oblr_kl_round``):

- ``create_scheduler``: the controller of ``oblr_lr_schedule`` (:func:`oblr.schedules.make_lr_controller`) on
  the innermost torch optimizer, wrapped as the Trainer's ``lr_scheduler`` (:class:`_OBLRSchedule`); under
  DeepSpeed a pre-step hook sets the lr from DeepSpeed's pre-clip gradient norm; with ``kl`` a post-step hook
  measures the step's KL;
- ``_oblr_set_lr``: S, V and the SNR from the per-prompt norms and ``||gbar||^2`` (or nothing, for a schedule
  that reads neither), then the controller sets every param group's lr;
- ``_oblr_observe_step_kl``: the KL the step moved the policy by, on its own rows, summed over processes.
"""

from __future__ import annotations

import time

import torch

from oblr.distributed.step import data_parallel_step_kl, step_statistics
from oblr.schedules import SCHEDULES, make_lr_controller
from oblr.snr import snr_statistics
from oblr.update import trainable_params


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


class LearningRateMixin:
    """oblr's learning rate in ``OBLRGRPOTrainer`` (module docstring)."""

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
        (:func:`oblr.distributed.step.data_parallel_step_kl`, ``oblr train``'s measurement: one forward pass without
        gradients per micro-batch, the sums added over processes, so every rank reads the same KL), fed to the controller, which sets the next step's lr from it
        (:mod:`oblr.kl_rate`). Logged as ``oblr/step_kl`` with the controller's ``oblr/kl/*``, as ``oblr train``
        logs ``policy/step_kl`` and ``kl/*``."""
        if self._oblr_kl_round is None:
            return
        batch, old_logprobs, settings = self._oblr_kl_round
        self._oblr_kl_round = None
        t0 = time.perf_counter()
        with self._oblr_core_model() as model:
            kl = data_parallel_step_kl(model, batch, old_logprobs, settings, self.num_generations,
                                       autocast=self.accelerator.autocast)
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
