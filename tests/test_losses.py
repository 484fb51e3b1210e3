"""Policy loss: on-policy gradient == -sum_i A_i c_i s_i (per-sequence backward reference), clipping, KL."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_qwen3

from oblr.logprobs import sequence_logprobs, token_logprobs
from oblr.losses import AGGREGATIONS, policy_loss, sequence_scale


def make_batch(B=4, T=10, vocab=61, seed=0):
    """Left-padded prompts, right-padded responses of different lengths: [pad prompt | response pad]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.long)
    resp = torch.zeros(B, T, dtype=torch.long)
    prompt_lens, resp_lens = [2, 3, 3, 1], [4, 1, 5, 3]
    start = 4
    for i in range(B):
        attn[i, start - prompt_lens[i]: start + resp_lens[i]] = 1
        resp[i, start: start + resp_lens[i]] = 1
    ids = ids * attn
    return ids, attn, resp


def flat_grad(scalar, params, retain=True):
    gs = torch.autograd.grad(scalar, params, retain_graph=retain, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(gs, params)])


@pytest.fixture(scope="module")
def model_and_batch():
    model = tiny_qwen3()
    return model, make_batch()


@pytest.mark.parametrize("aggregation", list(AGGREGATIONS))
def test_on_policy_gradient_matches_per_sequence_reference(model_and_batch, aggregation):
    model, (ids, attn, resp) = model_and_batch
    params = [p for p in model.parameters() if p.requires_grad]
    adv = torch.tensor([0.7, -1.2, 0.3, 2.0])
    lp = token_logprobs(model, ids, attn)
    loss, _ = policy_loss(lp, lp.detach(), adv, resp, aggregation=aggregation, max_len=8)
    got = flat_grad(loss, params)
    c = sequence_scale(resp, aggregation, max_len=8)
    seq_lp = sequence_logprobs(lp, resp)
    expect = torch.zeros_like(got)
    for i in range(ids.shape[0]):  # one backward per sequence: the slow exact reference
        expect -= adv[i] * c[i] * flat_grad(seq_lp[i], params)
    assert torch.allclose(got, expect, rtol=1e-5, atol=1e-7)
    assert got.abs().max() > 1e-4


def test_sequence_scale_values():
    _, _, resp = make_batch()
    L = resp.sum(1).float()  # [4, 1, 5, 3]
    assert torch.allclose(sequence_scale(resp, "seq_sum_const", max_len=8), torch.full((4,), 1 / 32))
    assert torch.allclose(sequence_scale(resp, "seq_sum_const"), torch.full((4,), 1 / 40))  # T = 10
    assert torch.allclose(sequence_scale(resp, "token_mean"), torch.full((4,), 1 / 13))
    assert torch.allclose(sequence_scale(resp, "seq_mean"), 1 / (4 * L))
    resp[1] = 0  # empty response
    assert sequence_scale(resp, "seq_mean")[1] == 0
    with pytest.raises(ValueError, match="unknown loss aggregation .mean.; registered: seq_mean, seq_sum_const"):
        sequence_scale(resp, "mean")
    with pytest.raises(ValueError, match="max_len"):
        sequence_scale(resp, "seq_sum_const", max_len=0)
    with pytest.raises(ValueError, match="2-D"):
        sequence_scale(resp[0], "token_mean")


def leaf_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 6
    lp = (-torch.rand(B, T, generator=g) * 3).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]], dtype=torch.float32)
    adv = torch.tensor([1.0, -0.5, 2.0])
    return lp, mask, adv


def test_clipping_zeroes_gradient_of_clipped_tokens():
    lp, mask, adv = leaf_batch()
    shift = torch.zeros_like(lp)
    shift[0, 1] = 0.5    # ratio e^0.5 > 1.2, A > 0 -> clipped
    shift[0, 2] = -0.5   # ratio < 0.8, A > 0 -> not clipped (min keeps the unclipped branch)
    shift[1, 2] = -0.5   # ratio < 0.8, A < 0 -> clipped
    shift[1, 3] = 0.5    # ratio > 1.2, A < 0 -> not clipped
    shift[2, 0] = 0.25   # ratio 1.28: clipped by eps_high = 0.2 ...
    old = lp.detach() - shift
    loss, m = policy_loss(lp, old, adv, mask, aggregation="token_mean", clip_eps=0.2)
    (grad,) = torch.autograd.grad(loss, lp)
    clipped = torch.zeros_like(mask, dtype=torch.bool)
    clipped[0, 1] = clipped[1, 2] = clipped[2, 0] = True
    ratio = shift.exp()
    expect = -adv[:, None] * ratio * mask / mask.sum()
    expect[clipped] = 0.0
    assert torch.allclose(grad, expect, atol=1e-7)
    assert float(m["actor/clip_frac"]) == pytest.approx(3 / mask.sum())
    assert float(m["actor/ratio_mean"]) == pytest.approx(float((ratio * mask).sum() / mask.sum()), rel=1e-6)
    # ... but not by an asymmetric, larger eps_high
    loss, m = policy_loss(lp, old, adv, mask, aggregation="token_mean", clip_eps=0.2, clip_eps_high=0.3)
    (grad,) = torch.autograd.grad(loss, lp)
    assert grad[2, 0] != 0 and grad[0, 1] == 0
    assert float(m["actor/clip_frac"]) == pytest.approx(2 / mask.sum())


