"""Forward-only proxies against a direct slow computation."""

from __future__ import annotations

import torch
from gradnorm_helpers import make_batch

from oblr.gradnorm import length_weights, logit_energy_weights


def test_length_weights():
    _, _, rm = make_batch(11, [2, 3, 1], [4, 1, 6], seed=0)
    assert torch.equal(length_weights(rm), torch.tensor([4.0, 1.0, 6.0]))


def test_logit_energy_matches_direct_loop():
    ids, _am, rm = make_batch(11, [2, 3, 1], [4, 1, 6], left_pad=False, seed=1)
    logits = torch.randn(*ids.shape, 11, generator=torch.Generator().manual_seed(2)) * 3
    got = logit_energy_weights(logits, ids, rm)
    B, T = ids.shape
    want = torch.zeros(B)
    for i in range(B):
        for t in range(1, T):
            if rm[i, t]:
                p = torch.softmax(logits[i, t - 1].double(), -1)
                onehot = torch.nn.functional.one_hot(ids[i, t], 11).double()
                want[i] += float((onehot - p).pow(2).sum())  # ||d log p_t / d logits||^2
    assert torch.allclose(got, want, rtol=1e-5)
    assert (got > 0).all()
