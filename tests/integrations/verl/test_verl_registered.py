"""oblr.integrations.verl at verl's own seams, on CPU: the registered ``oblr`` estimator through
``ray_trainer.compute_advantage`` and the registered ``oblr`` loss through ``workers.utils.losses.ppo_loss``
give oblr's advantages (the update core's, not estimated again) and oblr's update-core gradient; refused
settings fail with one line.

Needs verl (tested: 0.9.1 with the ``verl`` extra's packages, constraints/verl.txt); skipped without it
unless ``OBLR_REQUIRE_VERL=1``. Tolerances (CPU, float32): advantages 1e-6 relative; the gradient through
``ppo_loss`` equals the core's within 1e-5 in relative norm."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

# OBLR_REQUIRE_VERL=1 (set where verl's environment runs these) turns a missing verl into a failure, not a skip
if not os.environ.get("OBLR_REQUIRE_VERL"):
    pytest.importorskip("verl", reason="verl is not installed here (pip install 'oblr[verl]', its own environment: "
                                       "docs/verl.md)")

from conftest import tiny_qwen3  # noqa: E402
from gradnorm_helpers import make_batch  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.config import FSDPActorConfig, PolicyLossConfig  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

import oblr.integrations.verl as ov  # noqa: E402
from oblr.estimators import compute_advantages  # noqa: E402
from oblr.logprobs import forward_logits  # noqa: E402
from oblr.update import UpdateSettings, accumulate_policy_gradient  # noqa: E402

N, G, MAX_LEN = 3, 4, 6


@pytest.fixture(scope="module")
def setup():
    """A tiny Qwen3, a prompt-major batch (left-padded prompts of unequal lengths, unequal responses), unequal
    rewards, and the oblr update core's result on it (exact w_i from its norm pass, advantages, .grad)."""
    model = tiny_qwen3(seed=5).train()
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, 5, (N,), generator=gen).repeat_interleave(G).tolist()
    resps = torch.randint(1, MAX_LEN + 1, (N * G,), generator=gen).tolist()
    ids, am, rm = make_batch(model.config.vocab_size, prompts, resps, seed=2)
    batch = SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm, response_lengths=rm.sum(-1))
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.25], [0.2, 0.9, 0.0, 1.0]])
    for p in model.parameters():
        p.grad = None
    settings = UpdateSettings(baseline="oblr", aggregation="seq_sum_const", max_len=MAX_LEN, need_snr=True)
    res = accumulate_policy_gradient(model, batch, rewards, settings)
    grads = [p.grad.clone() for p in model.parameters()]
    return SimpleNamespace(model=model, batch=batch, rewards=rewards, res=res, grads=grads, P=max(prompts))


def _data_proto(s, perm):
    """verl's driver-side batch of the same rollouts, rows in the order ``perm`` (verl may reorder rows)."""
    P, rm = s.P, s.batch.response_mask[:, s.P:]
    rewards = s.rewards.reshape(-1)
    tlr = torch.zeros(rm.shape)
    last = rm.sum(-1).long() - 1
    tlr[torch.arange(len(rewards)), last] = rewards  # the outcome reward on the last response token
    adv = s.res.advantages.reshape(-1)  # what the actor's norm pass leaves in the batch
    uid = np.array([f"prompt-{k}" for k in range(N) for _ in range(G)], dtype=object)
    data = DataProto.from_dict(tensors={"token_level_rewards": tlr[perm], "response_mask": rm[perm].float(),
                                        "responses": s.batch.input_ids[perm, P:]},
                               non_tensors={"uid": uid[perm.numpy()]})
    return ov.put_advantages(data, adv[perm])


def test_registered_names_are_oblrs_functions_and_register_is_idempotent():
    ov.register()
    ov.register()
    assert core_algos.get_adv_estimator_fn("oblr") is ov.compute_oblr_advantage
    assert core_algos.get_policy_loss_fn("oblr") is ov.oblr_policy_loss


def test_verl_external_module_mechanism_registers_both():
    code = ("from verl.trainer.ppo import core_algos as c; "
            "print(c.get_adv_estimator_fn('oblr').__module__, c.get_policy_loss_fn('oblr').__module__)")
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": "oblr.integrations.verl"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["oblr.integrations.verl.estimator", "oblr.integrations.verl.loss"]


