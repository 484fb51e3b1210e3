"""The ``oblr`` advantage estimator in verl's form: the norm pass's advantages, spread over verl's tokens.

Whose code: oblr's -- grouping the rows, the channel, the spread over tokens; verl's -- the batch layout and
the ``reward_baselines`` channel. No verl import, no private verl name (docs/integrations_private_api.md).

The advantages are computed once per step, in the actor's norm pass
(:func:`oblr.integrations.verl.actor.norm_pass`): oblr's update core runs :func:`oblr.estimators.estimate`
(the one home of every baseline formula) with the exact w_i the same pass measures, and its A_i are the
ones the per-prompt norms (S and V) describe. The registered estimator does not estimate again: it puts
each row's A_i on every response token of verl's [B, T] layout, as verl's GRPO does, and returns it as the
advantages and the returns (outcome rewards, no critic).

The A_i channel: verl 0.9.1's ``ray_trainer.compute_advantage`` passes a registered estimator no batch
tensor but ``token_level_rewards``, ``response_mask``, ``uid`` and ``reward_baselines`` (the per-row tensor
REMAX fills; no other estimator reads it). The norm pass therefore leaves each row's A_i in
``data.batch["reward_baselines"]`` (:data:`ADVANTAGES_KEY`, :func:`put_advantages`); the recipe carries it
from the actor's rows to the driver's batch. The A_i were formed from the rewards the norm pass read
(``rm_scores``), which are ``token_level_rewards`` when no KL term is added to the reward (the recipe
refuses ``algorithm.use_kl_in_reward``). Nothing here imports verl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: the batch key verl forwards to a registered estimator, where the norm pass leaves each row's A_i
ADVANTAGES_KEY = "reward_baselines"


def group_rows(index) -> torch.Tensor:
    """Rows of each group, [N, G] (groups in order of first appearance, rows in batch order). ``index``: one
    group id per row (verl's ``uid``). Every group must have the same size G >= 1."""
    import torch

    if index is None:
        raise ValueError("oblr estimator: no group index (verl's non_tensor_batch['uid']); it is needed to form "
                         "the groups of outputs of one prompt")
    groups: dict = {}
    for row, uid in enumerate(list(index)):
        groups.setdefault(uid, []).append(row)
    sizes = sorted({len(rows) for rows in groups.values()})
    if len(sizes) != 1:
        raise ValueError(f"oblr estimator: groups (uid) have unequal sizes {sizes}; every prompt needs the same "
                         f"number of outputs (actor_rollout_ref.rollout.n), none filtered out")
    return torch.tensor(list(groups.values()), dtype=torch.long)


def compute_oblr_advantage(token_level_rewards, response_mask, index=None, reward_baselines=None, config=None,
                           **_unused):
    """verl's estimator signature (registered as ``oblr``): ``(advantages, returns)`` [B, T], each row's A_i of
    the norm pass (``batch["reward_baselines"]``) on its response tokens (module docstring). The groups
    (``index``) must still be whole and equal; ``config`` (verl's AlgoConfig) is not read."""
    import torch

    if reward_baselines is None:
        raise ValueError(f"adv_estimator=oblr needs each row's A_i from oblr's norm pass in "
                         f"batch['{ADVANTAGES_KEY}'] before compute_advantage (oblr.integrations.verl.norm_pass; "
                         f"the recipe runs it)")
    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(f"oblr estimator: token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must both be [B, T]")
    B = token_level_rewards.shape[0]
    if tuple(reward_baselines.shape) != (B,):
        raise ValueError(f"oblr estimator: the advantages (batch['{ADVANTAGES_KEY}']) must be [B] = [{B}], got "
                         f"{tuple(reward_baselines.shape)}")
    if index is not None and group_rows(index).numel() != B:
        raise ValueError(f"oblr estimator: index has {len(index)} entries for {B} rows")
    mask = response_mask.to(torch.float32)
    out = reward_baselines.to(device=mask.device, dtype=torch.float32).unsqueeze(-1) * mask
    return out, out


def put_advantages(data, advantages: torch.Tensor):
    """Put each row's A_i [B] into a verl ``DataProto``'s batch where the ``oblr`` estimator reads it."""
    if tuple(advantages.shape) != (len(data),):
        raise ValueError(f"put_advantages: advantages must be [B] = [{len(data)}], got {tuple(advantages.shape)}")
    data.batch[ADVANTAGES_KEY] = advantages.detach()
    return data
