"""The metrics a training step adds about its rollouts (``train/*``: rewards, pass rates, response lengths,
truncation, reward failures), from the global batch, and the plain floats a logged row holds."""

from __future__ import annotations

import torch


def rollout_metrics(rewards: torch.Tensor, batch, failures: int, device) -> dict:
    """Of the global batch, from this rank's ``rewards`` [n, G] and rollout ``batch`` (gathered over ranks: rank
    order = prompt order) and its count of rewards that failed (summed over ranks)."""
    from oblr.distributed import all_gather_cat, all_reduce_sum

    rewards, lens = all_gather_cat(rewards.to(device)), all_gather_cat(batch.response_lengths.float())
    finished = all_gather_cat(batch.finished.to(torch.uint8)).bool()
    failures = all_reduce_sum(torch.tensor(float(failures)))
    return {
        "train/reward_mean": rewards.mean(),
        "train/pass_rate": (rewards >= 1.0 - 1e-6).float().mean(),
        "train/pass_at_g": (rewards >= 1.0 - 1e-6).any(1).float().mean(),
        "train/all_equal_share": (rewards.max(1).values == rewards.min(1).values).float().mean(),
        "train/response_length_mean": lens.mean(), "train/response_length_max": lens.max(),
        "train/truncated_share": (~finished).float().mean(),
        "train/reward_failures": failures,
    }


def as_floats(metrics: dict) -> dict[str, float]:
    """``metrics`` with every value (a 0-d tensor or a number) a Python float."""
    return {k: _to_float(v) for k, v in metrics.items()}


def _to_float(v):
    if isinstance(v, torch.Tensor):
        v = v.detach().float().item()
    return float(v)
