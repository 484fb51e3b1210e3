"""OBLR-PO pieces inside verl (tested with verl 0.9.1): the ``oblr`` advantage estimator and policy loss.

Whose code: oblr's -- :func:`register` and the exported names; verl's -- the estimator and policy-loss
registries, used through their public ``register_adv_est`` / ``register_policy_loss``. No private verl name is
touched here (docs/integrations_private_api.md).

Importing this package registers both in verl's registries (:func:`register`, idempotent), so verl loads
them by name through its external-module mechanism::

    VERL_USE_EXTERNAL_MODULES=oblr.integrations.verl python -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=oblr actor_rollout_ref.actor.policy_loss.loss_mode=oblr \\
        actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \\
        actor_rollout_ref.actor.loss_scale_factor=<max response length> ...

- :mod:`.estimator` -- ``oblr`` estimator: the norm pass's advantages (oblr's own
  :func:`oblr.estimators.estimate`, run once per step in the actor) read from ``batch["reward_baselines"]``
  and put on verl's response tokens;
- :mod:`.loss` -- ``oblr`` policy loss: :func:`oblr.losses.policy_loss` with ``seq_sum_const`` factors from
  verl's global batch info; refused actor settings (``RULES``);
- :mod:`.actor` -- the actor-side norm pass (oblr's update core: w_i and A_i, A_i into the batch, the per-prompt norms
  for S and V into ``meta_info``) and :class:`~.actor.ActorLearningRate` (``snr`` / ``auto`` on the actor's
  optimizer, in front of the engine's ``optimizer_step``);
- :mod:`.recipe` -- the trainer and worker subclasses that insert both into a verl 0.9.1 run
  (``python -m oblr.integrations.verl.recipe``; docs/verl.md).

Needs ``pip install "oblr[verl]"``.
"""

from __future__ import annotations

from .actor import (
    META_KEY,
    STATE_FILE,
    ActorLearningRate,
    NormPass,
    load_lr_state,
    norm_pass,
    save_lr_state,
    wrap_checkpointing,
    wrap_optimizer_step,
)
from .estimator import ADVANTAGES_KEY, compute_oblr_advantage, put_advantages
from .loss import RULES, oblr_policy_loss, refusal

#: the name both functions are registered under in verl
NAME = "oblr"

__all__ = ["ADVANTAGES_KEY", "META_KEY", "NAME", "RULES", "STATE_FILE", "ActorLearningRate", "NormPass",
           "compute_oblr_advantage", "load_lr_state", "norm_pass", "oblr_policy_loss", "put_advantages", "refusal",
           "register", "save_lr_state", "wrap_checkpointing", "wrap_optimizer_step"]


def register() -> None:
    """Register the ``oblr`` estimator and policy loss in verl's registries (a second call changes nothing)."""
    try:
        from verl.trainer.ppo import core_algos
    except ModuleNotFoundError as e:
        if e.name is None or not e.name.startswith("verl"):
            raise
        raise ModuleNotFoundError('oblr.integrations.verl needs verl: pip install "oblr[verl]"', name="verl") from None
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME) is not compute_oblr_advantage:
        core_algos.register_adv_est(NAME)(compute_oblr_advantage)
    if core_algos.POLICY_LOSS_REGISTRY.get(NAME) is not oblr_policy_loss:
        core_algos.register_policy_loss(NAME)(oblr_policy_loss)


register()
