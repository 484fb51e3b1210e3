"""oblr.schedules on its own: the registry, each schedule's lr sequence, the SNR schedule on SNRStats,
and state_dict round trips that continue the same sequence."""

from __future__ import annotations

import math

import pytest
import torch

from oblr.schedules import SCHEDULES, available_schedules, make_lr_controller, register_schedule
from oblr.snr import snr_factor, snr_statistics


def _opt(lr: float = 0.5):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _stats(seed: int, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    gk = torch.randn(n, 5, generator=g, dtype=torch.float64) + 0.5  # per-prompt gradients with some signal
    return snr_statistics(gk.pow(2).sum(-1), gk.mean(0).pow(2).sum(), n)


def test_registry_names_and_unknown_name():
    assert available_schedules() == SCHEDULES.names() == ["auto", "constant", "cosine", "kl", "snr", "snr_adam"]
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'; registered: auto, constant, cosine, "
                                         "kl, snr, snr_adam"):
        make_lr_controller("linear", _opt(), lr=1e-3)
    with pytest.raises(ValueError, match="already registered"):
        register_schedule("snr")(object)


def test_constant_with_warmup_ignores_statistics():
    ctl = make_lr_controller("constant", _opt(), lr=0.1, warmup_steps=4)
    assert not ctl.needs_snr
    lrs = []
    for t in range(6):
        ctl.step(_stats(t) if t % 2 else None)
        lrs.append(ctl.get_last_lr()[0])
    assert lrs == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    assert ctl.metrics() == {"snr/lr": pytest.approx(0.1)} and ctl.optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_cosine_goes_from_lr_to_eta_min():
    ctl = make_lr_controller("cosine", _opt(), lr=1.0, eta_min=0.1, total_steps=5)
    lrs = []
    for _ in range(6):
        ctl.step()
        lrs.append(ctl.get_last_lr()[0])
    want = [0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t / 5))) for t in range(6)]
    assert lrs == pytest.approx(want) and lrs[0] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)


def test_snr_schedule_sets_eta_max_times_the_factor():
    ctl = make_lr_controller("snr", _opt(), lr=0.2)
    assert ctl.needs_snr
    st = _stats(1)
    ctl.step(st)
    assert ctl.get_last_lr()[0] == pytest.approx(0.2 * snr_factor(float(st.S), float(st.V), st.n))
    m = ctl.metrics()
    assert m["snr/factor"] == pytest.approx(snr_factor(float(st.S), float(st.V), st.n))
    assert m["snr/S"] == pytest.approx(float(st.S)) and m["snr/V"] == pytest.approx(float(st.V))
    with pytest.raises(ValueError, match="needs the step's SNR statistics"):
        ctl.step(None)


@pytest.mark.parametrize("name", ["constant", "cosine", "snr", "snr_adam"])
def test_state_dict_round_trip_continues_the_sequence(name):
    make_opt = (lambda lr=0.5: _adamw(lrs=(lr,))) if name == "snr_adam" else _opt  # snr_adam: Adam-family only
    kw = dict(lr=0.3, eta_min=0.01, warmup_steps=2, total_steps=8, ema=0.5)
    straight = make_lr_controller(name, make_opt(), **kw)
    for t in range(4):
        straight.step(_stats(t))
    state = straight.state_dict()
    if name == "snr_adam":
        assert state["beta1"] == [0.9]
    opt = make_opt(lr=123.0)
    resumed = make_lr_controller(name, opt, **kw)
    resumed.load_state_dict(state)
    assert resumed.get_last_lr() == straight.get_last_lr() and opt.param_groups[0]["lr"] == straight.get_last_lr()[0]
    for t in range(4, 7):
        straight.step(_stats(t))
        resumed.step(_stats(t))
        assert resumed.get_last_lr() == straight.get_last_lr()
        assert resumed.metrics() == straight.metrics()


