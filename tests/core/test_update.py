"""oblr.update on its own: every path against one-prompt-at-a-time autograd references, KL inside g_k,
one meaning per metric on the book-keeping, plain and micro-batch paths."""

from __future__ import annotations

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import make_batch

from oblr.config import AlgorithmConfig, load_config
from oblr.distributed.step import step_statistics
from oblr.estimators import compute_advantages
from oblr.logprobs import token_logprobs
from oblr.losses import BatchTotals, sequence_kl, sequence_scale
from oblr.snr import signal_noise
from oblr.update import (
    DERIVED,
    UpdateSettings,
    accumulate_clipped_gradient,
    accumulate_policy_gradient,
    step_kl_sums,
)

N, G = 3, 4
MAX_LEN = 7


def _batch(vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, 5, (N,), generator=gen).repeat_interleave(G).tolist()
    resps = torch.randint(1, MAX_LEN + 1, (N * G,), generator=gen).tolist()
    ids, am, rm = make_batch(vocab, prompts, resps, seed=seed)
    batch = SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm,
                            response_lengths=rm.sum(-1), group_ids=torch.arange(N).repeat_interleave(G))
    rewards = (torch.rand(N, G, generator=gen) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0  # every group carries signal
    return batch, rewards


@pytest.fixture(scope="module")
def setup():
    model = tiny_qwen3(seed=3).train()
    ref = copy.deepcopy(tiny_qwen3(seed=4)).eval().requires_grad_(False)  # a reference unlike the policy
    batch, rewards = _batch(model.config.vocab_size)
    return model, ref, batch, rewards


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def _run(model, batch, rewards, ref=None, **kw):
    for p in model.parameters():
        p.grad = None
    settings = UpdateSettings(**{"aggregation": "seq_sum_const", "max_len": MAX_LEN, **kw})
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref)
    return res, [p.grad.clone() for p in _params(model)]


def _close(a, b, rtol=2e-4):
    return all(torch.allclose(x, y, rtol=rtol, atol=rtol * float(y.abs().max()) + 1e-12) for x, y in zip(a, b))


