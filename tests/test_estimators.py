"""Estimators: exact enumeration on a tiny softmax policy, the guard, validation and the registry.

Tiny policy: pi(o) = softmax(theta)_o over K outputs. The score w.r.t. theta is s(o) = e_o - p, and
w(o) = ||s(o)||^2. Expectations over G-tuples of outputs are computed exactly (float64), either over all
K^G tuples or over the multinomial count vectors (an estimator that is symmetric in its G outputs only
depends on the counts, which makes large G cheap).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from oblr import estimators as est_mod
from oblr.estimators import (
    BaselineOutput,
    available_estimators,
    compute_advantages,
    compute_baselines,
    get_estimator,
    register_estimator,
)

D = torch.float64


def policy(theta):
    p = torch.softmax(theta.to(D), 0)
    s = torch.eye(len(p), dtype=D) - p  # s[o] = e_o - p
    return p, s, (s**2).sum(1)


def all_tuples(K, G):
    tup = torch.tensor(list(itertools.product(range(K), repeat=G)))
    return tup, None


def count_tuples(K, G):
    """One sorted tuple per count vector, with its multinomial log-coefficient."""
    rows, logc = [], []
    for cut in itertools.combinations(range(G + K - 1), K - 1):
        edges = (-1,) + cut + (G + K - 1,)
        counts = [edges[k + 1] - edges[k] - 1 for k in range(K)]
        rows.append([k for k in range(K) for _ in range(counts[k])])
        logc.append(math.lgamma(G + 1) - sum(math.lgamma(c + 1) for c in counts))
    return torch.tensor(rows), torch.tensor(logc, dtype=D)


def exact_moments(method, theta, F, G, *, counts=False, **options):
    """(E[g], tr Cov(g), grad J) for g = (1/G) sum_i A_i s_i over G iid outputs, exactly."""
    p, s, w = policy(theta)
    K = len(p)
    tup, logc = (count_tuples if counts else all_tuples)(K, G)
    logprob = p.log()[tup].sum(1)
    prob = (logprob + (logc if logc is not None else 0.0)).exp()
    assert abs(float(prob.sum()) - 1.0) < 1e-10
    A = compute_advantages(method, F[tup], weights=w[tup], lengths=w[tup], **options)
    g = (A[..., None] * s[tup]).mean(1)  # [M, K]
    mean = (prob[:, None] * g).sum(0)
    trcov = (prob * (g**2).sum(1)).sum() - (mean**2).sum()
    grad = (p[:, None] * F[:, None] * s).sum(0)
    return mean, trcov, grad


THETA = torch.tensor([0.7, -0.4, 1.3, -1.0], dtype=D)
F4 = torch.tensor([1.0, 0.0, 0.3, 0.8], dtype=D)


@pytest.mark.parametrize("G", [2, 3])
@pytest.mark.parametrize("method", ["reinforce", "rloo", "oblr", "otb_proxy"])
def test_unbiased_methods_exact(method, G):
    mean, _, grad = exact_moments(method, THETA, F4, G)
    assert torch.allclose(mean, grad, atol=1e-14, rtol=0)


@pytest.mark.parametrize("G", [2, 3])
def test_group_mean_is_scaled_by_g_minus_1_over_g(G):
    for method in ("dr_grpo", "grpo"):
        mean, _, grad = exact_moments(method, THETA, F4, G, **({"scale_std": False} if method == "grpo" else {}))
        assert torch.allclose(mean, grad * (G - 1) / G, atol=1e-14, rtol=0)


@pytest.mark.parametrize("G", [2, 3])
@pytest.mark.parametrize("method", ["oblr_self", "grpo", "opo"])
def test_biased_methods_differ(method, G):
    mean, _, grad = exact_moments(method, THETA, F4, G)
    assert (mean - grad).abs().max() > 1e-3
    # and not merely a rescaling of grad J (the direction is biased)
    cos = (mean @ grad) / (mean.norm() * grad.norm())
    assert cos < 1 - 1e-6


def test_count_enumeration_matches_tuple_enumeration():
    for G in (2, 3, 4):
        a = exact_moments("oblr", THETA, F4, G)
        b = exact_moments("oblr", THETA, F4, G, counts=True)
        assert torch.allclose(a[0], b[0], atol=1e-14) and torch.allclose(a[1], b[1], atol=1e-14)


def test_population_weighted_baseline_minimises_single_sample_variance():
    p, s, w = policy(THETA)
    grad = (p[:, None] * F4[:, None] * s).sum(0)

    def trcov(b):  # tr Cov of (F - b) s for one o ~ p: E[w (F - b)^2] - ||grad J||^2
        return (p * w * (F4 - b) ** 2).sum() - grad @ grad

    b_star = (p * w * F4).sum() / (p * w).sum()
    b_mean = (p * F4).sum()
    assert trcov(b_star) < trcov(b_mean) - 1e-4
    for db in (-0.1, -1e-3, 1e-3, 0.1):
        assert trcov(b_star + db) > trcov(b_star)


# Case where the weights vary a lot: the correct output is the likely one (small w), the wrong ones
# are rare (large w). b* = E[wF]/E[w] = 0.12, far from E[F] = 0.84.
THETA3 = torch.tensor([2.0, 0.0, -1.0], dtype=D)
F3 = torch.tensor([1.0, 0.0, 0.0], dtype=D)


def test_oblr_lower_variance_than_rloo_at_g8():
    _, tr_oblr, _ = exact_moments("oblr", THETA3, F3, 8, counts=True)
    _, tr_rloo, _ = exact_moments("rloo", THETA3, F3, 8, counts=True)
    assert tr_oblr < 0.8 * tr_rloo


def test_oblr_variance_is_a_finite_sample_effect_and_converges_to_b_star():
    """Documented in docs/algorithm.md: with few other samples the weighted leave-one-out mean is a noisy
    ratio estimator, so it can be WORSE than RLOO (here at G = 3); G * tr Cov tends to the single-sample
    value at b* as G grows, which is below the value at E[F] that RLOO tends to."""
    _, tr_oblr, _ = exact_moments("oblr", THETA3, F3, 3, counts=True)
    _, tr_rloo, _ = exact_moments("rloo", THETA3, F3, 3, counts=True)
    assert tr_oblr > tr_rloo  # small G: oblr loses
    p, s, w = policy(THETA3)
    grad = (p[:, None] * F3[:, None] * s).sum(0)
    b_star = (p * w * F3).sum() / (p * w).sum()
    limit = (p * w * (F3 - b_star) ** 2).sum() - grad @ grad
    gaps = [float(G * exact_moments("oblr", THETA3, F3, G, counts=True)[1] - limit) for G in (16, 32, 64)]
    assert gaps[0] > gaps[1] > gaps[2] > 0 and gaps[2] < 0.01


def test_all_equal_rewards_give_zero_advantage_for_centred_methods():
    r = torch.ones(3, 4)
    w = torch.rand(3, 4) + 0.1
    for m in ("rloo", "grpo", "dr_grpo", "oblr", "oblr_self", "otb_proxy", "opo"):
        a = compute_advantages(m, r, weights=w, lengths=w)
        assert torch.allclose(a, torch.zeros_like(a)), m


def test_formulas_on_a_small_batch():
    r = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.5, 1.0]], dtype=D)
    w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 1.0]], dtype=D)
    b = compute_baselines("oblr", r, weights=w)
    expect = torch.tensor([[(2 * 0 + 3 * 1) / 5, (1 + 3) / 4, (1 * 1 + 2 * 0) / 3],
                           [(0 * 0.5 + 1 * 1) / 1, (4 * 0 + 1) / 5, (4 * 0 + 0) / 4]], dtype=D)
    assert torch.allclose(b, expect)
    b = compute_baselines("oblr_self", r, weights=w)
    assert torch.allclose(b, torch.tensor([[4 / 6] * 3, [1 / 5] * 3], dtype=D))
    b = compute_baselines("opo", r, lengths=w)
    assert torch.allclose(b, torch.tensor([[4 / 6] * 3, [1 / 5] * 3], dtype=D))
    a = compute_advantages("grpo", r, eps=0.0)
    assert torch.allclose(a, (r - r.mean(1, keepdim=True)) / r.std(1, keepdim=True))
    assert torch.allclose(compute_baselines("rloo", r), (r.sum(1, keepdim=True) - r) / 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtypes_and_huge_weight_no_cancellation(dtype):
    r = torch.tensor([[1.0, 0.0, 1.0]], dtype=dtype)
    w = torch.tensor([[1e10, 1.0, 3.0]], dtype=dtype)
    b = compute_baselines("oblr", r, weights=w)
    assert b.dtype == dtype
    # b_0 = (1*0 + 3*1)/4 exactly: total - w_0 would have cancelled to garbage in float32
    assert float(b[0, 0]) == pytest.approx(0.75, rel=1e-6)


def test_guard_fallback_and_count():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    w = torch.tensor([[5.0, 0.0, 0.0, 0.0], [1.0, 2.0, 1.0, 1.0]])
    a, m = compute_advantages("oblr", r, weights=w, return_metrics=True)
    # outputs 1..3 of prompt 0 see others = {5, 0, 0} -> fine; output 0 sees {0, 0, 0} -> fallback
    b = r - a
    assert int(m["baseline/fallback_count"]) == 1
    assert float(b[0, 0]) == pytest.approx(1 / 3)  # leave-one-out mean of [0, 0, 1]
    assert torch.allclose(b[0, 1:], torch.ones(3))  # only output 0 has weight: b = F_0
    # self-included methods fall back to the group mean when the whole group has zero weight
    z = torch.zeros(2, 4)
    _, m = compute_advantages("oblr_self", r, weights=z, return_metrics=True)
    assert int(m["baseline/fallback_count"]) == 8
    assert torch.allclose(compute_baselines("opo", r, lengths=z), r.mean(1, keepdim=True).expand(2, 4))
    # the guard is relative (scale-free): tiny but healthy weights never fall back
    _, m = compute_advantages("oblr", r, weights=w[1:].repeat(2, 1) * 1e-30, return_metrics=True)
    assert int(m["baseline/fallback_count"]) == 0
    # ... and guard_eps is an option
    w2 = torch.tensor([[1.0, 1e-4, 1e-4, 1e-4]] * 2)
    _, m = compute_advantages("oblr", r, weights=w2, guard_eps=1e-2, return_metrics=True)
    assert int(m["baseline/fallback_count"]) == 2


def test_metrics():
    torch.manual_seed(0)
    r = torch.rand(5, 4)
    w = torch.rand(5, 4) + 0.5
    a, m = compute_advantages("oblr", r, weights=w, return_metrics=True)
    b = r - a
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in m.values())
    assert torch.allclose(m["baseline/mean"], b.mean())
    assert torch.allclose(m["baseline/std_across_prompts"], b.mean(1).std(correction=0))
    assert torch.allclose(m["adv/mean"], a.mean()) and torch.allclose(m["adv/std"], a.std(correction=0))
    assert torch.allclose(m["adv/var_across_prompts"], a.mean(1).var(correction=0))
    assert torch.allclose(m["weights/mean"], w.mean()) and torch.allclose(m["weights/std"], w.std(correction=0))
    assert torch.allclose(m["weights/cv_within_group"], (w.std(1, correction=0) / w.mean(1)).mean())
    assert torch.allclose(m["weights/max_over_mean"], w.max() / w.mean())
    _, m = compute_advantages("rloo", r, return_metrics=True)
    assert "weights/mean" not in m and int(m["baseline/fallback_count"]) == 0
    _, m = compute_advantages("reinforce", r[:1, :1], return_metrics=True)  # N = 1, G = 1: no NaN
    assert all(torch.isfinite(v) for v in m.values())


@pytest.mark.parametrize("bad, kwargs, match", [
    (torch.zeros(4), {}, "2-D"),
    (torch.zeros(2, 1), {}, "G >= 2"),
    (torch.zeros(0, 3), {}, "empty"),
    (torch.tensor([[0.0, float("nan")]]), {"weights": torch.ones(1, 2)}, "rewards contain non-finite"),
    (torch.zeros(2, 3), {"weights": torch.zeros(2, 2)}, "weights shape"),
    (torch.zeros(2, 3), {"weights": None}, "needs `weights`"),
    (torch.zeros(2, 3), {"weights": -torch.ones(2, 3)}, "weights must be >= 0"),
    (torch.zeros(2, 3), {"weights": torch.full((2, 3), float("inf"))}, "weights contain non-finite"),
    (torch.zeros(2, 3), {"weights": torch.ones(2, 3), "bogus": 1}, "unknown option"),
])
def test_errors(bad, kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_advantages("oblr", bad, **kwargs)


def test_error_messages_for_lengths_and_names():
    with pytest.raises(ValueError, match="needs `lengths`"):
        compute_advantages("opo", torch.zeros(2, 3), weights=torch.ones(2, 3))
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        compute_advantages("opo", torch.zeros(2, 3), lengths=-torch.ones(2, 3))
    with pytest.raises(ValueError, match="unknown estimator .nope.; registered: .*oblr"):
        get_estimator("nope")
    with pytest.raises(ValueError, match="G >= 1"):
        compute_advantages("reinforce", torch.zeros(2, 0))


def test_registry():
    names = available_estimators()
    for n in ("reinforce", "rloo", "grpo", "dr_grpo", "opo", "otb_proxy", "oblr", "oblr_self"):
        assert n in names
    assert get_estimator("oblr").weights == "exact"
    assert get_estimator("otb_proxy").weights == "logit_energy"
    assert get_estimator("opo").weights == "length"
    assert get_estimator("rloo").weights is None
    assert get_estimator("reinforce").min_group_size == 1
    with pytest.raises(ValueError, match="already registered"):
        register_estimator("rloo")(lambda rewards, weights: rewards)
    with pytest.raises(ValueError, match="weights must be one of"):
        register_estimator("x_bad_kind", weights="norm")


def test_custom_estimator():
    name = "test_median_loo"
    try:
        @register_estimator(name, weights="exact")
        def median_like(rewards, weights, *, shift: float = 0.0):
            return BaselineOutput(baseline=(rewards * weights).sum(-1, keepdim=True).expand_as(rewards) * 0 + shift)

        assert name in available_estimators() and get_estimator(name).weights == "exact"
        r = torch.rand(2, 3)
        a = compute_advantages(name, r, weights=torch.ones(2, 3), shift=0.25)
        assert torch.allclose(a, r - 0.25)
        with pytest.raises(ValueError, match="needs `weights`"):
            compute_advantages(name, r)
        with pytest.raises(ValueError, match="unknown option"):
            compute_advantages(name, r, weights=torch.ones(2, 3), scale=1.0)
        # a plain tensor return is accepted too; a wrong shape is caught
        est_mod.ESTIMATORS.unregister(name)
        register_estimator(name)(lambda rewards, weights: rewards.mean(-1))
        with pytest.raises(ValueError, match="returned baselines of shape"):
            compute_advantages(name, r)
    finally:
        if name in est_mod.ESTIMATORS:
            est_mod.ESTIMATORS.unregister(name)
