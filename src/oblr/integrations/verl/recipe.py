"""The recipe that makes a verl 0.9.1 PPO run OBLR-PO: a worker and a trainer subclass, and an entry point.

Whose code: oblr's -- :func:`check_run_config`, :func:`options`, :func:`install_learning_rate` and the
worker's added method; verl's -- the worker, trainer and task runner subclassed, and ``main_ppo``. It
overrides verl's private ``RayPPOTrainer._compute_old_log_prob`` and subclasses Ray's ``__ray_actor_class__``
(both listed with the versions checked in docs/integrations_private_api.md).

    python -m oblr.integrations.verl.recipe trainer.use_v1=False algorithm.adv_estimator=oblr \\
        actor_rollout_ref.actor.policy_loss.loss_mode=oblr ... (docs/verl.md has the whole command)

- :class:`OBLRActorRolloutRefWorker` (verl's ``ActorRolloutRefWorker``): after ``init_model`` it puts
  :class:`~oblr.integrations.verl.actor.ActorLearningRate` in front of the actor engine's ``optimizer_step``
  (``oblr.lr_schedule`` ``snr``, ``snr_adam``, ``auto`` or ``kl``, ``eta_max`` or the guess =
  ``actor.optim.lr``; with ``kl`` it measures the step's KL after the engine's update), and it has one more
  registered method, ``oblr_norm_pass`` (dispatched like ``compute_log_prob``: each data-parallel rank gets
  its contiguous block of rows), which runs :func:`~oblr.integrations.verl.actor.norm_pass` on the actor's
  module and returns each row's advantage A_i (computed there, once per step); its ``update_actor`` adds the
  learning rate's metrics of the step (:func:`with_oblr_metrics`: ``oblr/S``, ``oblr/V``, ``oblr/snr``,
  ``oblr/lr``, ``oblr/grad_norm``, ``oblr/n``, and with ``kl`` ``oblr/step_kl`` and ``oblr/kl/*``) to the
  metrics verl returns, which verl logs as ``actor/oblr/*``;
- :class:`OBLRRayPPOTrainer` (verl's legacy ``RayPPOTrainer``, ``trainer.use_v1=False``): its
  ``_compute_old_log_prob`` -- which ``fit`` calls after the rewards and before ``compute_advantage`` --
  also runs the norm pass and returns A_i as ``reward_baselines`` with the old log-probs, so ``fit`` puts it
  into the batch where the ``oblr`` estimator reads it (and does not estimate again); the actor's next optimizer step then sets its lr
  from S and V.
- :func:`check_run_config`: the whole run's settings the recipe needs, each refused with one line before
  Ray starts (the actor's :data:`~oblr.integrations.verl.RULES` among them).

Options (``+actor_rollout_ref.oblr.<key>=...``): ``lr_schedule`` (snr), ``eta_min`` (0), ``snr_ema`` (0.9,
as ``oblr train``), ``warmup_steps`` (0), ``schedule_options`` (a dict for ``auto`` or ``kl``). verl's own lr
scheduler still runs after each step; the next step's lr is set again before it is used.

Not supported by the recipe: verl's v1 trainer (``trainer.use_v1=True``: its ``_compute_advantage`` reads a
fixed field list through the TransferQueue; not written), FSDP1 (``actor.strategy=fsdp``), Megatron.
This module imports verl and ray.
"""

from __future__ import annotations

import os

import hydra
import ray
from verl import DataProto
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.trainer.main_ppo_v0 import TaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.engine_workers import ActorRolloutRefWorker

from . import register as register_oblr
from .actor import ActorLearningRate, norm_pass, wrap_checkpointing, wrap_optimizer_step
from .estimator import ADVANTAGES_KEY
from .loss import refusal

register_oblr()

#: fields of the driver's batch the norm pass reads (positions come from the attention mask, as verl's own
#: position_ids do for text models; 3-D multimodal position ids are not supported)
NORM_PASS_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "rm_scores")