def _reference(model, batch, advantages, ref=None, kl_coef=0.0):
    """One prompt at a time with autograd: g_k = N grad sum_{i in k} obj_i, obj_i = coeff_i l_i + kl_coef c_i KL_i."""
    c = sequence_scale(batch.response_mask.float(), "seq_sum_const", max_len=MAX_LEN)
    coeffs = -advantages.reshape(-1) * c
    params = _params(model)
    gks, loss = [], 0.0
    for k in range(N):
        rows = slice(k * G, (k + 1) * G)
        rm = batch.response_mask[rows].float()
        tok = token_logprobs(model, batch.input_ids[rows], batch.attention_mask[rows])
        obj = coeffs[rows] * (tok * rm).sum(-1)
        if kl_coef:
            ref_tok = token_logprobs(ref, batch.input_ids[rows], batch.attention_mask[rows]).detach()
            obj = obj + kl_coef * c[rows] * sequence_kl(tok, ref_tok, rm)
        loss += float(obj.detach().sum())
        gks.append([N * g for g in torch.autograd.grad(obj.sum(), params)])
    gbar = [sum(g[j] for g in gks) / N for j in range(len(params))]
    sq = torch.stack([sum(x.pow(2).sum() for x in g) for g in gks])
    return gbar, sq, loss


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
@pytest.mark.parametrize("baseline", ["oblr", "grpo"])
def test_book_keeping_path_matches_one_prompt_at_a_time_reference(setup, baseline, kl_coef):
    model, ref, batch, rewards = setup
    res, grad = _run(model, batch, rewards, ref if kl_coef else None, baseline=baseline, kl_coef=kl_coef)
    gbar, sq, loss = _reference(model, batch, res.advantages, ref, kl_coef)
    assert _close(grad, gbar)
    assert torch.allclose(res.per_prompt_sq_norms, sq, rtol=2e-4)
    S, V, _ = signal_noise(sq.double(), sum(g.double().pow(2).sum() for g in gbar), N)
    _, st = step_statistics(_params(model), res.per_prompt_sq_norms, float64=False)  # as oblr train's step
    assert float(st.V) >= 0  # S and V describe the same vectors as the update (the KL term is in g_k)
    assert float(st.V) == pytest.approx(float(V), rel=2e-3, abs=1e-12)
    assert float(st.S) == pytest.approx(float(S), rel=2e-3, abs=1e-12)
    assert float(res.metrics["optim/loss"]) == pytest.approx(loss, rel=1e-5, abs=1e-9)
    assert ("actor/kl" in res.metrics) == bool(kl_coef)
    assert (res.ref_logprobs is not None) == bool(kl_coef)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_plain_path_and_micro_batches_mean_the_same_as_the_whole_batch(setup, kl_coef):
    """optim/loss and every other metric are the same quantity on the book-keeping path (whole batch and
    micro-batches) and the plain path."""
    model, ref, batch, rewards = setup
    r = ref if kl_coef else None
    whole, g_whole = _run(model, batch, rewards, r, baseline="grpo", kl_coef=kl_coef)
    plain, g_plain = _run(model, batch, rewards, r, baseline="grpo", kl_coef=kl_coef, need_snr=False)
    micro, g_micro = _run(model, batch, rewards, r, baseline="grpo", kl_coef=kl_coef, micro_batch_groups=2)
    assert plain.per_prompt_sq_norms is None
    assert torch.allclose(micro.per_prompt_sq_norms, whole.per_prompt_sq_norms, rtol=2e-4)
    for res, grad in ((plain, g_plain), (micro, g_micro)):
        assert _close(grad, g_whole)
        assert set(res.metrics) == set(whole.metrics)
        for k, v in whole.metrics.items():
            assert float(res.metrics[k]) == pytest.approx(float(v), rel=1e-5, abs=1e-9), k
        assert torch.equal(res.advantages, whole.advantages)


def test_micro_batch_metrics_are_whole_batch_statistics(setup):
    """Spreads (std, var, max) over a batch assembled from micro-batches are the whole batch's, not an
    average of the micro-batches' spreads."""
    model, _, batch, rewards = setup
    whole, _ = _run(model, batch, rewards, baseline="oblr")
    micro, _ = _run(model, batch, rewards, baseline="oblr", micro_batch_groups=1)
    for k in ("adv/std", "adv/var_across_prompts", "baseline/std_across_prompts", "weights/std",
              "weights/max_over_mean", "weights/cv_within_group"):
        assert float(micro.metrics[k]) == pytest.approx(float(whole.metrics[k]), rel=1e-5), k
    _, m = compute_advantages("oblr", rewards, weights=torch.rand(N, G), return_metrics=True)
    assert set(m) <= set(whole.metrics)


def test_loop_norms_method_matches_the_one_backward_methods(setup):
    model, ref, batch, rewards = setup
    auto, g_auto = _run(model, batch, rewards, ref, baseline="oblr", kl_coef=0.3)
    for method in ("loop", "ghost", "materialize"):
        res, g = _run(model, batch, rewards, ref, baseline="oblr", kl_coef=0.3, norms_method=method)
        assert _close(g, g_auto), method
        assert torch.allclose(res.per_prompt_sq_norms, auto.per_prompt_sq_norms, rtol=2e-4), method
        assert torch.allclose(res.advantages, auto.advantages, rtol=1e-4, atol=1e-6), method


