"""SNR statistics (Monte Carlo on a Gaussian gradient model), the controller, and the noisy quadratic."""

from __future__ import annotations

import math

import pytest
import torch

from oblr.snr import (AdamSNRLearningRate, SNRLearningRate, momentum_noise_share, signal_noise,
                      signal_noise_from_microbatches, snr_factor, snr_statistics)

D = torch.float64


def gaussian_model(d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = 2 * torch.randn(d, generator=g, dtype=D)
    A = torch.randn(d, d, generator=g, dtype=D) * 0.5
    return g, mu, A  # Sigma = A A^T


def within_4_se(samples: torch.Tensor, target: float):
    mean, se = float(samples.mean()), float(samples.std() / math.sqrt(len(samples)))
    assert abs(mean - target) < 4 * se, (mean, target, se)


def test_signal_noise_unbiased_monte_carlo():
    g, mu, A = gaussian_model()
    N, trials = 8, 4000
    grads = mu + torch.randn(trials, N, len(mu), generator=g, dtype=D) @ A.T  # g_k ~ N(mu, A A^T)
    out = [signal_noise((x**2).sum(-1), (x.mean(0) ** 2).sum(), N) for x in grads]
    S = torch.stack([o[0] for o in out])
    V = torch.stack([o[1] for o in out])
    assert (S > 0).all()  # ||mu||^2 >> tr(Sigma)/N here, so the clamp at 0 never acts: S is unbiased
    within_4_se(V, float((A * A).sum()))
    within_4_se(S, float(mu @ mu))
    snr = torch.stack([o[2] for o in out])
    assert torch.allclose(snr, S / V)


def test_microbatch_estimator_unbiased_monte_carlo():
    g, mu, A = gaussian_model(seed=1)
    N, m, trials = 16, 4, 4000
    grads = mu + torch.randn(trials, N, len(mu), generator=g, dtype=D) @ A.T
    micro = grads.view(trials, N // m, m, -1).mean(2)
    out = [signal_noise_from_microbatches((mi**2).sum(-1), m, (x.mean(0) ** 2).sum(), N)
           for mi, x in zip(micro, grads)]
    S = torch.stack([o[0] for o in out])
    V = torch.stack([o[1] for o in out])
    assert (S > 0).all()
    within_4_se(V, float((A * A).sum()))
    within_4_se(S, float(mu @ mu))


def test_signal_noise_formula_and_edge_cases():
    sq = torch.tensor([1.0, 3.0, 2.0])
    S, V, snr = signal_noise(sq, 1.5, 3)
    assert float(V) == pytest.approx((6.0 - 4.5) / 2) and float(S) == pytest.approx(1.5 - 0.75 / 3)
    S2, V2, _ = signal_noise(sq.sum(), 1.5, n_prompts=3)  # already-reduced sum (data parallel)
    assert torch.allclose(S, S2) and torch.allclose(V, V2)
    # identical per-prompt gradients: V = 0 -> SNR = inf (S > 0), no NaN; all zero: everything 0
    S, V, snr = signal_noise(torch.full((4,), 2.0), 2.0, 4)
    assert float(V) == 0 and float(S) == 2.0 and math.isinf(float(snr))
    S, V, snr = signal_noise(torch.zeros(4), 0.0, 4)
    assert float(S) == float(V) == float(snr) == 0.0
    # pure noise: S clamps to 0
    S, V, snr = signal_noise(torch.tensor([1.0, 1.0]), 0.0, 2)
    assert float(S) == 0 and float(V) == 2.0 and float(snr) == 0
    with pytest.raises(ValueError, match="at least N = 2"):
        signal_noise(torch.tensor([1.0]), 1.0, 1)
    with pytest.raises(ValueError, match="n_prompts = 5"):
        signal_noise(sq, 1.0, 5)
    with pytest.raises(ValueError, match="pass n_prompts"):
        signal_noise(sq.sum(), 1.0)
    with pytest.raises(ValueError, match="micro_size < full_size"):
        signal_noise_from_microbatches(sq, 4, 1.0, 4)
    assert snr_factor(0.0, 0.0, 8) == 0.0 and snr_factor(1.0, 0.0, 8) == 1.0
    assert snr_factor(1.0, 2.0, 4) == pytest.approx(2 / 3)


def make_opt(lrs=(0.1,)):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups)


def test_controller_rule_warmup_floor():
    opt = make_opt()
    ctl = SNRLearningRate(opt, 1.0, eta_min=0.05, warmup_steps=4)
    lrs = [ctl.step(1.0, 2.0, 4)[0] for _ in range(5)]
    assert lrs == pytest.approx([k / 4 * 2 / 3 for k in (1, 2, 3, 4)] + [2 / 3])
    assert opt.param_groups[0]["lr"] == pytest.approx(2 / 3) and ctl.last_factor == pytest.approx(2 / 3)
    assert ctl.step(0.0, 5.0, 4) == [0.05]  # no signal -> floor
    assert ctl.step(torch.tensor(0.0), torch.tensor(0.0), 4) == [0.05]  # S = V = 0 -> factor 0, finite
    assert ctl.last_factor == 0.0
    assert ctl.step(3.0, 0.0, 4) == [1.0]  # no noise -> eta_max
    assert ctl.step(1.0, -0.5, 4) == [1.0]  # negative V (micro-batch estimate) clamps to 0


def test_controller_multiplier_mode_and_groups():
    opt = make_opt((0.1, 0.01))
    ctl = SNRLearningRate(opt)  # eta_max = each group's initial lr
    assert ctl.step(1.0, 4.0, 4) == pytest.approx([0.05, 0.005])
    ctl = SNRLearningRate(make_opt((0.1, 0.01)), [1.0, 2.0])
    assert ctl.step(1.0, 4.0, 4) == pytest.approx([0.5, 1.0])
    with pytest.raises(ValueError, match="2 param groups"):
        SNRLearningRate(make_opt((0.1, 0.01)), [1.0])


def test_controller_ema_bias_corrected():
    ctl = SNRLearningRate(make_opt(), 1.0, ema=0.5)
    ctl.step(1.0, 2.0, 1)
    assert (ctl.last_S, ctl.last_V) == pytest.approx((1.0, 2.0))  # bias correction: first value exact
    ctl.step(3.0, 2.0, 1)
    assert (ctl.last_S, ctl.last_V) == pytest.approx((1.75 / 0.75, 2.0))
    assert ctl.get_last_lr()[0] == pytest.approx(snr_factor(1.75 / 0.75, 2.0, 1))


def test_controller_nan_is_ignored_and_counted():
    opt = make_opt()
    ctl = SNRLearningRate(opt, 1.0, warmup_steps=2)
    ctl.step(1.0, 1.0, 1)
    before = ctl.get_last_lr()
    assert ctl.step(float("nan"), 1.0, 1) == before
    assert ctl.step(1.0, torch.tensor(float("inf")), 1) == before
    assert ctl.n_skipped == 2 and ctl.steps == 1 and opt.param_groups[0]["lr"] == before[0]
    assert ctl.metrics()["snr/skipped"] == 2.0
    with pytest.raises(ValueError, match="positive integer"):
        ctl.step(1.0, 1.0, 0)


def test_controller_metrics():
    ctl = SNRLearningRate(make_opt(), 1.0)
    assert set(ctl.metrics()) == {"snr/lr", "snr/skipped"}
    ctl.step(torch.tensor(1.0), torch.tensor(2.0), 4)
    m = ctl.metrics()
    assert m["snr/S"] == 1.0 and m["snr/V"] == 2.0 and m["snr/snr"] == 0.5 and m["snr/n_snr"] == 2.0
    assert m["snr/factor"] == pytest.approx(2 / 3) and m["snr/lr"] == pytest.approx(2 / 3)
    ctl.step(1.0, 0.0, 4)
    assert math.isinf(ctl.metrics()["snr/snr"]) and ctl.metrics()["snr/factor"] == 1.0


def test_controller_state_dict_round_trip():
    g = torch.Generator().manual_seed(0)
    seq = [(float(torch.rand(1, generator=g)), float(torch.rand(1, generator=g)) * 3) for _ in range(12)]
    seq[3] = (float("nan"), 1.0)

    def fresh():
        return SNRLearningRate(make_opt((0.3, 0.03)), eta_min=0.01, ema=0.7, warmup_steps=5)

    a = fresh()
    for s, v in seq[:6]:
        a.step(s, v, 8)
    state = a.state_dict()
    b = fresh()
    b.load_state_dict(state)
    assert b.get_last_lr() == a.get_last_lr() and b.optimizer.param_groups[1]["lr"] == a.get_last_lr()[1]
    for s, v in seq[6:]:
        assert a.step(s, v, 8) == b.step(s, v, 8)
    assert a.state_dict() == b.state_dict()
    with pytest.raises(ValueError, match="missing keys"):
        b.load_state_dict({"steps": 1})


@pytest.mark.parametrize("kwargs, match", [
    ({"eta_max": -1.0}, "eta_max"), ({"eta_max": 1.0, "ema": 1.0}, "ema"),
    ({"eta_max": 1.0, "eta_min": -1.0}, "eta_min"), ({"eta_max": 1.0, "warmup_steps": 1.5}, "warmup_steps"),
])
def test_controller_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SNRLearningRate(make_opt(), **kwargs)


# ---- noisy quadratic f(theta) = (L/2)||theta||^2, per-prompt gradients g_k = L theta + xi_k ------------
L_SMOOTH, SIGMA = 2.0, 1.0


def exact_decrease(grad_sq, tr, n, eta):
    """f(theta) - E f(theta - eta gbar) = eta ||grad||^2 - (L/2) eta^2 (||grad||^2 + tr/n), exact."""
    return eta * grad_sq - L_SMOOTH / 2 * eta**2 * (grad_sq + tr / n)


def test_rule_with_exact_statistics_maximises_expected_decrease():
    d, n = 50, 8
    tr = d * SIGMA**2
    fine = torch.linspace(0, 1.5 / L_SMOOTH, 3001, dtype=D)
    for n_snr in (0.05, 0.3, 1.0, 3.0, 10.0):
        grad_sq = n_snr * tr / n
        eta_rule = (1 / L_SMOOTH) * snr_factor(grad_sq, tr, n)
        best = exact_decrease(grad_sq, tr, n, fine).max()
        assert exact_decrease(grad_sq, tr, n, eta_rule) >= best - 1e-12


def rule_decrease_mc(n_snr, d, n, trials, gen):
    """Monte Carlo E[f(theta) - f(theta')] for the rule with S, V estimated from the step's own g_k."""
    tr = d * SIGMA**2
    grad = torch.full((d,), math.sqrt(n_snr * tr / n / d), dtype=D)  # L theta
    theta = grad / L_SMOOTH
    ctl = SNRLearningRate(make_opt(), 1 / L_SMOOTH)
    g = grad + SIGMA * torch.randn(trials, n, d, generator=gen, dtype=D)
    gbar = g.mean(1)
    sq, msq = (g**2).sum(-1), (gbar**2).sum(-1)
    dec = []
    for k in range(trials):
        S, V, _ = signal_noise(sq[k], msq[k], n)
        eta = ctl.step(S, V, n)[0]
        new = theta - eta * gbar[k]
        dec.append(L_SMOOTH / 2 * (theta @ theta - new @ new))
    return torch.stack(dec), float(grad @ grad), tr


def test_rule_beats_every_fixed_step_across_snr_levels():
    """The plug-in rule (S, V estimated from the step's own N gradients, eta_max = 1/L) against fixed
    steps on a grid, over states from noise- to signal-dominated: mean efficiency (expected decrease /
    the oracle's) is higher for the rule than for any fixed step. Per state, a grid point next to the
    oracle step can beat the plug-in rule (its estimation noise costs a little); see docs/algorithm.md."""
    gen = torch.Generator().manual_seed(0)
    d, n, trials = 1000, 8, 300
    grid = torch.arange(1, 21, dtype=D) / (20 * L_SMOOTH)
    rule_eff, fixed_eff = [], []
    for n_snr in (0.1, 0.3, 1.0, 3.0, 10.0):
        dec, grad_sq, tr = rule_decrease_mc(n_snr, d, n, trials, gen)
        oracle = exact_decrease(grad_sq, tr, n, snr_factor(grad_sq, tr, n) / L_SMOOTH)
        rule_eff.append(dec.mean() / oracle)
        fixed_eff.append(exact_decrease(grad_sq, tr, n, grid) / oracle)
        assert dec.mean() > 0.6 * oracle  # close to the oracle in every state (large d: sharp estimates)
    rule_mean = torch.stack(rule_eff).mean()
    fixed_mean = torch.stack(fixed_eff).mean(0)
    assert rule_mean > fixed_mean.max() + 0.1, (rule_mean, fixed_mean.max())


def test_plug_in_rule_overshoots_at_low_snr_in_few_dimensions():
    """Documented limitation: with few effective dimensions the estimate of S/(S+V/N) is noisy, and at
    low SNR the expected decrease of the plug-in rule is negative although the oracle's is positive."""
    gen = torch.Generator().manual_seed(1)
    dec, grad_sq, tr = rule_decrease_mc(0.05, 10, 8, 2000, gen)
    se = float(dec.std() / math.sqrt(len(dec)))
    assert float(dec.mean()) + 4 * se < 0 < exact_decrease(grad_sq, tr, 8, snr_factor(grad_sq, tr, 8) / L_SMOOTH)


def test_snr_statistics_keep_the_unclamped_signal():
    """snr_statistics is the one home of S, V, SNR: S = max(signal, 0) with signal = ||gbar||^2 - V/N kept
    unclamped (what an average over steps must average); signal_noise returns its first three fields."""
    sq = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=D)  # pure noise: ||gbar||^2 = 0
    st = snr_statistics(sq, 0.0, 4)
    assert float(st.V) == pytest.approx(4 / 3) and float(st.signal) == pytest.approx(-1 / 3)
    assert float(st.S) == 0.0 and float(st.snr) == 0.0 and st.n == 4
    assert [float(x) for x in signal_noise(sq, 0.0, 4)] == [float(st.S), float(st.V), float(st.snr)]
    m = snr_statistics(torch.tensor([1.0, 3.0, 2.0]), 1.5, 3).metrics()
    assert m["snr/factor"] == pytest.approx(snr_factor(m["snr/S"], m["snr/V"], 3))
    assert m["snr/n_snr"] == pytest.approx(3 * m["snr/snr"]) and m["snr/snr"] == pytest.approx(m["snr/S"] / m["snr/V"])


