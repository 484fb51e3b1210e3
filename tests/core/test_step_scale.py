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