def test_a_registered_schedule_is_built_by_name():
    @register_schedule("test_halving")
    class Halving:
        needs_snr = False

        def __init__(self, optimizer, *, lr, eta_min, warmup_steps, total_steps, ema):
            self.optimizer, self.lr = optimizer, lr

        def step(self, stats=None):
            self.lr /= 2
            for g in self.optimizer.param_groups:
                g["lr"] = self.lr

        def get_last_lr(self):
            return [self.lr]

    try:
        ctl = make_lr_controller("test_halving", _opt(), lr=1.0)
        ctl.step()
        assert ctl.get_last_lr() == [0.5] and "test_halving" in available_schedules()
    finally:
        SCHEDULES.unregister("test_halving")


def _late_mean_factor(mu_sq: float, ema: float, *, d: int = 64, n: int = 16, steps: int = 2000, seed: int = 0):
    """Mean lr factor of the snr schedule over the last 2/3 of ``steps`` steps, each fed the SNRStats of n
    synthetic per-prompt gradients g_k ~ N(mu, I_d) with ||mu||^2 = mu_sq (true S = mu_sq, V = d)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.zeros(d, dtype=torch.float64)
    mu[0] = mu_sq ** 0.5
    ctl = make_lr_controller("snr", _opt(), lr=1.0, ema=ema)
    factors = []
    for _ in range(steps):
        gk = mu + torch.randn(n, d, generator=g, dtype=torch.float64)
        ctl.step(snr_statistics(gk.pow(2).sum(-1), gk.mean(0).pow(2).sum(), n))
        factors.append(ctl.metrics()["snr/factor"])
    return sum(factors[steps // 3:]) / len(factors[steps // 3:])


def test_ema_with_zero_signal_tends_to_factor_0():
    """The EMA averages the unclamped signal, so with zero true signal the averaged S sits at 0 up to the
    EMA's own noise (sd ~ sqrt((1-ema)/(1+ema))): the factor shrinks as the averaging window grows.
    Clamping before averaging (the old code) averaged E[max(signal, 0)] > 0: a plateau of 0.07 here at
    every ema."""
    f90, f99 = _late_mean_factor(0.0, 0.9), _late_mean_factor(0.0, 0.99)
    assert f99 < 0.02 and f99 < 0.5 * f90, (f90, f99)


def test_ema_with_a_known_signal_tends_to_the_true_factor():
    true = 0.25 / (0.25 + 64 / 16)  # S / (S + V/N) = 0.0588
    got = _late_mean_factor(0.25, 0.99)
    assert abs(got - true) < 0.012, (got, true)  # clamp-then-average gave 0.10


def test_cosine_with_warmup_decays_over_the_steps_after_it():
    """lr_t = min(1, (t+1)/W) * (eta_min + (lr - eta_min)(1 + cos(pi p))/2) with p = (t - W)/(T - W) after the
    warm-up, written out: W = 3, T = 8, lr 1, eta_min 0.1."""
    ctl = make_lr_controller("cosine", _opt(), lr=1.0, eta_min=0.1, warmup_steps=3, total_steps=8)
    lrs = []
    for _ in range(10):
        ctl.step()
        lrs.append(ctl.get_last_lr()[0])
    want = [1 / 3, 2 / 3, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * k / 5)) for k in range(6)] + [0.1]
    assert lrs == pytest.approx(want, rel=1e-12)
    assert lrs[3] == pytest.approx(1.0) and lrs[8] == pytest.approx(0.1)  # full lr after the warm-up, eta_min at T


def _snr_by_hand(rows, *, eta_max, eta_min, warmup, ema, floor_first=True):
    """lr_k = min(1, k/W) * max(eta_min, eta_max S/(S + V/n)) at the k-th step, S and V the bias-corrected EMAs
    of the unclamped signal and V, clamped after averaging (docs/algorithm.md; no oblr code)."""
    s_avg = v_avg = 0.0
    out = []
    for k, (signal, V, n) in enumerate(rows, start=1):
        s_avg, v_avg = ema * s_avg + (1 - ema) * signal, ema * v_avg + (1 - ema) * V
        S, Vs = max(s_avg / (1 - ema**k), 0.0), max(v_avg / (1 - ema**k), 0.0)
        f = S / (S + Vs / n) if S + Vs / n > 0 else 0.0
        warm = min(1.0, k / warmup)
        out.append(warm * max(eta_min, eta_max * f) if floor_first else max(eta_min, warm * eta_max * f))
    return out


def test_snr_schedule_with_warmup_and_a_binding_floor_by_hand():
    """The snr schedule with EMA 0.5, a 4-step warm-up and eta_min 0.05: a negative signal on step 2 puts the
    factor under the floor inside the warm-up (lr = (2/4) eta_min), a large one lifts it above; every lr equals
    the hand computation, and the floor applied after the warm-up would move the warm-up's lrs."""
    from oblr.snr import SNRStats

    rows = [(0.4, 1.0, 4), (-0.5, 1.2, 4), (0.05, 0.8, 4), (2.0, 1.0, 4), (-0.2, 3.0, 4), (1.5, 0.5, 4)]
    ctl = make_lr_controller("snr", _opt(), lr=0.5, eta_min=0.05, warmup_steps=4, ema=0.5)
    got = []
    for signal, V, n in rows:
        s, v = torch.tensor(signal, dtype=torch.float64), torch.tensor(V, dtype=torch.float64)
        ctl.step(SNRStats(S=s.clamp(min=0), V=v, snr=s.clamp(min=0) / v, signal=s, n=n))
        got.append(ctl.get_last_lr()[0])
    want = _snr_by_hand(rows, eta_max=0.5, eta_min=0.05, warmup=4, ema=0.5)
    assert got == pytest.approx(want, rel=1e-12)
    assert got[1] == pytest.approx(0.5 * 0.05)  # floor binding inside the warm-up
    assert got[0] > 0.25 * 0.05 and got[3] > 0.05  # above it elsewhere
    other = _snr_by_hand(rows, eta_max=0.5, eta_min=0.05, warmup=4, ema=0.5, floor_first=False)
    assert abs(other[1] / want[1] - 1) > 0.5