def test_zero_statistics_step_with_and_without_ema_history():
    """S = V = 0 (every g_k = 0, e.g. equal rewards in every group). Without EMA history (ema = 0, or the
    first update): factor 0, lr = eta_min. With history: the zero step is averaged in, which scales both
    bias-corrected averages by the same number, so the factor and the lr stay those of the previous step."""
    ctl = SNRLearningRate(make_opt(), 1.0, eta_min=0.01)
    assert ctl.step(0.0, 0.0, 4) == [0.01] and ctl.last_factor == 0.0
    ctl = SNRLearningRate(make_opt(), 1.0, eta_min=0.01, ema=0.9)
    assert ctl.step(0.0, 0.0, 4) == [0.01] and ctl.last_factor == 0.0  # first update: no history
    ctl = SNRLearningRate(make_opt(), 1.0, eta_min=0.01, ema=0.9)
    ctl.step(1.0, 2.0, 4)
    ctl.step(0.5, 4.0, 4)
    before = ctl.last_factor
    assert 0 < before < 1
    for _ in range(3):
        ctl.step(0.0, 0.0, 4)
        assert ctl.last_factor == pytest.approx(before, rel=1e-12) and ctl.get_last_lr()[0] == pytest.approx(before)


@pytest.mark.parametrize("beta1", [0.0, 0.5, 0.9, 0.99])
def test_momentum_noise_share_is_the_variance_of_adams_bias_corrected_first_moment(beta1):
    """Slow reference: torch's AdamW itself. A parameter of k coordinates receives the gradient e_s (one-hot)
    at step s, so after k steps exp_avg / (1 - beta1^k) holds the weight of each step's gradient in mhat_k:
    the weights sum to 1 (mhat is unbiased) and their squares sum to kappa_k."""
    for k in (1, 2, 3, 7, 30):
        p = torch.nn.Parameter(torch.zeros(k, dtype=torch.float64))
        opt = torch.optim.AdamW([p], lr=0.0, betas=(beta1, 0.999), weight_decay=0.0)
        for s in range(k):
            p.grad = torch.nn.functional.one_hot(torch.tensor(s), k).double()
            opt.step()
        w = opt.state[p]["exp_avg"] / (1 - beta1**k)
        assert float(w.sum()) == pytest.approx(1.0, rel=1e-12)
        assert momentum_noise_share(beta1, k) == pytest.approx(float((w**2).sum()), rel=1e-12)
    assert momentum_noise_share(0.9, 10_000) == pytest.approx(0.1 / 1.9, rel=1e-12)
    with pytest.raises(ValueError, match="beta1 must be in"):
        momentum_noise_share(1.0, 3)
    with pytest.raises(ValueError, match="positive integer"):
        momentum_noise_share(0.9, 0)