def test_kl_needs_a_reference(setup):
    model, _, batch, rewards = setup
    with pytest.raises(ValueError, match="needs ref_model"):
        _run(model, batch, rewards, baseline="rloo", kl_coef=0.1)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_later_epoch_is_the_clipped_loss_and_merges_micro_batch_metrics(setup, kl_coef):
    model, ref, batch, rewards = setup
    r = ref if kl_coef else None
    first, _ = _run(model, batch, rewards, r, baseline="rloo", kl_coef=kl_coef)
    out = {}
    for mb in (0, 1):
        settings = UpdateSettings(baseline="rloo", max_len=MAX_LEN, kl_coef=kl_coef, micro_batch_groups=mb)
        for p in model.parameters():
            p.grad = None
        out[mb] = (accumulate_clipped_gradient(model, batch, first, settings), [p.grad.clone() for p in _params(model)])
    (m0, g0), (m1, g1) = out[0], out[1]
    assert _close(g1, g0)
    assert set(m0) == set(m1) == {"actor/clip_frac", "actor/ratio_mean", "actor/pg_loss"} | (
        {"actor/kl"} if kl_coef else set())
    for k in m0:
        assert float(m1[k]) == pytest.approx(float(m0[k]), rel=1e-5, abs=1e-9), k
    # on the rollout policy itself the ratio is 1 and the clipped loss has the first update's gradient
    _, g_first = _run(model, batch, rewards, r, baseline="rloo", kl_coef=kl_coef)
    assert _close(g0, g_first) and float(m0["actor/ratio_mean"]) == pytest.approx(1.0)


def test_settings_are_derived_from_the_config():
    names = {f.name for f in dataclasses.fields(UpdateSettings)}
    assert names - DERIVED <= {f.name for f in dataclasses.fields(AlgorithmConfig)}
    cfg = load_config(None, ["algorithm.baseline=rloo", "algorithm.kl_coef=0.2", "algorithm.micro_batch_groups=2",
                             "algorithm.baseline_options={}", "rollout.max_new_tokens=12", "algorithm.track_snr=true"])
    s = UpdateSettings.from_config(cfg, schedule_needs_snr=False)
    assert (s.baseline, s.kl_coef, s.micro_batch_groups, s.max_len, s.need_snr) == ("rloo", 0.2, 2, 12, True)
    assert not UpdateSettings.from_config(load_config(None, ["algorithm.lr_schedule=constant"]),
                                          schedule_needs_snr=False).need_snr


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_update_scores_sampled_tokens_under_the_distribution_that_sampled_them(top_p):
    """Issue 11 item 2: at T = 0.7 (and with a top-p nucleus) the log-prob the update uses for each sampled
    token equals the sampler's own; scoring with the raw softmax (T = 1) would not."""
    from oblr.rollout.hf import _generate_chunk, assemble_batch

    model = tiny_qwen3(seed=3).eval()
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, model.config.vocab_size, (N, 5), generator=gen).repeat_interleave(G, dim=0)
    mask = torch.ones_like(prompts)
    eos = 1
    chunk = _generate_chunk(model, prompts, mask, eos_id=eos, pad_id=0, max_new_tokens=6, temperature=0.7,
                            top_p=top_p, greedy=False, generator=gen)
    decode = SimpleNamespace(batch_decode=lambda seqs, **_: ["" for _ in seqs])
    batch = assemble_batch([chunk], prompts, mask, decode, eos_id=eos, pad_id=0, num_samples=G)
    rewards = torch.rand(N, G, generator=gen)
    rm = batch.response_mask.bool()
    model.train()
    res, _ = _run(model, batch, rewards, baseline="rloo", temperature=0.7, top_p=top_p)
    assert torch.allclose(res.old_logprobs[rm], batch.sampler_logprobs[rm], atol=1e-5, rtol=0)
    assert (res.old_logprobs[~rm] == 0).all()
    raw, _ = _run(model, batch, rewards, baseline="rloo")  # the raw softmax is another distribution
    assert (raw.old_logprobs[rm] - batch.sampler_logprobs[rm]).abs().max() > 1e-2