def test_kl_zero_at_reference_and_gradient():
    lp, mask, adv = leaf_batch()
    zero_adv = torch.zeros_like(adv)
    loss, m = policy_loss(lp, lp.detach(), zero_adv, mask, ref_logprobs=lp.detach(), kl_coef=0.1)
    (grad,) = torch.autograd.grad(loss, lp)
    assert float(loss.detach()) == 0.0 and float(m["actor/kl"]) == 0.0 and grad.abs().max() == 0
    ref = lp.detach() + torch.randn_like(lp) * 0.3
    loss, m = policy_loss(lp, lp.detach(), zero_adv, mask, aggregation="seq_mean", ref_logprobs=ref, kl_coef=0.1)
    (grad,) = torch.autograd.grad(loss, lp)
    c = sequence_scale(mask, "seq_mean")
    d = ref - lp.detach()
    expect = 0.1 * c[:, None] * mask * (1.0 - d.exp())  # d/dlogp [e^d - d - 1] = -e^d + 1
    assert torch.allclose(grad, expect, atol=1e-7)
    k3 = d.exp() - d - 1
    assert float(m["actor/kl"]) == pytest.approx(float((k3 * mask).sum() / mask.sum()), rel=1e-6)
    assert float(loss.detach()) == pytest.approx(float(0.1 * (c * (k3 * mask).sum(1)).sum()), rel=1e-6)
    assert float(m["actor/pg_loss"]) == 0.0


def test_padding_values_cannot_leak():
    lp, mask, adv = leaf_batch()
    junk = torch.where(mask > 0, lp.detach(), torch.full_like(lp, float("-inf")))
    loss, m = policy_loss(lp, junk, adv, mask, clip_eps=0.2, ref_logprobs=junk, kl_coef=0.1)
    (grad,) = torch.autograd.grad(loss, lp)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_errors():
    lp, mask, adv = leaf_batch()
    with pytest.raises(ValueError, match="advantages must be \\[B\\]"):
        policy_loss(lp, lp, adv[:, None], mask)
    with pytest.raises(ValueError, match="old_logprobs shape"):
        policy_loss(lp, lp[:, :3], adv, mask)
    with pytest.raises(ValueError, match="response_mask shape"):
        policy_loss(lp, lp, adv, mask[:2])
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(lp, lp, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="clip_eps must be"):
        policy_loss(lp, lp, adv, mask, clip_eps=-0.1)
    with pytest.raises(ValueError, match="needs clip_eps"):
        policy_loss(lp, lp, adv, mask, clip_eps_high=0.3)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        policy_loss(lp, lp, adv, mask, aggregation="sum")


def test_precomputed_seq_scale_for_micro_batches():
    """Two micro-batches with factors from the whole batch give the whole batch's loss and gradient."""
    lp, mask, adv = leaf_batch()
    for agg in AGGREGATIONS:
        full, _ = policy_loss(lp, lp.detach(), adv, mask, aggregation=agg, clip_eps=0.2)
        (g_full,) = torch.autograd.grad(full, lp)
        c = sequence_scale(mask, agg)
        parts = [policy_loss(lp[r], lp[r].detach(), adv[r], mask[r], aggregation=agg, clip_eps=0.2,
                             seq_scale=c[r])[0] for r in (slice(0, 1), slice(1, 3))]
        (g_parts,) = torch.autograd.grad(parts[0] + parts[1], lp)
        assert torch.allclose(full, parts[0] + parts[1]) and torch.allclose(g_full, g_parts)
    with pytest.raises(ValueError, match="seq_scale must be"):
        policy_loss(lp, lp, adv, mask, seq_scale=c[:2])
