"""oblr.step_scale: the secant estimator of descent and curvature along the step, against exact values on
quadratics with known curvature (noise-free: exact line search; noisy: the noise-corrected curvature
converges to the true L, the uncorrected one does not), and the ``auto`` schedule through the registry."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from oblr.schedules import make_lr_controller
from oblr.snr import SNRStats
from oblr.step_scale import descent_and_curvature, line_terms, sgd_kappa, target_lr


def _stats(V: float, n: int) -> SNRStats:
    z = torch.zeros((), dtype=torch.float64)
    return SNRStats(S=z, V=torch.tensor(V, dtype=torch.float64), snr=z, signal=z, n=n)


def test_noise_free_sgd_finds_the_exact_line_search_step():
    H = torch.diag(torch.tensor([1.0, 3.0, 10.0], dtype=torch.float64))
    theta = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    p = torch.nn.Parameter(theta.clone())
    opt = torch.optim.SGD([p], lr=0.01)
    ctl = make_lr_controller("auto", opt, lr=0.01, scale_ema=0.0, max_change=1e9, probe=1.0)
    g0 = H @ theta
    p.grad = g0.clone()
    ctl.step(_stats(0.0, 4))
    opt.step()
    p.grad = H @ p.detach()
    ctl.step(_stats(0.0, 4))
    # one secant along -g0 on a quadratic is exact: d/h = |g|^2 / g^T H g (steepest-descent line search)
    assert ctl.get_last_lr()[0] == pytest.approx(float(g0 @ g0 / (g0 @ H @ g0)), rel=1e-10)
    assert ctl.last["auto/curvature"] == pytest.approx(float(g0 @ H @ g0 / (g0 @ g0)), rel=1e-10)


def test_noise_free_adamw_finds_the_line_search_step_along_its_own_direction():
    H = torch.diag(torch.tensor([0.5, 2.0, 8.0, 1.0], dtype=torch.float64))
    theta = torch.tensor([1.0, -1.0, 0.3, 2.0], dtype=torch.float64)
    p = torch.nn.Parameter(theta.clone())
    opt = torch.optim.AdamW([p], lr=0.05, weight_decay=0.0)
    ctl = make_lr_controller("auto", opt, lr=0.05, scale_ema=0.0, max_change=1e9, probe=1.0)
    p.grad = H @ theta
    ctl.step(_stats(0.0, 4))
    g_prev = p.grad.clone()
    opt.step()
    u = (p.detach() - theta) / 0.05  # AdamW's lr-free direction
    p.grad = H @ p.detach()
    ctl.step(_stats(0.0, 4))
    assert ctl.get_last_lr()[0] == pytest.approx(float(-(g_prev @ u) / (u @ H @ u)), rel=1e-9)


def test_noise_corrected_curvature_converges_to_true_L_and_uncorrected_does_not():
    L, D, sigma, n, lr = 4.0, 50, 0.3, 8, 0.02
    gen = torch.Generator().manual_seed(1)
    theta = torch.randn(D, generator=gen, dtype=torch.float64)
    num = num_raw = den = d_sum = h_sum = sig = 0.0
    for _ in range(4000):
        g_prev = L * theta + sigma * torch.randn(D, generator=gen, dtype=torch.float64)
        delta = -lr * g_prev
        theta_new = theta + delta
        g_now = L * theta_new + sigma * torch.randn(D, generator=gen, dtype=torch.float64)
        a_raw, b, dd = line_terms([g_prev], [g_now], [delta])
        kappa = sgd_kappa(lr, 1.0, V=n * D * sigma**2, n=n)
        d, h = descent_and_curvature(a_raw, b, kappa, lr)
        num += h * lr**2
        d_sum, h_sum, sig = d_sum + d, h_sum + h, sig + float((L * theta).pow(2).sum())
        num_raw += a_raw + b
        den += dd
        theta = theta_new if float(theta_new.norm()) > 0.5 else torch.randn(D, generator=gen, dtype=torch.float64)
    assert num / den == pytest.approx(L, rel=0.05)
    # without the correction the estimate carries the noise bias lr * (V/n) per step: here about +35 %
    assert num_raw / den == pytest.approx(L + 4000 * lr * D * sigma**2 / den, rel=0.05)
    assert num_raw / den > 1.25 * L
    # and d/h is the paper's rule with the true L: (1/L) S / (S + V/n), S = |G|^2 (averaged over the path)
    S = sig / 4000
    assert d_sum / h_sum == pytest.approx((1 / L) * S / (S + D * sigma**2), rel=0.05)


def test_target_lr_rules():
    assert target_lr(1.0, 4.0, 0.2, 2.0) == pytest.approx(0.25)
    assert target_lr(1.0, 4.0, 1.0, 2.0) == pytest.approx(0.5)   # bounded below by lr/max_change
    assert target_lr(0.1, 4.0, 0.001, 2.0) == pytest.approx(0.002)  # bounded above by lr*max_change
    assert target_lr(-1.0, 4.0, 1.0, 2.0) == 1.0  # no descent measured: keep
    assert target_lr(1.0, -4.0, 1.0, 2.0) == 2.0  # descent, no measurable curvature: grow
    assert target_lr(math.nan, 1.0, 1.0, 2.0) == 1.0


def test_first_step_is_a_probe_and_bad_options_are_rejected():
    p = torch.nn.Parameter(torch.zeros(3))
    assert make_lr_controller("auto", torch.optim.SGD([p], lr=1.0), lr=1.0).get_last_lr() == [pytest.approx(0.01)]
    with pytest.raises(ValueError, match="auto schedule: need"):
        make_lr_controller("auto", torch.optim.SGD([p], lr=1.0), lr=1.0, probe=0.0)


def test_unknown_optimizer_is_rejected():
    p = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="unknown optimizer noise gain .*'Adagrad'; registered: Adam, AdamW, SGD"):
        make_lr_controller("auto", torch.optim.Adagrad([p], lr=0.1), lr=0.1)


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.AdamW])
def test_state_dict_round_trip_continues_the_same_lrs(opt_cls):
    H = torch.diag(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    noise = [0.1 * torch.randn(3, generator=gen, dtype=torch.float64) for _ in range(10)]

    def drive(p, opt, ctl, ts):
        out = []
        for t in ts:
            p.grad = H @ p.detach() + noise[t]
            ctl.step(_stats(V=0.04, n=4))
            out.append(ctl.get_last_lr()[0])
            opt.step()
        return out

    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = opt_cls([p], lr=0.05)
    ctl = make_lr_controller("auto", opt, lr=0.05, scale_ema=0.5, max_change=1.25)
    drive(p, opt, ctl, range(5))
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = opt_cls([q], lr=1.0)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # torch shares same-dtype state tensors
    ctl2 = make_lr_controller("auto", opt2, lr=1.0)
    ctl2.load_state_dict(ctl.state_dict())
    assert opt2.param_groups[0]["lr"] == ctl.get_last_lr()[0]
    assert drive(q, opt2, ctl2, range(5, 10)) == drive(p, opt, ctl, range(5, 10))


def test_curvature_average_is_weighted_by_the_step_size():
    """Steps of very different size (a 1e-4 probe-like step every other step, 0.02 otherwise) on a noisy
    quadratic: the lr^2-weighted fit of A + B = lr^2 h recovers L, while the plain average of the per-step
    h = (A + B)/lr^2 is swamped by the small steps' noise (its spread scales as 1/lr)."""
    from oblr.step_scale import EMPTY_AVERAGES, average_line_terms, line_estimates

    L, D, sigma, n, beta = 4.0, 50, 0.3, 8, 0.999
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(D, generator=gen, dtype=torch.float64)
    avgs, plain = EMPTY_AVERAGES, []
    for t in range(3000):
        lr = 1e-4 if t % 2 else 0.02
        g_prev = L * theta + sigma * torch.randn(D, generator=gen, dtype=torch.float64)
        delta = -lr * g_prev
        theta_new = theta + delta
        g_now = L * theta_new + sigma * torch.randn(D, generator=gen, dtype=torch.float64)
        a_raw, b, dd = line_terms([g_prev], [g_now], [delta])
        d, h = descent_and_curvature(a_raw, b, sgd_kappa(lr, 1.0, V=n * D * sigma**2, n=n), lr)
        # curvature along delta is L here, so h = L |g_prev|^2 in these units; normalise to L
        avgs = average_line_terms(avgs, d / float(g_prev @ g_prev), h / float(g_prev @ g_prev), lr, beta)
        plain.append(h / float(g_prev @ g_prev))
        theta = theta_new if float(theta_new.norm()) > 0.5 else torch.randn(D, generator=gen, dtype=torch.float64)
    _, h_bar = line_estimates(avgs, 3000, beta)
    assert h_bar == pytest.approx(L, rel=0.1)
    assert abs(sum(plain) / len(plain) - L) > 5 * abs(h_bar - L)
    assert line_estimates(EMPTY_AVERAGES, 0, 0.5) == (0.0, 0.0)  # nothing measured yet