def test_update_settings_take_the_sampling_distribution_from_the_rollout_config():
    cfg = load_config(overrides=["rollout.temperature=0.7", "rollout.top_p=0.9"])
    s = UpdateSettings.from_config(cfg, schedule_needs_snr=True)
    assert (s.temperature, s.top_p) == (0.7, 0.9)


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_without_assembling_the_gradient_the_norms_and_advantages_are_the_same_and_grad_untouched(setup, kl_coef):
    """assemble_grad=False (an engine that runs its own backward, e.g. TRL under DeepSpeed): the same
    advantages, weights and per-prompt norms as the assembling call, micro-batched or not, and .grad stays None."""
    model, ref, batch, rewards = setup
    r = ref if kl_coef else None
    whole, _ = _run(model, batch, rewards, r, baseline="oblr", kl_coef=kl_coef)
    for mb in (0, 2):
        for p in model.parameters():
            p.grad = None
        settings = UpdateSettings(aggregation="seq_sum_const", max_len=MAX_LEN, baseline="oblr", kl_coef=kl_coef,
                                  micro_batch_groups=mb, assemble_grad=False)
        res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=r)
        assert all(p.grad is None for p in model.parameters())
        assert torch.allclose(res.per_prompt_sq_norms, whole.per_prompt_sq_norms, rtol=2e-4)
        assert torch.allclose(res.estimate.weights, whole.estimate.weights, rtol=1e-5)
        assert torch.allclose(res.advantages, whole.advantages, rtol=1e-5, atol=1e-7)
        assert float(res.metrics["optim/loss"]) == pytest.approx(float(whole.metrics["optim/loss"]), rel=1e-5)


def test_one_result_type_whoever_calls_it(setup):
    """Every way of calling the core (the whole batch; a rank's rows with the global totals; a framework's
    factors with the global prompt count; no assembly) returns the same fields, computed from its rows only:
    the core holds no step statistics (||gbar||^2 and S, V are oblr.distributed.step.step_statistics')."""
    model, _, batch, rewards = setup
    c = sequence_scale(batch.response_mask.float(), "seq_sum_const", max_len=MAX_LEN)
    settings = UpdateSettings(aggregation="seq_sum_const", max_len=MAX_LEN, baseline="oblr")
    calls = {
        "whole batch": dict(),
        "rank rows": dict(totals=BatchTotals.of(batch.response_mask)),
        "given factors": dict(seq_scale=c, n_prompts=N),
        "no assembly": dict(settings=dataclasses.replace(settings, assemble_grad=False)),
    }
    filled = {}
    for name, kw in calls.items():
        for p in model.parameters():
            p.grad = None
        res = accumulate_policy_gradient(model, batch, rewards, kw.pop("settings", settings), **kw)
        filled[name] = sorted(f.name for f in dataclasses.fields(res) if getattr(res, f.name) is not None)
        # the same rows and the same N: the same per-prompt norms whoever asks
        assert torch.allclose(res.per_prompt_sq_norms, filled.setdefault("gks", res.per_prompt_sq_norms), rtol=1e-5)
    gks = filled.pop("gks")
    assert gks.shape == (N,)
    assert all(v == filled["whole batch"] for v in filled.values()), filled
    assert filled["whole batch"] == ["advantages", "estimate", "metrics", "old_logprobs", "per_prompt_sq_norms"]
    assert not {"grad_sq_norm", "snr"} & {f.name for f in dataclasses.fields(res)}


