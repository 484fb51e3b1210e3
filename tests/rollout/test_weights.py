"""Weights pushed to an inference engine: checkpoint names, LoRA merged (against PEFT's merge_and_unload)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_qwen3

from oblr.rollout.weights import checkpoint_weights


def test_plain_model_is_its_state_dict():
    model = tiny_qwen3()
    got = dict(checkpoint_weights(model))
    ref = model.state_dict()
    assert got.keys() == ref.keys()
    assert all(torch.equal(got[k], ref[k]) and not got[k].requires_grad for k in ref)


def test_lora_weights_merged_without_touching_the_model():
    peft = pytest.importorskip("peft")
    base = tiny_qwen3()
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0))
    with torch.no_grad():  # non-zero B, so that the adapters change the weights
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = dict(checkpoint_weights(model))
    ref = copy.deepcopy(model).merge_and_unload().state_dict()
    assert got.keys() == ref.keys() == base.state_dict().keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=1e-6, rtol=1e-6)
    assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"],
                           base.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the trained model is unchanged