@pytest.mark.parametrize("shuffled", [False, True])
def test_compute_advantage_with_oblr_equals_oblrs_estimator_and_the_update_core(setup, shuffled, monkeypatch):
    """compute_advantage puts the update core's A_i (the norm pass's) on the response tokens without running an
    estimator again; they are oblr's estimator on the rewards with the core's w_i."""
    import oblr.estimators

    s = setup
    B = N * G
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(7)) if shuffled else torch.arange(B)
    data = _data_proto(s, perm)
    with monkeypatch.context() as m:
        m.setattr(oblr.estimators, "_run", lambda *a, **k: pytest.fail("the estimator ran again"))
        data = compute_advantage(data, adv_estimator="oblr")
    adv = data.batch["advantages"]
    mask = data.batch["response_mask"]
    w = s.res.estimate.weights
    assert (w > 0).all() and w.std() > 0  # real, unequal norms
    expected = compute_advantages("oblr", s.rewards, weights=w).reshape(-1)[perm]
    assert torch.allclose(s.res.advantages.reshape(-1)[perm], expected, rtol=1e-6, atol=1e-7)
    assert torch.equal(adv, s.res.advantages.reshape(-1)[perm][:, None] * mask)
    torch.testing.assert_close(adv, expected[:, None] * mask, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(data.batch["returns"], adv)
    # not the unweighted leave-one-out mean: the weights matter here
    assert not torch.allclose(expected, compute_advantages("rloo", s.rewards).reshape(-1)[perm], atol=1e-4)


def test_estimator_refuses_missing_advantages_and_unequal_groups(setup):
    s = setup
    data = _data_proto(s, torch.arange(N * G))
    fn = core_algos.get_adv_estimator_fn("oblr")
    with pytest.raises(ValueError, match=r"needs each row's A_i from oblr's norm pass in batch\['reward_baselines'\]"):
        fn(data.batch["token_level_rewards"], data.batch["response_mask"], index=data.non_tensor_batch["uid"])
    uid = data.non_tensor_batch["uid"].copy()
    uid[0] = "prompt-1"
    with pytest.raises(ValueError, match="unequal sizes"):
        fn(data.batch["token_level_rewards"], data.batch["response_mask"], index=uid,
           reward_baselines=data.batch["reward_baselines"])


def _actor_config(**kw):
    base = dict(strategy="fsdp", rollout_n=G, ppo_mini_batch_size=N, ppo_micro_batch_size_per_gpu=N * G,
                use_torch_compile=False, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=MAX_LEN,
                policy_loss=PolicyLossConfig(loss_mode="oblr"))
    return FSDPActorConfig(**{**base, **kw})


def _actor_step(s, config, *, advantages=None, extra=None):
    """What verl's actor does with one micro-batch: the model's log-probs of every valid token's successor,
    unpadded (verl's model output), then ``ppo_loss`` and its backward. Returns (loss, grads)."""
    model, ids, am, P = s.model, s.batch.input_ids, s.batch.attention_mask, s.P
    for p in model.parameters():
        p.grad = None
    logits = forward_logits(model, ids, am)
    lp = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    lp = torch.cat([lp, lp.new_zeros(lp.shape[0], 1)], 1)  # position t scores token t+1
    flat = lp[am.bool()]
    rm = s.batch.response_mask[:, P:].float()
    old = lp[:, P - 1:-1].detach() * rm
    adv = s.res.advantages.reshape(-1)[:, None] * rm if advantages is None else advantages
    fields = {"prompts": ids[:, :P], "responses": ids[:, P:], "attention_mask": am, "response_mask": rm,
              "old_log_probs": old, "advantages": adv, **(extra or {})}
    data = tu.get_tensordict(fields, {"dp_size": 1, "batch_num_tokens": int(rm.sum()), "global_batch_size": N * G})
    loss, metrics = ppo_loss(config, {"log_probs": flat}, data)
    loss.backward()
    return loss, [p.grad.clone() for p in model.parameters()]


def test_ppo_loss_with_oblr_gives_the_update_cores_gradient(setup):
    s = setup
    loss, grads = _actor_step(s, _actor_config())
    diff = torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(grads, s.grads)))
    ref = torch.sqrt(sum((b ** 2).sum() for b in s.grads))
    assert ref > 0
    assert float(diff / ref) < 1e-5, float(diff / ref)
    # its value is the ratio form at ratio 1: -sum_i A_i c_i L_i with c_i = 1 / (B * loss_scale_factor)
    expected = -(s.res.advantages.reshape(-1) * s.batch.response_lengths).sum() / (N * G * MAX_LEN)
    torch.testing.assert_close(loss.detach(), expected.float(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("setting, value", [("loss_agg_mode", "token-mean"), ("loss_scale_factor", None),
                                            ("entropy_coeff", 0.01), ("use_kl_loss", True), ("ppo_epochs", 2)])
def test_ppo_loss_refuses_settings_that_change_the_gradient(setup, setting, value):
    with pytest.raises(ValueError, match=rf"^oblr policy loss: actor\.{setting}=.* is not supported: .*; use actor\."):
        _actor_step(setup, _actor_config(**{setting: value}))


def test_ppo_loss_refuses_importance_weights_and_token_varying_advantages(setup):
    s = setup
    rm = s.batch.response_mask[:, s.P:].float()
    with pytest.raises(ValueError, match="rollout_is_weights are not supported"):
        _actor_step(s, _actor_config(), extra={"rollout_is_weights": torch.ones_like(rm)})
    varying = torch.arange(rm.shape[1], dtype=torch.float32)[None, :] * rm
    with pytest.raises(ValueError, match="advantages vary along a response"):
        _actor_step(s, _actor_config(), advantages=varying)