def test_given_factors_and_prompt_count_are_used_as_given(setup):
    """seq_scale (a framework's own loss factors, e.g. TRL's dr_grpo times vLLM's per-row ratios) replaces
    the aggregation's factors; n_prompts scales the per-prompt norms like the rows of a larger batch."""
    model, _, batch, rewards = setup
    c = sequence_scale(batch.response_mask.float(), "seq_sum_const", max_len=MAX_LEN)
    ratio = torch.linspace(0.5, 1.5, N * G)
    for p in model.parameters():
        p.grad = None
    settings = UpdateSettings(aggregation="token_mean", baseline="oblr")  # overridden by seq_scale
    res = accumulate_policy_gradient(model, batch, rewards, settings, seq_scale=c * ratio, n_prompts=2 * N)
    grad = [p.grad.clone() for p in _params(model)]
    # reference: one prompt at a time with the given factors; exact weights are (c_i r_i)^2 ||s_i||^2
    params = _params(model)
    s_rows = []
    for i in range(N * G):
        tok = token_logprobs(model, batch.input_ids[i:i + 1], batch.attention_mask[i:i + 1])
        lp = (tok * batch.response_mask[i:i + 1].float()).sum()
        s_rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(lp, params)]))
    s = torch.stack(s_rows).double()
    f = (c * ratio).double()
    w_ref = s.pow(2).sum(-1) * f * f
    assert torch.allclose(res.estimate.weights.reshape(-1).double(), w_ref, rtol=2e-4)
    adv = compute_advantages("oblr", rewards.double(), weights=w_ref.view(N, G))
    assert torch.allclose(res.advantages.double(), adv, rtol=1e-4, atol=1e-8)
    contrib = -adv.reshape(-1, 1) * f[:, None] * s
    flat, want = torch.cat([g.reshape(-1) for g in grad]).double(), contrib.sum(0)
    assert float((flat - want).norm() / want.norm()) < 1e-4
    gk = (2 * N) * contrib.view(N, G, -1).sum(1)
    assert torch.allclose(res.per_prompt_sq_norms.double(), gk.pow(2).sum(-1), rtol=2e-4)
    with pytest.raises(ValueError, match="seq_scale must have shape"):
        accumulate_policy_gradient(model, batch, rewards, settings, seq_scale=c[:-1])


def test_entropy_is_that_of_the_sampling_distribution(setup):
    """train/entropy: the token mean of the entropy of softmax(logits / temperature), the distribution the
    rollouts were drawn from (what TRL and verl log), on every path."""
    model, _, batch, rewards = setup
    from oblr.logprobs import forward_logits, token_entropy

    rm = batch.response_mask.float()
    with torch.no_grad():
        logits = forward_logits(model, batch.input_ids, batch.attention_mask)
    for t in (1.0, 0.7):
        want = float((token_entropy(logits / t) * rm).sum() / rm.sum())
        res, _ = _run(model, batch, rewards, baseline="grpo", temperature=t)
        assert float(res.metrics["train/entropy"]) == pytest.approx(want, rel=1e-5)
        plain, _ = _run(model, batch, rewards, baseline="grpo", temperature=t, need_snr=False)
        assert float(plain.metrics["train/entropy"]) == pytest.approx(want, rel=1e-5)


def test_weight_sources_are_a_registry_of_the_kinds_estimators_declare():
    """Every weight kind an estimator may declare has a source, and an unknown one is one line listing them."""
    from oblr.estimators import WEIGHT_KINDS
    from oblr.registry import Registry, UnknownNameError
    from oblr.update import WEIGHT_SOURCES

    assert isinstance(WEIGHT_SOURCES, Registry)
    assert WEIGHT_SOURCES.names() == sorted(k for k in WEIGHT_KINDS if k is not None)
    with pytest.raises(UnknownNameError, match="unknown weight source 'norms'; registered: exact, length, logit_energy"):
        WEIGHT_SOURCES.get("norms")


def _step_kl_reference(old_model, new_model, batch):
    """One sequence at a time: sum over its response tokens of k3 = r - 1 - log r, r = p_new / p_old."""
    kl, tokens = 0.0, 0.0
    for i in range(batch.input_ids.shape[0]):
        row = slice(i, i + 1)
        with torch.no_grad():
            old = token_logprobs(old_model, batch.input_ids[row], batch.attention_mask[row])[0].double()
            new = token_logprobs(new_model, batch.input_ids[row], batch.attention_mask[row])[0].double()
        on = batch.response_mask[i] > 0
        log_r = (new - old)[on]
        kl += float((log_r.exp() - 1 - log_r).sum())
        tokens += float(on.sum())
    return kl, tokens


