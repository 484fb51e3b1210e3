"""The ``oblr`` advantage estimator in verl's form: verl's batch layout in, oblr's estimator out.

Whose code: oblr's -- grouping the rows, the estimate, the scatter back to tokens; verl's -- the batch
layout and the ``reward_baselines`` channel. No verl import, no private verl name
(docs/integrations_private_api.md).

verl hands a registered estimator per-row tensors: ``token_level_rewards`` [B, T] (the outcome reward sits on
one token; its row sum is the reward), ``response_mask`` [B, T], ``index`` (the ``uid`` of each row's prompt,
a numpy object array, rows of a group not necessarily adjacent) and, when the batch has it,
``reward_baselines`` [B]. :func:`oblr_advantages` groups the rows by ``index`` into oblr's prompt-major
[N, G] layout, calls :func:`oblr.estimators.estimate` (the one home of every baseline formula) and scatters
the advantages back to verl's [B, T] token layout (``A_i`` on every response token), as verl's GRPO does.

The w_i channel: verl 0.9.1's ``ray_trainer.compute_advantage`` passes a registered estimator no batch
tensor but ``token_level_rewards``, ``response_mask``, ``uid`` and ``reward_baselines`` (the per-row tensor
REMAX fills; no other estimator reads it). The ``oblr`` estimator therefore reads each row's
``w_i = c_i^2 ||s_i||^2`` from ``data.batch["reward_baselines"]`` (:data:`WEIGHTS_KEY`); whoever runs the
norm pass puts it there (:func:`put_weights`). Nothing here imports verl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: the batch key verl forwards to a registered estimator and the ``oblr`` estimator reads w_i from
WEIGHTS_KEY = "reward_baselines"


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


def oblr_advantages(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, weights,
                    *, method: str = "oblr", **options) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` [B, T] of oblr's estimator ``method`` on verl's per-row layout.

    ``weights`` [B]: each row's w_i (None for methods that need none); ``options`` go to the estimator
    (e.g. ``guard_eps``). Rewards are the row sums of ``token_level_rewards``; lengths (for ``opo``) the row
    sums of ``response_mask``. Returns equals advantages (outcome rewards, no critic), as in verl's GRPO.
    """
    import torch

    from oblr.estimators import estimate

    if token_level_rewards.dim() != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(f"oblr estimator: token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must both be [B, T]")
    B = token_level_rewards.shape[0]
    rows = group_rows(index).to(token_level_rewards.device)
    if rows.numel() != B:
        raise ValueError(f"oblr estimator: index has {rows.numel()} entries for {B} rows")
    scores = token_level_rewards.sum(-1).to(torch.float32)
    mask = response_mask.to(torch.float32)
    w = None
    if weights is not None:
        weights = torch.as_tensor(weights, device=scores.device)
        if tuple(weights.shape) != (B,):
            raise ValueError(f"oblr estimator: weights (batch['{WEIGHTS_KEY}']) must be [B] = [{B}], got "
                             f"{tuple(weights.shape)}")
        w = weights.to(torch.float32)[rows]
    est = estimate(method, scores[rows], weights=w, lengths=mask.sum(-1)[rows], **options)
    adv = torch.empty_like(scores)
    adv[rows.reshape(-1)] = est.advantages.reshape(-1).to(adv.dtype)
    out = adv.unsqueeze(-1) * mask
    return out, out


def compute_oblr_advantage(token_level_rewards, response_mask, index=None, reward_baselines=None, config=None,
                           **_unused):
    """verl's estimator signature (registered as ``oblr``): oblr's exact-weight leave-one-out baseline with the
    w_i of ``batch["reward_baselines"]`` (module docstring). ``config`` (verl's AlgoConfig) is not read."""
    if reward_baselines is None:
        raise ValueError(f"adv_estimator=oblr needs each row's w_i in batch['{WEIGHTS_KEY}'] before "
                         f"compute_advantage (oblr.integrations.verl.put_weights after the norm pass)")
    return oblr_advantages(token_level_rewards, response_mask, index, reward_baselines, method="oblr")


def put_weights(data, weights: torch.Tensor):
    """Put each row's w_i [B] into a verl ``DataProto``'s batch where the ``oblr`` estimator reads it."""
    if tuple(weights.shape) != (len(data),):
        raise ValueError(f"put_weights: weights must be [B] = [{len(data)}], got {tuple(weights.shape)}")
    data.batch[WEIGHTS_KEY] = weights.detach()
    return data
