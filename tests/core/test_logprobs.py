"""Log-probs under the sampling distribution (temperature, top-p) and the engine-vs-trainer gap."""

from __future__ import annotations

import math

import pytest
import torch

from oblr.logprobs import gather_logprobs, logprob_gap, sampling_log_probs, sampling_token_logprobs

P4 = torch.tensor([0.5, 0.3, 0.15, 0.05])


def _enumerated(p: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Slow reference: walk the tokens by probability, keep each while the mass before it is < top_p."""
    q = p ** (1 / temperature)
    q = q / q.sum()
    keep, before = torch.zeros_like(q, dtype=torch.bool), 0.0
    for i in sorted(range(len(q)), key=lambda i: -float(q[i])):
        if before < top_p:
            keep[i] = True
        before += float(q[i])
    out = torch.where(keep, q, torch.zeros_like(q))
    return (out / out.sum()).log()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.0, 0.7), (1.0, 0.8), (1.0, 0.81), (0.5, 0.9),
                                               (2.0, 0.6), (0.7, 0.01)])
def test_sampling_log_probs_match_enumeration(temperature, top_p):
    got = sampling_log_probs(P4.log()[None], temperature=temperature, top_p=top_p)[0]
    torch.testing.assert_close(got, _enumerated(P4, temperature, top_p), atol=1e-6, rtol=0)


def test_nucleus_examples():
    lp = sampling_log_probs(P4.log(), top_p=0.7).exp()
    torch.testing.assert_close(lp, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert sampling_log_probs(P4.log(), top_p=0.01).exp().tolist() == [1.0, 0.0, 0.0, 0.0]  # top token kept


def test_sampling_token_logprobs_reduce_to_gather_logprobs():
    torch.manual_seed(0)
    logits, ids = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    torch.testing.assert_close(sampling_token_logprobs(logits, ids), gather_logprobs(logits, ids))
    hot = sampling_token_logprobs(logits, ids, temperature=0.5)
    torch.testing.assert_close(hot, gather_logprobs(logits / 0.5, ids))
    assert (hot[:, 0] == 0).all()


def test_logprob_gap():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1]])
    trainer = torch.tensor([[5.0, -1.0, -2.0, 9.0], [7.0, 3.0, -0.5, float("-inf")]])
    sampler = torch.tensor([[0.0, -1.1, -2.0, 0.0], [0.0, 0.0, -0.2, -3.0]])
    gap = logprob_gap(sampler, trainer, mask)
    assert math.isclose(float(gap["rollout/logprob_gap_max"]), 0.3, rel_tol=1e-6)
    assert math.isclose(float(gap["rollout/logprob_gap_mean"]), (0.1 + 0.0 + 0.3) / 3, rel_tol=1e-6)
    assert float(gap["rollout/outside_nucleus"]) == 1  # the -inf token: the trainer's nucleus excludes it
    zero = logprob_gap(trainer, trainer, mask)
    assert float(zero["rollout/logprob_gap_max"]) == 0 and float(zero["rollout/logprob_gap_mean"]) == 0