def test_adam_rule_without_momentum_is_the_papers_rule_exactly():
    """beta1 = 0 (kappa = 1): every lr and metric of AdamSNRLearningRate equals SNRLearningRate's, bit for
    bit, with the EMA, warm-up and a binding floor on; with beta1 = 0.9 the lr is larger from step 2 on."""
    gen = torch.Generator().manual_seed(3)
    kw = dict(eta_min=0.01, ema=0.7, warmup_steps=3)
    paper, adam0, adam9 = (SNRLearningRate(make_opt(), 0.5, **kw), AdamSNRLearningRate(make_opt(), 0.5, beta1=0.0, **kw),
                           AdamSNRLearningRate(make_opt(), 0.5, beta1=0.9, **kw))
    for k in range(1, 12):
        signal, V = float(torch.randn((), generator=gen)) + 0.2, 1.0 + float(torch.rand((), generator=gen))
        lr = paper.step(signal, V, 8)
        assert adam0.step(signal, V, 8) == lr
        lr9 = adam9.step(signal, V, 8)
        m = adam0.metrics()
        assert {key: m[key] for key in paper.metrics()} == paper.metrics()
        if k > 1 and paper.last_S > 0:
            assert lr9[0] > lr[0] or lr[0] == 0.01 * min(1, k / 3)