def _sel(cfg, path: str, default=None):
    node = cfg
    for part in path.split("."):
        if node is None:
            return default
        node = node.get(part, None) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def check_run_config(config) -> None:
    """Stop with one line naming the first setting of a verl run config that the recipe cannot run."""
    actor = _sel(config, "actor_rollout_ref.actor")
    rollout = _sel(config, "actor_rollout_ref.rollout")
    need = [
        ("trainer.use_v1", _sel(config, "trainer.use_v1") is False, "False",
         "the recipe subclasses the legacy RayPPOTrainer; the v1 trainer's _compute_advantage is not covered yet"),
        ("algorithm.adv_estimator", _sel(config, "algorithm.adv_estimator") == "oblr", "oblr",
         "the oblr estimator reads the norm pass's advantages"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", _sel(actor, "policy_loss.loss_mode") == "oblr", "oblr",
         "S and V describe the gradient of the oblr loss"),
        ("actor_rollout_ref.actor.strategy", _sel(actor, "strategy") == "fsdp2", "fsdp2",
         "the norm pass and the lr read per-parameter (FSDP2) gradients; FSDP1 flat parameters and Megatron "
         "are not supported"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", _sel(actor, "ppo_mini_batch_size")
         == _sel(config, "data.train_batch_size"), "<data.train_batch_size>",
         "one optimizer step per generation batch (later mini-batches are off-policy for w_i, S and V)"),
        ("trainer.balance_batch", _sel(config, "trainer.balance_batch") is False, "False",
         "balancing reorders rows over data-parallel ranks and splits groups"),
        ("algorithm.use_kl_in_reward", not _sel(config, "algorithm.use_kl_in_reward", False), "False",
         "the reward the norm pass sees must be the one the estimator uses"),
        ("algorithm.rollout_correction.bypass_mode", not _sel(config, "algorithm.rollout_correction.bypass_mode",
                                                              False), "False",
         "bypass mode skips the actor pass the norm pass runs beside"),
        ("algorithm.rollout_correction.rollout_is", _sel(config, "algorithm.rollout_correction.rollout_is") is None,
         "null", "token-level importance weights change each sequence's gradient"),
        ("algorithm.rollout_correction.rollout_rs", _sel(config, "algorithm.rollout_correction.rollout_rs") is None,
         "null", "rejection sampling masks rows out after the norm pass"),
        ("actor_rollout_ref.rollout.n", int(_sel(rollout, "n", 1)) >= 2, ">= 2",
         "the leave-one-out baseline and V need at least two outputs per prompt"),
        ("actor_rollout_ref.rollout.top_p", float(_sel(rollout, "top_p", 1.0)) == 1.0, "1.0",
         "the actor's loss scores tokens under the full tempered distribution, not a nucleus"),
        ("actor_rollout_ref.rollout.top_k", int(_sel(rollout, "top_k", -1)) in (-1, 0), "-1",
         "the actor's loss scores tokens under the full tempered distribution, not the top k"),
    ]
    for path, ok, use, why in need:
        if not ok:
            value = _sel(config, path)
            raise ValueError(f"oblr verl recipe: {path}={value!r} is not supported: {why}; use {path}={use}")
    msg = refusal(actor)
    if msg is not None:
        raise ValueError(msg.replace("oblr policy loss: actor.", "oblr verl recipe: actor_rollout_ref.actor.")
                         .replace("use actor.", "use actor_rollout_ref.actor."))


def options(config) -> dict:
    """The recipe's ``oblr`` options from the worker's config (``actor_rollout_ref.oblr``), with defaults."""
    o = dict(_sel(config, "oblr", {}) or {})
    unknown = sorted(set(o) - {"lr_schedule", "eta_min", "snr_ema", "warmup_steps", "schedule_options"})
    if unknown:
        raise ValueError(f"oblr verl recipe: unknown option(s) actor_rollout_ref.oblr.{', '.join(unknown)}; "
                         f"known: lr_schedule, eta_min, snr_ema, warmup_steps, schedule_options")
    return {"lr_schedule": o.get("lr_schedule", "snr"), "eta_min": float(o.get("eta_min", 0.0)),
            "ema": float(o.get("snr_ema", 0.9)), "warmup_steps": int(o.get("warmup_steps", 0)),
            "schedule_options": dict(o.get("schedule_options", {}) or {})}


def install_learning_rate(config, engine) -> ActorLearningRate:
    """The recipe's :class:`ActorLearningRate` on ``engine.optimizer`` from the worker's config
    (``actor_rollout_ref``: ``actor.optim.lr`` is eta_max, ``actor.optim.clip_grad`` the clip, the ``oblr``
    options), put in front of ``engine.optimizer_step``; its state travels with the engine's checkpoints."""
    o = options(config)
    optim = config.actor.optim
    lr = ActorLearningRate(engine.optimizer, o["lr_schedule"], lr=float(optim.lr), eta_min=o["eta_min"], ema=o["ema"],
                           warmup_steps=o["warmup_steps"],
                           total_steps=max(1, int(optim.get("total_training_steps", 1) or 1)),
                           grad_clip=float(optim.get("clip_grad", 0.0) or 0.0), **o["schedule_options"])
    wrap_optimizer_step(engine, lr)
    wrap_checkpointing(engine, lr)
    return lr


class OBLRActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker with oblr's norm pass and learning rate (module docstring)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if self.actor is None:
            return
        self._oblr_actor_config = omega_conf_to_dataclass(self.config.actor)
        self._oblr_lr = install_learning_rate(self.config, self.actor.engine)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def oblr_norm_pass(self, data: DataProto) -> DataProto:
        """This rank's rows: A_i (returned as ``reward_baselines``); S and V's inputs kept for the next step."""
        engine = self.actor.engine
        with engine.train_mode():
            data = data.to(next(engine.module.parameters()).device)
            res = norm_pass(engine.module, data, self._oblr_actor_config, rollout_n=int(self.config.rollout.n),
                            temperature=float(data.meta_info.get("temperature", self.config.rollout.temperature)),
                            dp_group=engine.get_data_parallel_group())
        self._oblr_lr.set_pending(res.gk_sq_sum, res.n_prompts, res.step_kl)
        return DataProto.from_dict(tensors={ADVANTAGES_KEY: res.advantages.cpu()})


    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data):
        """verl's actor update, with the learning rate's ``oblr/*`` metrics of its optimizer steps added to the
        metrics it returns (verl logs them as ``actor/oblr/*``)."""
        return with_oblr_metrics(super().update_actor(data), getattr(self, "_oblr_lr", None))


def with_oblr_metrics(output, lr: ActorLearningRate | None):
    """``output`` (verl's update result: a TensorDict with a ``metrics`` dict of lists, or None on ranks that
    return nothing) with ``lr``'s popped metrics appended, one value per key, as verl's own are."""
    extra = lr.pop_metrics() if lr is not None else {}
    if output is None or not extra:
        return output
    from verl.utils import tensordict_utils as tu

    metrics = tu.get(output, "metrics")
    for k, v in extra.items():
        metrics.setdefault(k, []).append(v)
    return output


class OBLRRayPPOTrainer(RayPPOTrainer):
    """verl's RayPPOTrainer with the norm pass before the advantages (module docstring)."""

    def __init__(self, config, *args, **kwargs):
        check_run_config(config)
        super().__init__(config, *args, **kwargs)

    def _compute_old_log_prob(self, batch: DataProto):
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        sent = batch.select(batch_keys=list(NORM_PASS_KEYS), non_tensor_batch_keys=["uid"],
                            meta_info_keys=["temperature"])
        out = self.actor_rollout_wg.oblr_norm_pass(sent)
        old_log_prob.batch[ADVANTAGES_KEY] = out.batch[ADVANTAGES_KEY].to(old_log_prob.batch.device)
        return old_log_prob, mfu


class _TaskRunner(TaskRunner.__ray_actor_class__):
    """verl's legacy TaskRunner with the recipe's worker and trainer."""

    def add_actor_rollout_worker(self, config):
        _, group_cls = super().add_actor_rollout_worker(config)
        for role in list(self.role_worker_mapping):
            if getattr(role, "name", "").startswith("ActorRollout"):  # ActorRollout or ActorRolloutRef
                self.role_worker_mapping[role] = ray.remote(OBLRActorRolloutRefWorker)
        return OBLRActorRolloutRefWorker, group_cls

    def run(self, config):
        from verl.trainer import main_ppo_v0

        main_ppo_v0.RayPPOTrainer = OBLRRayPPOTrainer  # TaskRunner.run builds the trainer by this name
        return super().run(config)


OBLRTaskRunner = ray.remote(num_cpus=1)(_TaskRunner)


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config) -> None:
    """verl's ``main_ppo`` with the recipe's task runner; the settings are checked before Ray starts."""
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    try:
        check_run_config(config)
    except ValueError as e:  # one line, before Ray starts
        raise SystemExit(str(e)) from None
    os.environ.setdefault("VERL_USE_EXTERNAL_MODULES", "oblr.integrations.verl")
    run_ppo(config, task_runner_class=OBLRTaskRunner)


if __name__ == "__main__":
    main()
