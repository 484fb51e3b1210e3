"""One update's gradient, advantages, weights and per-prompt norms against a plain autograd reference.

:func:`oblr.update.accumulate_policy_gradient` is checked on a tiny model with rewards that are non-zero and
vary within every group. The reference takes one autograd backward per sequence
(:func:`oblr.gradnorm.loop_per_sequence_grads`) and recomputes everything else here, by hand, from the
rewards: the aggregation factors c_i, the exact weights w_i = c_i^2 ||s_i||^2, the advantages, the
gradient sum_i -A_i c_i s_i, the per-prompt estimates g_k = N sum_{i in k} -A_i c_i s_i whose squared
norms make S and V, and S and V themselves. Every aggregation, with and without micro-batches (an uneven
split included), on the book-keeping path and on the plain path; later epochs (clipped importance ratio
against the rollout log-probs) too.
"""

from __future__ import annotations

import pytest
import step_reference
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import make_batch
from step_reference import flat_grad, later_epoch_grad

from oblr.logprobs import token_logprobs
from oblr.rollout import RolloutBatch
from oblr.snr import signal_noise
from oblr.update import UpdateSettings, accumulate_clipped_gradient, accumulate_policy_gradient

N, G = 3, 3
PROMPT_LENS = [3, 5, 2, 4, 1, 3, 2, 4, 3]
RESP_LENS = [4, 2, 5, 3, 6, 1, 5, 2, 4]
MAX_LEN = 8
# non-zero, different within every group and between groups (a group's advantages moved onto another differ)
REWARDS = torch.tensor([[1.0, 0.0, 0.5], [0.9, 0.2, 0.0], [0.8, 0.0, 0.3]])
AGGREGATIONS = ["seq_sum_const", "token_mean", "seq_mean"]
MICRO = [0, 1, 2]  # whole batch; one group per micro-batch; an uneven split (2 + 1 groups)
RTOL = 1e-4


def _batch(vocab: int, seed: int = 3) -> RolloutBatch:
    """N groups of G sequences, ``[pad.. prompt | response ..pad]``: every prompt differs (lengths too),
    response j of every group starts with the same tokens, so that the per-prompt gradients share a
    direction (S > 0) while every sequence stays different."""
    ids, am, rm = make_batch(vocab, PROMPT_LENS, RESP_LENS, seed=seed)
    P = max(PROMPT_LENS)
    shared = make_batch(vocab, [1] * G, [max(RESP_LENS)] * G, seed=seed + 100)[0][:, 1:]  # [G, max resp]
    for i in range(ids.shape[0]):
        n = min(RESP_LENS[i], 3)
        ids[i, P:P + n] = shared[i % G, :n]
    B = ids.shape[0]
    return RolloutBatch(input_ids=ids, attention_mask=am, response_mask=rm,
                        group_ids=torch.arange(B) // G, responses=[""] * B,
                        response_lengths=rm.sum(-1), finished=torch.ones(B, dtype=torch.bool),
                        prompt_length=P)


def reference(model, batch, rewards, aggregation, baseline):
    return step_reference.reference(model, batch, rewards, aggregation, baseline, MAX_LEN)


def _close(actual, expected, rtol=RTOL, what=""):
    actual, expected = actual.double(), expected.double()
    err = float((actual - expected).norm() / expected.norm())
    assert err < rtol, f"{what}: relative error {err:.2e}"


@pytest.fixture(scope="module")
def model():
    return tiny_qwen3(layers=1, seed=2)  # tied embeddings; one layer is enough for the wiring checked here


def _run(model, batch, rewards, **settings):
    model.zero_grad(set_to_none=True)
    res = accumulate_policy_gradient(model, batch, rewards, UpdateSettings(max_len=MAX_LEN, **settings))
    return res, flat_grad(model).clone()


