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


# ------------------------------------------------------------------ the output layer in chunks
def _chunk_case(tied: bool, lora: bool = False):
    from conftest import tiny_qwen3

    model = tiny_qwen3(seed=5, tied=tied)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                           init_lora_weights=False))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 61, (3, 11), generator=gen)
    am = torch.ones_like(ids)
    am[0, :2] = 0  # left padding
    rm = torch.zeros_like(ids)
    rm[:, 5:] = 1
    return model, ids, am, rm


@pytest.mark.parametrize("tied,lora,chunk", [(True, False, 3), (False, False, 4), (True, True, 2),
                                             (True, False, 64)])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_chunked_logprobs_equal_the_whole_logits(tied, lora, chunk, temperature, top_p):
    """Values (-inf outside the nucleus included), entropy and the gradient of a weighted sum equal the
    unchunked path; the output layer is restored afterwards."""
    from oblr.logprobs import (
        chunked_response_logprobs,
        forward_logits,
        response_token_logprobs,
        token_entropy,
    )

    model, ids, am, rm = _chunk_case(tied, lora)
    head = model.get_output_embeddings()
    params = [p for p in model.parameters() if p.requires_grad]
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))

    def grads(lp):
        for p in params:
            p.grad = None
        (torch.where(torch.isfinite(lp), lp, torch.zeros_like(lp)) * w).sum().backward()
        return [p.grad.clone() for p in params]

    logits = forward_logits(model, ids, am)
    whole = response_token_logprobs(logits, ids, rm, temperature=temperature, top_p=top_p)
    ent = (token_entropy(logits.detach() / temperature) * rm).sum()
    g_whole = grads(whole)
    lp, ent_c = chunked_response_logprobs(model, ids, am, rm, chunk=chunk, temperature=temperature, top_p=top_p)
    assert model.get_output_embeddings() is head
    fin = torch.isfinite(whole)
    assert torch.equal(fin, torch.isfinite(lp))
    if top_p < 1:
        assert not fin.all()  # the nucleus case does cut tokens here
    assert torch.allclose(lp[fin], whole[fin], atol=1e-6, rtol=1e-5)
    assert torch.allclose(ent_c, ent, rtol=1e-5)
    for a, b in zip(grads(lp), g_whole):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_chunked_logprobs_of_a_single_position_are_zero():
    from oblr.logprobs import chunked_response_logprobs

    model, ids, am, rm = _chunk_case(True)
    lp, ent = chunked_response_logprobs(model, ids[:, :1], am[:, :1], rm[:, :1], chunk=3)
    assert lp.shape == (3, 1) and not lp.any() and float(ent) == 0.0


def test_chunked_logprobs_refuse_models_they_cannot_serve():
    from oblr.logprobs import check_chunkable, chunked_response_logprobs

    model, ids, am, rm = _chunk_case(True)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        chunked_response_logprobs(model, ids, am, rm, chunk=0)
    with pytest.raises(ValueError, match="model type 'gemma2' is not known"):
        check_chunkable("gemma2")

    class Scaled(torch.nn.Module):  # a forward that post-processes its output layer's result
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = out.logits * 2.0
            return out

    with pytest.raises(RuntimeError, match="changed its output layer's result"):
        chunked_response_logprobs(Scaled(model), ids, am, rm, chunk=3)
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)  # restored after the failure