def test_effective_count_and_confidence_bounds():
    """The EMA's effective count is 1/sum w^2 of its bias-corrected weights (checked by summing them); the
    bounds equal the point estimates for constant measurements and move d down, h up by z standard errors
    (from the spread of the measurements) otherwise."""
    from oblr.step_scale import EMPTY_AVERAGES, average_line_terms, effective_count, line_estimates

    for beta, n in [(0.0, 5), (0.5, 1), (0.9, 7), (0.98, 400)]:
        w = [(1 - beta) * beta ** (n - i) / (1 - beta**n) for i in range(1, n + 1)]
        assert effective_count(n, beta) == pytest.approx(1 / sum(x * x for x in w), rel=1e-9)
    assert effective_count(10_000, 0.98) == pytest.approx(1.98 / 0.02, rel=1e-6)
    avgs = EMPTY_AVERAGES
    for _ in range(30):
        avgs = average_line_terms(avgs, 2.0, 8.0, 0.1, 0.9)
    assert line_estimates(avgs, 30, 0.9, z=1.0) == pytest.approx((2.0, 8.0))
    assert line_estimates(avgs, 30, 0.9) == pytest.approx((2.0, 8.0))
    n = 0
    ds, hs = [1.0, 3.0, 2.0, 2.0], [6.0, 10.0, 8.0, 8.0]  # means 2 and 8 at lr 1; spreads sqrt(0.5), sqrt(2)
    avgs = EMPTY_AVERAGES
    beta = 0.5
    for d, h in zip(ds, hs):
        avgs = average_line_terms(avgs, d, h, 1.0, beta)
        n += 1
    w = [(1 - beta) * beta ** (n - i) / (1 - beta**n) for i in range(1, n + 1)]
    mean_d, mean_h = sum(a * b for a, b in zip(w, ds)), sum(a * b for a, b in zip(w, hs))
    var_d = sum(a * (b - mean_d) ** 2 for a, b in zip(w, ds))
    var_h = sum(a * (b - mean_h) ** 2 for a, b in zip(w, hs))
    m = 1 / sum(x * x for x in w)
    lo, hi = line_estimates(avgs, n, beta, z=2.0)
    assert lo == pytest.approx(mean_d - 2 * math.sqrt(var_d / m)) and hi == pytest.approx(mean_h + 2 * math.sqrt(var_h / m))


