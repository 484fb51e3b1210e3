"""Layer rules on a tiny non-HF model (torch LayerNorm/RMSNorm, Embedding padding_idx, 4-D Linear input),
the loop fallback, unsupported-module errors, structural HF RMSNorm verification and the cost model."""

from __future__ import annotations

import pytest
import torch
from gradnorm_helpers import Scale, ToyLM, make_batch, rel_err
from torch import nn

from oblr.gradnorm import (
    BookKeeper,
    UnsupportedModuleError,
    loop_group_sq_norms,
    loop_sequence_sq_norms,
    loop_weighted_grad,
    sequence_grad_sq_norms,
)
from oblr.gradnorm.assembly import use_ghost
from oblr.gradnorm.contrib import Outer
from oblr.gradnorm.layers import rule_for
from oblr.gradnorm.reference import trainable_parameters
from oblr.logprobs import sequence_logprobs, token_logprobs

TOL = 1e-4
PROMPTS, RESPS = [2, 4, 3, 1], [5, 3, 2, 6]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("padding_idx", [None, 5])
def test_toy_model_all_rules_match_loop(tied, padding_idx):
    model = ToyLM(padding_idx=padding_idx, tied=tied)
    ids, am, rm = make_batch(23, PROMPTS, RESPS, seed=1)
    ids[am.bool() & (ids % 3 == 0)] = 5  # real tokens equal to padding_idx: their table row gets no gradient
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    for method in ("ghost", "materialize", "auto"):
        assert rel_err(sequence_grad_sq_norms(model, ids, am, rm, method=method), ref) < TOL, method


def test_loop_fallback_for_unsupported_module_is_exact():
    model = ToyLM(custom=True)
    with pytest.raises(UnsupportedModuleError) as err:
        BookKeeper(model)
    msg = str(err.value)
    assert "'scale'" in msg and "Scale" in msg and "'gain'" in msg
    ids, am, rm = make_batch(23, PROMPTS, RESPS, seed=2)
    coeffs, gid = torch.tensor([1.0, -2.0, 0.5, 3.0]), torch.tensor([0, 1, 0, 1])
    with pytest.warns(UserWarning, match="Scale"):
        book = BookKeeper(model, allow_loop_fallback=True)
    with book.record():
        assert model.scale.gain.requires_grad and not model.head.weight.requires_grad
        book.backward(sequence_logprobs(token_logprobs(model, ids, am), rm))
    assert rel_err(book.sq_norms(), loop_sequence_sq_norms(model, ids, am, rm)) < TOL
    assert rel_err(book.group_sq_norms(coeffs, gid), loop_group_sq_norms(model, ids, am, rm, coeffs, gid)) < TOL
    book.accumulate_grad(coeffs)
    for p, w in zip(trainable_parameters(model), loop_weighted_grad(model, ids, am, rm, coeffs)):
        assert torch.allclose(p.grad, w, rtol=TOL, atol=1e-6)


def test_unsupported_module_in_hf_model_named_before_forward(qwen3_model):
    qwen3_model.model.layers[1].extra = Scale(4)
    with pytest.raises(UnsupportedModuleError, match=r"model\.layers\.1\.extra.*Scale.*'gain'"):
        BookKeeper(qwen3_model)
    qwen3_model.model.layers[1].extra.gain.requires_grad_(False)  # frozen: simply ignored
    BookKeeper(qwen3_model)


def test_embedding_scale_grad_by_freq_rejected():
    model = ToyLM()
    model.emb.scale_grad_by_freq = True
    with pytest.raises(UnsupportedModuleError, match="scale_grad_by_freq"):
        BookKeeper(model)


class WeirdRMSNorm(nn.Module):
    """Looks like an HF RMSNorm but squares its weight: the structural rule must be rejected by the probe."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(1.0 + torch.rand(d))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        return self.weight ** 2 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


class GoodRMSNorm(WeirdRMSNorm):
    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


def test_structural_hf_rmsnorm_is_verified(qwen3_model):
    rule, reason = rule_for(qwen3_model.model.layers[0].self_attn.q_norm)
    assert rule is not None and reason is None
    assert rule_for(GoodRMSNorm(6))[0] is not None
    rule, reason = rule_for(WeirdRMSNorm(6))
    assert rule is None and "differs from autograd" in reason


def test_cost_model_picks_cheaper_path():
    def outer(T, d_in, d_out):
        return Outer(torch.zeros(1, T, d_out), torch.zeros(1, T, d_in), (d_out, d_in))

    assert use_ghost([outer(4, 512, 512)], "auto")  # short sequence, wide layer: ghost
    assert not use_ghost([outer(4096, 16, 16)], "auto")  # long sequence, narrow layer: materialise
    assert use_ghost([outer(4096, 16, 16)], "ghost") and not use_ghost([outer(4, 512, 512)], "materialize")
    emb = Outer(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, 64), (50000, 64))
    assert use_ghost([emb], "auto")  # never forms a [V, D] matrix per sequence for short inputs