def _same_metrics(part: dict, whole: dict) -> None:
    """Every logged statistic of the step (spreads across prompts included) is the whole batch's."""
    assert set(part) == set(whole)
    for k in whole:
        assert float(part[k]) == pytest.approx(float(whole[k]), rel=RTOL, abs=1e-7), k


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_book_keeping_step_matches_per_sequence_reference(model, aggregation):
    """OBLR-PO update (exact weights, SNR on) on the whole batch, one group per micro-batch and an uneven
    split: gradient, advantages, w_i, the per-prompt ||g_k||^2 and S, V against the reference."""
    batch = _batch(model.config.vocab_size)
    ref = reference(model, batch, REWARDS, aggregation, "oblr")
    assert (ref["adv"].abs() > 1e-3).all() and ref["S"] > 0 and ref["V"] > 0  # real signal, no zeros
    whole = None
    for micro in MICRO:
        res, grad = _run(model, batch, REWARDS, baseline="oblr", aggregation=aggregation, need_snr=True,
                         micro_batch_groups=micro)
        _close(grad, ref["grad"], what=f"gradient, micro={micro}")
        _close(res.advantages, ref["adv"], what=f"advantages, micro={micro}")
        _close(res.per_prompt_sq_norms, ref["gk_sq"], what=f"per-prompt squared norms, micro={micro}")
        assert float(res.metrics["weights/mean"]) == pytest.approx(float(ref["w"].mean()), rel=RTOL)
        S, V, _ = signal_noise(res.per_prompt_sq_norms, grad.double().pow(2).sum(), N)
        assert float(V) == pytest.approx(float(ref["V"]), rel=1e-3), micro
        assert float(S) == pytest.approx(float(ref["S"]), rel=1e-3), micro
        whole = whole or res.metrics
        _same_metrics(res.metrics, whole)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_plain_path_step_matches_per_sequence_reference(model, aggregation):
    """rloo with no SNR takes the plain path (policy loss, one ordinary backward): the same gradient."""
    batch = _batch(model.config.vocab_size, seed=4)
    ref = reference(model, batch, REWARDS, aggregation, "rloo")
    whole = None
    for micro in (0, 2):
        res, grad = _run(model, batch, REWARDS, baseline="rloo", aggregation=aggregation, need_snr=False,
                         micro_batch_groups=micro)
        assert res.per_prompt_sq_norms is None  # the plain path was taken
        _close(grad, ref["grad"], what=f"gradient, micro={micro}")
        _close(res.advantages, ref["adv"], what=f"advantages, micro={micro}")
        whole = whole or res.metrics
        _same_metrics(res.metrics, whole)


@pytest.mark.parametrize("baseline,need_snr,aggregation", [("grpo", False, "seq_sum_const"),
                                                          ("rloo", True, "token_mean"),
                                                          ("oblr_self", True, "seq_mean")])
def test_micro_batches_give_the_whole_batch_step(model, aggregation, baseline, need_snr):
    """Micro-batches of whole groups (1 and 2 groups, an uneven split) against the whole batch at once:
    same gradient, advantages, per-prompt norms (so S and V), and batch-level metrics. Needs no optional
    package (the opacus comparison in tests/scripts/test_benchmark_smoke.py is skipped without it)."""
    batch = _batch(model.config.vocab_size, seed=5)
    whole, g_whole = _run(model, batch, REWARDS, baseline=baseline, aggregation=aggregation, need_snr=need_snr)
    assert g_whole.norm() > 0
    for mb in (1, 2):
        part, g_part = _run(model, batch, REWARDS, baseline=baseline, aggregation=aggregation, need_snr=need_snr,
                            micro_batch_groups=mb)
        _close(g_part, g_whole, what=f"gradient, {mb} groups per micro-batch")
        _close(part.advantages, whole.advantages, what="advantages")
        if need_snr:
            _close(part.per_prompt_sq_norms, whole.per_prompt_sq_norms, what="per-prompt squared norms")
            S0, V0, _ = signal_noise(whole.per_prompt_sq_norms, g_whole.double().pow(2).sum(), N)
            S1, V1, _ = signal_noise(part.per_prompt_sq_norms, g_part.double().pow(2).sum(), N)
            assert S0 > 0 and V0 > 0
            assert float(S1) == pytest.approx(float(S0), rel=1e-3) and float(V1) == pytest.approx(float(V0), rel=1e-3)
        _same_metrics(part.metrics, whole.metrics)


def test_later_epoch_uses_the_rollout_logprobs(model):
    """Epoch 2: the clipped importance-weighted loss with ratios against the ROLLOUT log-probs, at moved
    parameters (ratios far from 1, some clipped), equals the reference loss's autograd gradient."""
    import copy

    m = copy.deepcopy(model)
    batch = _batch(m.config.vocab_size, seed=6)
    settings = UpdateSettings(baseline="oblr", aggregation="seq_mean", max_len=MAX_LEN, need_snr=True,
                              micro_batch_groups=2, clip_eps=0.2)
    m.zero_grad(set_to_none=True)
    first = accumulate_policy_gradient(m, batch, REWARDS, settings)
    with torch.no_grad():  # move the policy (a deterministic perturbation standing in for epoch 1's step)
        gen = torch.Generator().manual_seed(0)
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    m.zero_grad(set_to_none=True)
    metrics = accumulate_clipped_gradient(m, batch, first, settings)
    got = flat_grad(m)
    assert float(metrics["actor/clip_frac"]) > 0 and abs(float(metrics["actor/ratio_mean"]) - 1) > 1e-2
    with torch.no_grad():
        rollout_lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    want = later_epoch_grad(m, batch, rollout_lp, first.advantages, "seq_mean", MAX_LEN, clip_eps=0.2)
    _close(got, want, what="epoch-2 gradient")