def test_a_zero_gradient_is_not_measured_and_keeps_the_lr():
    """After a step, a zero gradient (every group's rewards equal: nothing to learn from) must neither
    count as a measurement nor move the lr (attempt 3 grew the lr of a collapsed run on decaying averages)."""
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.01)
    ctl = make_lr_controller("auto", opt, lr=0.01, probe=1.0)
    p.grad = torch.tensor([0.5, 0.5], dtype=torch.float64)
    ctl.step(_stats(0.1, 4))
    opt.step()
    lr = ctl.get_last_lr()[0]
    for _ in range(3):
        p.grad = torch.zeros(2, dtype=torch.float64)
        ctl.step(_stats(0.0, 4))
        opt.step()  # Adam's momentum still moves the parameters
        assert ctl.get_last_lr()[0] == lr and ctl.n_avg == 0 and ctl.last["auto/skipped"] == 1.0


# --- the regimes where the numbers matter: noise on (V > 0), state that decides the lr, clipping active ---

def _adamw_by_hand(theta, g, m, v, k, lr, b1, b2, eps, wd):
    """One AdamW step written from its definition (decoupled decay, bias-corrected moments); returns
    ``(theta', m', v', vhat)`` with ``vhat`` the bias-corrected second moment after step ``k``."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mhat, vhat = m / (1 - b1**k), v / (1 - b2**k)
    return theta * (1 - lr * wd) - lr * mhat / (vhat.sqrt() + eps), m, v, vhat


def _secant_lr(g_prev, g_now, delta, lr, kappa):
    """d/h from the docstring's formulas: A = -<g_{t-1}, delta> + kappa, B = <g_t, delta>, d = A/lr,
    h = (A + B)/lr^2; returns (d/h, d, h)."""
    A = float(-(g_prev @ delta)) + kappa
    B = float(g_now @ delta)
    d, h = A / lr, (A + B) / lr**2
    return d / h, d, h


def test_noisy_adamw_gain_and_lr_at_steps_1_and_2_match_the_formula_by_hand():
    """AdamW with V > 0: the noise gain j = (1-b1)/(1-b1^k) sum_i g_i^2/(sqrt(vhat_i)+eps) / |g|^2 and
    kappa = -lr j V/N, computed here from the optimizer's definition (moments by hand, not read from
    torch's state) after optimizer step k = 1 and k = 2; the lr the schedule sets is d/h with that kappa.
    Step 2 is where the momentum's bias correction (1-b1)/(1-b1^2) != 1 and the second moment's history
    enter; the noise-free lr and the lr without the correction both differ by more than the tolerance."""
    b1, b2, eps, wd, lr0, V, n = 0.9, 0.999, 1e-8, 0.01, 0.03, 10.0, 4
    H = torch.diag(torch.tensor([0.5, 2.0, 8.0, 1.0], dtype=torch.float64))
    noise = [torch.tensor(x, dtype=torch.float64) for x in
             ([0.3, -0.2, 0.1, 0.4], [-0.1, 0.3, -0.2, 0.2], [0.2, 0.1, 0.3, -0.3])]
    theta0 = torch.tensor([1.0, -1.0, 0.3, 2.0], dtype=torch.float64)
    p = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.AdamW([p], lr=lr0, betas=(b1, b2), eps=eps, weight_decay=wd)
    ctl = make_lr_controller("auto", opt, lr=lr0, scale_ema=0.0, max_change=1e9, probe=1.0, confidence=0.0)

    # by hand: the same three gradients, the same two optimizer steps
    g0 = H @ theta0 + noise[0]
    theta1, m, v, vhat1 = _adamw_by_hand(theta0, g0, torch.zeros(4, dtype=torch.float64),
                                         torch.zeros(4, dtype=torch.float64), 1, lr0, b1, b2, eps, wd)
    g1 = H @ theta1 + noise[1]
    j1 = (1 - b1) / (1 - b1**1) * float((g0 * g0 / (vhat1.sqrt() + eps)).sum()) / float(g0 @ g0)
    lr1, d1, h1 = _secant_lr(g0, g1, theta1 - theta0, lr0, -lr0 * j1 * V / n)
    theta2, m, v, vhat2 = _adamw_by_hand(theta1, g1, m, v, 2, lr1, b1, b2, eps, wd)
    g2 = H @ theta2 + noise[2]
    j2 = (1 - b1) / (1 - b1**2) * float((g1 * g1 / (vhat2.sqrt() + eps)).sum()) / float(g1 @ g1)
    lr2, d2, h2 = _secant_lr(g1, g2, theta2 - theta1, lr1, -lr1 * j2 * V / n)
    assert d1 > 0 and h1 > 0 and d2 > 0 and h2 > 0  # d/h itself sets the lr (no keep/grow rule)

    # the schedule, driven by the real optimizer
    lrs = []
    for t in range(3):
        p.grad = H @ p.detach() + noise[t]
        ctl.step(_stats(V, n))
        lrs.append(ctl.get_last_lr()[0])
        opt.step()
        if t < 2:
            assert torch.allclose(p.detach(), (theta1, theta2)[t], rtol=1e-12, atol=0)
    assert lrs[0] == lr0
    assert lrs[1] == pytest.approx(lr1, rel=1e-9)
    assert lrs[2] == pytest.approx(lr2, rel=1e-9)
    assert ctl.last["auto/kappa_share"] == pytest.approx(lr1 * j2 * V / n / float(-(g1 @ (theta2 - theta1))), rel=1e-9)

    # the regime: the noise term and each factor of the gain move the lr far beyond the tolerance
    assert abs(_secant_lr(g0, g1, theta1 - theta0, lr0, 0.0)[0] / lr1 - 1) > 0.05  # noise-free
    assert abs(_secant_lr(g1, g2, theta2 - theta1, lr1, 0.0)[0] / lr2 - 1) > 0.05
    j2_uncorrected = j2 * (1 - b1**2) / (1 - b1)  # without the momentum's bias correction at k = 2
    assert abs(_secant_lr(g1, g2, theta2 - theta1, lr1, -lr1 * j2_uncorrected * V / n)[0] / lr2 - 1) > 0.05
    assert abs(_secant_lr(g1, g2, theta2 - theta1, lr1, -lr1 * 1.0 * V / n)[0] / lr2 - 1) > 0.05  # SGD's gain


def _uncapped(ctl, lr_before: float) -> bool:
    """The last lr was d_low/h_high itself: both positive and strictly inside the max_change bounds."""
    d, h = ctl.last.get("auto/d_low", 0.0), ctl.last.get("auto/h_high", 0.0)
    return (d > 0 and h > 0 and lr_before / ctl.max_change < d / h < lr_before * ctl.max_change
            and ctl.lr == pytest.approx(d / h, rel=1e-12))


@pytest.mark.parametrize("opt_cls,start,confidence", [(torch.optim.SGD, 10.0, 0.0), (torch.optim.AdamW, 1.0, 1.0)],
                         ids=["SGD", "AdamW"])
def test_state_round_trip_where_d_and_h_set_the_lr(opt_cls, start, confidence):
    """A restored controller continues with the lrs of the uninterrupted one on steps whose lr is d/h
    itself (asserted: not capped by max_change, not the keep/grow rule), with noise on; a state without
    the averages of d and h (or without their count) continues differently."""
    from oblr.step_scale import EMPTY_AVERAGES

    H = torch.diag(torch.tensor([0.1, 0.2, 0.3, 0.05], dtype=torch.float64))
    gen = torch.Generator().manual_seed(0)
    noise = [0.05 * torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(12)]
    lr0 = 2.0

    def drive(p, opt, ctl, ts):
        out = []
        for t in ts:
            p.grad = H @ p.detach() + noise[t]
            before = ctl.lr
            ctl.step(_stats(V=0.02, n=4))
            out.append((ctl.get_last_lr()[0], t == 0 or _uncapped(ctl, before)))
            opt.step()
        return out

    def restored(state):
        q = torch.nn.Parameter(p.detach().clone())
        opt2 = opt_cls([q], lr=1.0)
        opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
        ctl2 = make_lr_controller("auto", opt2, lr=1.0)
        ctl2.load_state_dict(copy.deepcopy(state))
        return q, opt2, ctl2

    p = torch.nn.Parameter(start * torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64))
    opt = opt_cls([p], lr=lr0)
    ctl = make_lr_controller("auto", opt, lr=lr0, scale_ema=0.7, max_change=3.0, probe=1.0, confidence=confidence)
    first = drive(p, opt, ctl, range(6))
    state = ctl.state_dict()
    assert ctl.n_avg == 5 and ctl.avgs != EMPTY_AVERAGES
    q, opt2, ctl2 = restored(state)
    resumed = drive(q, opt2, ctl2, range(6, 12))
    straight = drive(p, opt, ctl, range(6, 12))
    assert resumed == straight
    assert all(uncapped for _, uncapped in first[1:] + straight), (first, straight)  # the regime
    assert len({lr for lr, _ in straight}) == len(straight)  # the lr moves every step
    # without the averages (d and h of the earlier steps) or their count the continuation differs
    for broken in ({**state, "avgs": EMPTY_AVERAGES, "n_avg": 0}, {**state, "avgs": EMPTY_AVERAGES},
                   {**state, "n_avg": 1}):
        q, opt2, ctl2 = restored(broken)
        other = drive(q, opt2, ctl2, range(6, 12))
        assert abs(other[0][0] / straight[0][0] - 1) > 1e-3, (other[0], straight[0])


def test_clip_factor_kappa_matches_its_definition_and_sets_the_lr_with_clipping_active():
    """grad_clip well below |g| (the trainer clips after ``step``): kappa must be E<xi, delta> of the
    clipped step delta = -lr c g, c = grad_clip/|g|. Its definition is checked by Monte Carlo over the
    noise xi (D = 400, so c barely varies between draws: the linearised value is exact to ~1/D), and the
    schedule's kappa and lr against the formulas with that c; c = 1 (clipping ignored) or c from |g|^2
    would move both far beyond the tolerance."""
    D, sigma, lr, clip = 400, 0.05, 0.5, 0.2
    gen = torch.Generator().manual_seed(7)
    G = sigma * torch.randn(D, generator=gen, dtype=torch.float64)  # |G|^2 ~ D sigma^2: SNR about 1
    noise_trace = D * sigma**2  # tr Cov of the batch gradient = V / N
    n = 8
    V = noise_trace * n

    def clipped_step(g):
        return -lr * min(1.0, clip / float(g.norm())) * g

    xi = sigma * torch.randn(8000, D, generator=gen, dtype=torch.float64)
    mc = torch.stack([xi[i] @ clipped_step(G + xi[i]) for i in range(len(xi))])
    c_typical = clip / math.sqrt(float(G @ G) + noise_trace)
    assert c_typical < 0.5  # clipping is active and strong
    assert float(mc.mean()) == pytest.approx(-lr * c_typical * noise_trace, rel=0.01)  # E<xi, delta>

    # the schedule on one draw: SGD, the trainer's order (lr step, then clip, then the optimizer)
    Hd = torch.linspace(0.5, 2.0, D, dtype=torch.float64)
    theta0 = G / Hd  # so that the true gradient at theta0 is G
    p = torch.nn.Parameter(theta0.clone())
    opt = torch.optim.SGD([p], lr=lr)
    ctl = make_lr_controller("auto", opt, lr=lr, grad_clip=clip, scale_ema=0.0, max_change=1e9, probe=1.0,
                             confidence=0.0)
    g0 = Hd * theta0 + xi[0]
    p.grad = g0.clone()
    ctl.step(_stats(V, n))
    torch.nn.utils.clip_grad_norm_([p], clip)
    opt.step()
    c0 = clip / float(g0.norm())
    delta = p.detach() - theta0
    assert torch.allclose(delta, -lr * c0 * g0, rtol=1e-6)
    g1 = Hd * p.detach() + xi[1]
    p.grad = g1.clone()
    ctl.step(_stats(V, n))
    a_raw = float(-(g0 @ delta))
    kappa = -lr * c0 * V / n
    assert kappa == pytest.approx(-lr * c_typical * noise_trace, rel=0.05)  # this draw's c is the typical one
    assert -ctl.last["auto/kappa_share"] * a_raw == pytest.approx(kappa, rel=1e-9)
    want, d, h = _secant_lr(g0, g1, delta, lr, kappa)
    assert d > 0 and h > 0
    assert ctl.get_last_lr()[0] == pytest.approx(want, rel=1e-9)
    for wrong_c in (1.0, clip / float(g0 @ g0)):  # clipping ignored; c from |g|^2
        assert abs(_secant_lr(g0, g1, delta, lr, -lr * wrong_c * V / n)[0] / want - 1) > 0.05


# --- warm-up and a binding floor: the lr the schedule applies is warm(t) * max(eta_min, lr) ---

def _auto_sgd_by_hand(H, theta0, noise, V, n, *, lr0, eta_min, warmup, mc=1e9, floor_first=True, measure_at="applied"):
    """The ``auto`` lrs of an SGD run on ``f = theta^T H theta / 2`` (gradients ``H theta + noise[t]``), written
    from docs/algorithm.md with ``scale_ema = 0``, ``confidence = 0``, ``probe = 1`` (no code of oblr.step_scale):
    the step-t lr is ``min(1, (t+1)/W) * max(eta_min, lr_t)``; from the second step ``lr_t`` is
    ``clamp(d/h, lr_{t-1}/mc, lr_{t-1} mc)`` with ``d = A/eta``, ``h = (A + B)/eta^2``,
    ``A = -<g_{t-1}, delta> - eta V/N``, ``B = <g_t, delta>`` and ``eta`` the lr the last step APPLIED.
    ``floor_first=False`` / ``measure_at="internal"`` give the wrong conventions (floor after the warm-up; the
    step measured at the unwarmed, unfloored lr) for the regime checks. Returns (lrs, internal lrs, (d, h))."""
    theta, internal = theta0.clone(), lr0
    lrs, internals, dh, prev = [], [], [], None
    for t, xi in enumerate(noise):
        g = H @ theta + xi
        if prev is not None:
            g_prev, delta, eta = prev
            A = -float(g_prev @ delta) - eta * V / n
            B = float(g @ delta)
            d, h = A / eta, (A + B) / eta**2
            assert d > 0 and h > 0  # d/h itself (no keep/grow rule)
            dh.append((d, h))
            internal = min(max(d / h, internal / mc), internal * mc)
        warm = min(1.0, (t + 1) / warmup)
        applied = warm * max(eta_min, internal) if floor_first else max(eta_min, warm * internal)
        lrs.append(applied)
        internals.append(internal)
        delta = -applied * g
        prev = (g, delta, applied if measure_at == "applied" else internal)
        theta = theta + delta
    return lrs, internals, dh


_WARM = dict(H=torch.diag(torch.tensor([2.0, 4.0, 8.0, 1.0], dtype=torch.float64)),
             theta0=torch.tensor([1.0, -1.0, 0.5, 2.0], dtype=torch.float64), V=0.02, n=4, lr0=1.0, eta_min=0.2,
             warmup=4)


def _warm_noise(T: int = 8):
    gen = torch.Generator().manual_seed(0)
    return [0.05 * torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(T)]


def _drive_auto(p, opt, ctl, noise, ts, H, V, n):
    out = []
    for t in ts:
        p.grad = H @ p.detach() + noise[t]
        ctl.step(_stats(V, n))
        out.append(ctl.get_last_lr()[0])
        opt.step()
    return out


def test_auto_with_warmup_and_a_binding_floor_matches_the_formulas_by_hand():
    """SGD on a noisy quadratic, warm-up over 4 steps and eta_min = 0.2: every lr equals the hand recurrence
    (d/h measured at the lr the last step applied, floored, then warmed up). The regime is asserted: measured
    steps inside the warm-up, the floor binding inside the warm-up (step 2) and after it (steps 6, 7), d/h
    above the floor elsewhere; the floor applied after the warm-up, or the step measured at the unwarmed lr,
    moves the lrs far beyond the tolerance."""
    c = _WARM
    noise = _warm_noise()
    want, internal, _ = _auto_sgd_by_hand(c["H"], c["theta0"], noise, c["V"], c["n"], lr0=c["lr0"],
                                          eta_min=c["eta_min"], warmup=c["warmup"])
    p = torch.nn.Parameter(c["theta0"].clone())
    opt = torch.optim.SGD([p], lr=c["lr0"])
    ctl = make_lr_controller("auto", opt, lr=c["lr0"], eta_min=c["eta_min"], warmup_steps=c["warmup"], scale_ema=0.0,
                             max_change=1e9, probe=1.0, confidence=0.0)
    got = _drive_auto(p, opt, ctl, noise, range(len(noise)), c["H"], c["V"], c["n"])
    assert got == pytest.approx(want, rel=1e-9)
    assert got[0] == pytest.approx(0.25 * c["lr0"])  # the first step: warm(0) = 1/4 of the guess
    # the regime: floor binding during the warm-up and after it, d/h above it on other measured steps
    floored = [t for t in range(1, len(want)) if internal[t] < c["eta_min"]]
    assert 2 in floored and {6, 7} <= set(floored) and floored != list(range(1, len(want)))
    assert got[2] == pytest.approx(0.75 * c["eta_min"]) and got[6] == pytest.approx(c["eta_min"])
    for wrong in (dict(floor_first=False), dict(measure_at="internal")):
        other, _, _ = _auto_sgd_by_hand(c["H"], c["theta0"], noise, c["V"], c["n"], lr0=c["lr0"], eta_min=c["eta_min"],
                                        warmup=c["warmup"], **wrong)
        assert max(abs(a / b - 1) for a, b in zip(other, want)) > 0.05, wrong


def test_auto_state_round_trip_inside_the_warmup_continues_the_same_lrs():
    """Saved after 2 steps of a 4-step warm-up (the floor binds at the next step), restored into a fresh controller:
    the next lrs are the uninterrupted run's, warm-up factor included; a state without its step count restarts
    the warm-up and sets other lrs."""
    c = _WARM
    noise = _warm_noise()

    def fresh(theta, opt_state=None):
        q = torch.nn.Parameter(theta.clone())
        o = torch.optim.SGD([q], lr=123.0)
        if opt_state is not None:
            o.load_state_dict(copy.deepcopy(opt_state))
        return q, o, make_lr_controller("auto", o, lr=7.0, eta_min=c["eta_min"], warmup_steps=c["warmup"])

    p = torch.nn.Parameter(c["theta0"].clone())
    opt = torch.optim.SGD([p], lr=c["lr0"])
    ctl = make_lr_controller("auto", opt, lr=c["lr0"], eta_min=c["eta_min"], warmup_steps=c["warmup"], scale_ema=0.0,
                             max_change=1e9, probe=1.0, confidence=0.0)
    _drive_auto(p, opt, ctl, noise, range(2), c["H"], c["V"], c["n"])
    state, lr_at_save = copy.deepcopy(ctl.state_dict()), ctl.get_last_lr()[0]
    theta, opt_state = p.detach().clone(), copy.deepcopy(opt.state_dict())
    straight = _drive_auto(p, opt, ctl, noise, range(2, 8), c["H"], c["V"], c["n"])
    want, _, _ = _auto_sgd_by_hand(c["H"], c["theta0"], noise, c["V"], c["n"], lr0=c["lr0"], eta_min=c["eta_min"],
                                   warmup=c["warmup"])
    assert straight == pytest.approx(want[2:], rel=1e-9)
    assert straight[0] == pytest.approx(0.75 * c["eta_min"])  # warming up, at the floor
    q, o, ctl2 = fresh(theta, opt_state)
    ctl2.load_state_dict(copy.deepcopy(state))
    assert o.param_groups[0]["lr"] == lr_at_save
    assert _drive_auto(q, o, ctl2, noise, range(2, 8), c["H"], c["V"], c["n"]) == straight
    q, o, ctl3 = fresh(theta, opt_state)
    ctl3.load_state_dict({**copy.deepcopy(state), "t": 0})  # the step count lost: the warm-up restarts
    other = _drive_auto(q, o, ctl3, noise, range(2, 8), c["H"], c["V"], c["n"])
    assert abs(other[0] / straight[0] - 1) > 0.05