def _adamw(lrs=(0.5,), betas=((0.9, 0.999),)):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(2))], "lr": lr, "betas": b} for lr, b in zip(lrs, betas)]
    return torch.optim.AdamW(groups)


def test_snr_adam_counts_each_groups_momentum_and_refuses_sgd():
    """lr_k = eta_max * S / (S + kappa_k(beta1) V/n) per param group (EMA on, two groups with different
    beta1), kappa_k from the group's betas; an optimizer without betas is refused in one line."""
    from oblr.snr import momentum_noise_share

    opt = _adamw(lrs=(0.5, 0.5), betas=((0.9, 0.999), (0.5, 0.99)))
    ctl = make_lr_controller("snr_adam", opt, lr=0.2, ema=0.5)
    assert ctl.needs_snr
    s_avg = v_avg = 0.0
    for k in range(1, 6):
        st = _stats(k)
        ctl.step(st)
        s_avg, v_avg = 0.5 * s_avg + 0.5 * float(st.signal), 0.5 * v_avg + 0.5 * float(st.V)
        S, V = max(s_avg / (1 - 0.5**k), 0.0), max(v_avg / (1 - 0.5**k), 0.0)
        want = [0.2 * snr_factor(S, momentum_noise_share(b, k) * V, st.n) for b in (0.9, 0.5)]
        assert ctl.get_last_lr() == pytest.approx(want, rel=1e-12)
        assert [g["lr"] for g in opt.param_groups] == ctl.get_last_lr()
        m = ctl.metrics()
        assert m["snr/factor"] == pytest.approx(want[0] / 0.2, rel=1e-12)
        assert m["snr/n_eff"] == pytest.approx(st.n / momentum_noise_share(0.9, k), rel=1e-12)
    assert momentum_noise_share(0.9, 5) < 1 and ctl.get_last_lr()[0] > 0.2 * snr_factor(S, V, st.n)
    with pytest.raises(ValueError, match="needs an Adam-family optimizer .* got SGD; with SGD use lr_schedule=snr"):
        make_lr_controller("snr_adam", _opt(), lr=0.2)


def test_an_snr_checkpoint_does_not_load_into_snr_adam():
    kw = dict(lr=0.3, eta_min=0.01, warmup_steps=2, total_steps=8, ema=0.5)
    with pytest.raises(ValueError, match="missing keys \\['beta1'\\]"):  # an snr checkpoint is not snr_adam's
        make_lr_controller("snr_adam", _adamw(), **kw).load_state_dict(make_lr_controller("snr", _opt(), **kw).state_dict())
