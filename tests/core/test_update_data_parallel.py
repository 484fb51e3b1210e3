"""oblr.update's data-parallel seam, in one process: shards of whole groups with the global batch's totals
add up to the whole-batch step (``totals``), and ``grad_sink`` receives exactly what ``.grad`` would."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_qwen3
from distributed_helpers import G, N, fixed_batch

from oblr.distributed.layout import prompt_slice, row_slice, shard_rows
from oblr.losses import BatchTotals
from oblr.update import UpdateSettings, accumulate_policy_gradient


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("aggregation,baseline,snr", [("token_mean", "oblr", True), ("seq_mean", "grpo", False),
                                                      ("seq_sum_const", "rloo", True)])
def test_shards_with_global_totals_add_up_to_the_whole_batch(aggregation, baseline, snr):
    batch, rewards = fixed_batch()
    settings = UpdateSettings(baseline=baseline, aggregation=aggregation, need_snr=snr)
    model = tiny_qwen3()
    whole = accumulate_policy_gradient(model, batch, rewards, settings)
    expect = _grads(model)
    model.zero_grad(set_to_none=True)
    totals = BatchTotals.of(batch.response_mask)
    gks = []
    for r in range(2):  # two "ranks", one after the other, accumulating into the same .grad
        part = shard_rows(batch, row_slice(N, G, 2, r))
        res = accumulate_policy_gradient(model, part, rewards[prompt_slice(N, 2, r)], settings, totals=totals)
        gks.append(res.per_prompt_sq_norms)
    for a, b in zip(_grads(model), expect):  # relative to each tensor's norm: an element near 0 is a difference of
        assert float((a - b).norm()) <= 1e-6 * float(b.norm())  # float32 terms (1e-4 of itself on some CPUs)
    if snr:
        assert torch.allclose(torch.cat(gks), whole.per_prompt_sq_norms, rtol=1e-5)
    # without the global totals a shard is scaled as a batch of its own: another gradient
    half, own, glob = shard_rows(batch, row_slice(N, G, 2, 0)), tiny_qwen3(), tiny_qwen3()
    accumulate_policy_gradient(own, half, rewards[:2], settings)
    accumulate_policy_gradient(glob, half, rewards[:2], settings, totals=totals)
    assert not torch.allclose(next(own.parameters()).grad, next(glob.parameters()).grad, rtol=1e-3)

def test_grad_sink_receives_the_book_keeping_gradient():
    batch, rewards = fixed_batch()
    settings = UpdateSettings(baseline="oblr")
    model = tiny_qwen3()
    accumulate_policy_gradient(model, batch, rewards, settings)
    expect = {id(p): p.grad.detach().clone() for p in model.parameters()}
    model.zero_grad(set_to_none=True)
    got: dict = {}
    accumulate_policy_gradient(model, batch, rewards, settings,
                               grad_sink=lambda p, inc: got.__setitem__(id(p), got.get(id(p), 0) + inc))
    assert all(p.grad is None for p in model.parameters())
    assert set(got) == set(expect)
    for k, v in expect.items():
        assert torch.allclose(got[k].view_as(v), v, rtol=1e-6, atol=1e-10)
