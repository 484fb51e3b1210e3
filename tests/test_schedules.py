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
    assert available_schedules() == SCHEDULES.names() == ["constant", "cosine", "snr"]
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'; registered: constant, cosine, snr"):
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


@pytest.mark.parametrize("name", ["constant", "cosine", "snr"])
def test_state_dict_round_trip_continues_the_sequence(name):
    kw = dict(lr=0.3, eta_min=0.01, warmup_steps=2, total_steps=8, ema=0.5)
    straight = make_lr_controller(name, _opt(), **kw)
    for t in range(4):
        straight.step(_stats(t))
    state = straight.state_dict()
    opt = _opt(lr=123.0)
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