@pytest.mark.parametrize("micro_batch_groups", [0, 1, 2])
def test_step_kl_is_the_k3_sum_of_the_old_policys_tokens_one_sequence_at_a_time(setup, micro_batch_groups):
    model, _, batch, rewards = setup
    model = copy.deepcopy(model)
    before = copy.deepcopy(model)
    res, _ = _run(model, batch, rewards, baseline="grpo", need_snr=False)
    with torch.no_grad():  # a real step: SGD along the update's own gradient, large enough to move every row
        for p in _params(model):
            p -= 20.0 * p.grad
    settings = UpdateSettings(aggregation="seq_sum_const", max_len=MAX_LEN, micro_batch_groups=micro_batch_groups)
    got = step_kl_sums(model, batch, res.old_logprobs, settings, G)
    kl, tokens = _step_kl_reference(before, model, batch)
    assert float(got[1]) == tokens == float(batch.response_mask.sum())
    assert kl > 1e-4  # the step moved the policy: the comparison is not between zeros
    assert float(got[0]) == pytest.approx(kl, rel=1e-4)
    # no step, no change: the update's own log-probs against the same weights give exactly 0
    assert float(step_kl_sums(before, batch, res.old_logprobs, settings, G)[0]) == pytest.approx(0.0, abs=1e-6)


def test_step_kl_of_a_tiny_step_is_measured_not_rounded_away(setup):
    """A step whose KL is about 1e-10 nats per token (a probe far below a working rate, as the kl schedule takes
    from a low guess): step_kl_sums against the one-sequence-at-a-time reference on the same weights in float64.
    The float32 ``exp(d) - d - 1`` misses it (the regime: that formula is off by more than half here)."""
    model, _, batch, rewards = setup
    model = copy.deepcopy(model)
    before = copy.deepcopy(model)
    res, _ = _run(model, batch, rewards, baseline="grpo", need_snr=False)
    with torch.no_grad():
        for p in _params(model):
            p -= 2e-5 * p.grad
    settings = UpdateSettings(aggregation="seq_sum_const", max_len=MAX_LEN)
    got = step_kl_sums(model, batch, res.old_logprobs, settings, G)
    old64, new64 = copy.deepcopy(before).double(), copy.deepcopy(model).double()
    kl = tokens = 0.0
    for i in range(batch.input_ids.shape[0]):  # one sequence at a time, its padding stripped, all in float64
        keep = batch.attention_mask[i].bool()
        ids, on = batch.input_ids[i][keep][None], batch.response_mask[i][keep][1:].bool()
        with torch.no_grad():
            lps = [torch.log_softmax(m(input_ids=ids).logits[0, :-1].double(), -1).gather(-1, ids[0, 1:, None])[:, 0]
                   for m in (old64, new64)]
        d = (lps[1] - lps[0])[on]
        kl += float((torch.expm1(d) - d).sum())
        tokens += float(on.sum())
    assert float(got[1]) == tokens
    assert 1e-12 < kl / tokens < 1e-8  # the regime: far below float32's resolution of exp(d) near 1
    assert float(got[0]) == pytest.approx(kl, rel=0.05)
    with torch.no_grad():  # the float32 formula on the same log-probs
        new = torch.cat([token_logprobs(model, batch.input_ids[i:i + 1], batch.attention_mask[i:i + 1])
                         for i in range(batch.input_ids.shape[0])])
    naive = float(sequence_kl(res.old_logprobs.float(), new.float(), batch.response_mask).sum())
    assert abs(naive - kl) > 0.5 * kl


def test_k3_averaged_over_the_old_policys_tokens_is_the_exact_kl():
    """E_{y ~ p}[k3(y)] = KL(p || q), by enumeration of a 5-token vocabulary (sequence_kl with q as reference)."""
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.1, 0.2, 0.1], dtype=torch.float64)
    lp, lq = p.log().view(-1, 1), q.log().view(-1, 1)  # one 1-token sequence per vocabulary entry
    k3 = sequence_kl(lp, lq, torch.ones_like(lp))
    assert float((p * k3).sum()) == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-12)