def _momentum_decrease(eta, grad_sq, tr, n, kappa):
    """Expected decrease of f = L/2 |theta|^2 from theta = grad/L by the step -eta mhat, E mhat = grad,
    Cov mhat = kappa Sigma / n: eta |grad|^2 - L/2 eta^2 (|grad|^2 + kappa tr / n)."""
    return eta * grad_sq - L_SMOOTH / 2 * eta**2 * (grad_sq + kappa * tr / n)


def test_adam_rule_maximises_the_expected_decrease_of_a_momentum_step():
    """Monte Carlo over mhat built with Adam's own weights from k noisy gradients at one point: the step
    eta_max S/(S + kappa_k V/n) (eta_max = 1/L, exact S and V) decreases f as much as the best of a fine grid
    of fixed steps (within the Monte Carlo error), and more than the paper's rule, which charges the noise
    of one step's gradient, in noise-dominated states."""
    gen = torch.Generator().manual_seed(0)
    d, n, k, beta1, trials = 40, 8, 20, 0.9, 4000
    w = torch.tensor([(1 - beta1) * beta1**j for j in range(k)], dtype=D) / (1 - beta1**k)
    kappa = momentum_noise_share(beta1, k)
    assert float((w**2).sum()) == pytest.approx(kappa, rel=1e-12)
    tr = d * SIGMA**2
    for n_snr in (0.05, 0.3, 1.0):
        grad = torch.full((d,), math.sqrt(n_snr * tr / n / d), dtype=D)
        theta = grad / L_SMOOTH
        g = grad + SIGMA / math.sqrt(n) * torch.randn(trials, k, d, generator=gen, dtype=D)  # step means
        mhat = torch.einsum("j,tjd->td", w, g)

        def mc(eta):
            new = theta - eta * mhat
            return float((L_SMOOTH / 2 * (theta @ theta - (new * new).sum(-1))).mean())

        grad_sq = float(grad @ grad)
        eta_adam = snr_factor(grad_sq, kappa * tr, n) / L_SMOOTH
        eta_paper = snr_factor(grad_sq, tr, n) / L_SMOOTH
        grid = [i / (40 * L_SMOOTH) for i in range(1, 61)]
        best = max(_momentum_decrease(e, grad_sq, tr, n, kappa) for e in grid)
        assert _momentum_decrease(eta_adam, grad_sq, tr, n, kappa) >= best - 1e-12
        se = 4 * float((L_SMOOTH / 2 * (theta @ theta - ((theta - eta_adam * mhat) ** 2).sum(-1))).std()) / trials**0.5
        assert abs(mc(eta_adam) - _momentum_decrease(eta_adam, grad_sq, tr, n, kappa)) < se
        assert mc(eta_adam) > mc(eta_paper) + se
