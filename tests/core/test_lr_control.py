"""oblr.lr_control: the warm-up and state every learning-rate controller shares. Each controller's lrs with
warm-up against a by-hand formula, a resume in the middle of the warm-up against the run without one, and the
state_dict formats the controllers wrote before the shared base (old checkpoints still load)."""

from __future__ import annotations

import math

import pytest
import torch

from oblr.lr_control import LRController, warmup_factor
from oblr.schedules import make_lr_controller
from oblr.snr import SNRLearningRate, snr_factor, snr_statistics

NAMES = ["constant", "cosine", "snr", "auto"]
W = 4  # warm-up steps


def _stats(seed: int, n: int = 4):
    g = torch.Generator().manual_seed(seed)
    gk = torch.randn(n, 5, generator=g, dtype=torch.float64) + 0.5
    return snr_statistics(gk.pow(2).sum(-1), gk.mean(0).pow(2).sum(), n)


def _setup(name: str, **kw):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(6))
    opt = torch.optim.SGD([p], lr=0.5)
    args = dict(lr=0.3, eta_min=0.01, warmup_steps=W, total_steps=8, ema=0.5, **kw)
    return p, opt, make_lr_controller(name, opt, **args)


def _step(p, opt, ctl, t: int) -> float:
    """One training step: a gradient that depends on the parameters and t, the controller, the optimizer."""
    p.grad = torch.sin(p.detach() * (t + 1)) + 0.3
    ctl.step(_stats(t))
    lr = ctl.get_last_lr()[0]
    assert opt.param_groups[0]["lr"] == lr
    opt.step()
    return lr


def test_warmup_factor_by_hand_and_a_bad_count_is_refused():
    assert [warmup_factor(t, 4) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == warmup_factor(7, 0) == 1.0
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="warmup_steps must be a non-negative integer"):
            LRController(opt, bad)


def test_constant_and_cosine_with_warmup_by_hand():
    for name in ("constant", "cosine"):
        p, opt, ctl = _setup(name)
        got = [_step(p, opt, ctl, t) for t in range(9)]
        want = []
        for t in range(9):
            if name == "constant":
                base = 0.3
            else:  # cosine from lr to eta_min over the steps after the warm-up
                progress = min(1.0, max(0, t - W) / (8 - W))
                base = 0.01 + 0.5 * (0.3 - 0.01) * (1 + math.cos(math.pi * progress))
            want.append(base * min(1.0, (t + 1) / W))
        assert got == pytest.approx(want, rel=1e-15), name


def test_snr_with_warmup_by_hand():
    """ema = 0: lr_k = min(1, k/W) max(eta_min, eta_max S/(S + V/n)) at the k-th accepted update; a skipped
    (non-finite) update neither changes the lr nor advances k."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    ctl = SNRLearningRate(opt, 0.3, eta_min=0.01, warmup_steps=W)
    got, want, k = [], [], 0
    for t in range(8):
        st = _stats(t)
        S, V = (float("nan"), 1.0) if t == 2 else (float(st.signal), float(st.V))
        ctl.step(S, V, st.n)
        got.append(ctl.get_last_lr()[0])
        if t == 2:
            want.append(want[-1])
            continue
        k += 1
        want.append(min(1.0, k / W) * max(0.01, 0.3 * snr_factor(max(S, 0.0), max(V, 0.0), st.n)))
    assert got == pytest.approx(want, rel=1e-15) and ctl.steps == 7 and ctl.n_skipped == 1


def test_auto_with_warmup_is_the_warmup_factor_times_its_rule():
    """auto: the first lr is the probe (0.01 lr, floored at eta_min) times the first warm-up factor; every
    later applied lr is min(1, (t+1)/W) times the rule's own lr (``ctl.lr``, floored at eta_min)."""
    p, opt, ctl = _setup("auto")
    assert ctl.get_last_lr() == [pytest.approx(max(0.01, 0.3 * 0.01) / W, rel=1e-15)]
    for t in range(8):
        lr = _step(p, opt, ctl, t)
        assert lr == pytest.approx(min(1.0, (t + 1) / W) * max(0.01, ctl.lr), rel=1e-15)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("stop", [1, 2])
def test_a_resume_in_the_warmup_continues_the_same_sequence(name, stop):
    """Saved after ``stop`` steps (inside the 4-step warm-up), restored into a fresh controller on a fresh
    optimizer whose lr is different: the same lrs (bit for bit) and metrics as the run without the stop."""
    p, opt, straight = _setup(name)
    want = [_step(p, opt, straight, t) for t in range(8)]
    want_metrics = straight.metrics()

    p, opt, ctl = _setup(name)
    got = [_step(p, opt, ctl, t) for t in range(stop)]
    state = ctl.state_dict()
    opt2 = torch.optim.SGD([p], lr=123.0)
    opt2.load_state_dict(opt.state_dict())
    opt2.param_groups[0]["lr"] = 123.0
    resumed = make_lr_controller(name, opt2, lr=0.3, eta_min=0.01, warmup_steps=W, total_steps=8, ema=0.5)
    resumed.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == got[-1]
    got += [_step(p, opt2, resumed, t) for t in range(stop, 8)]
    assert got == want and resumed.metrics() == want_metrics


#: the state_dict keys each controller wrote before oblr.lr_control: checkpoints in this format must load
OLD_KEYS = {
    "constant": {"t", "last"},
    "cosine": {"t", "last"},
    "snr": {"eta_max", "eta_min", "ema", "warmup_steps", "steps", "n_skipped", "s_avg", "v_avg", "last_S",
            "last_V", "last_n", "last_factor", "last_lr"},
    "auto": {"lr", "eta_min", "ema", "grad_clip", "warmup_steps", "max_change", "t", "prev", "avgs",
             "confidence", "n_avg", "last", "_applied"},
}


@pytest.mark.parametrize("name", NAMES)
def test_the_state_dict_keys_are_the_old_ones_and_the_old_auto_format_loads(name):
    p, opt, ctl = _setup(name)
    lrs = [_step(p, opt, ctl, t) for t in range(2)]
    state = ctl.state_dict()
    assert set(state) == OLD_KEYS[name]
    old = dict(state)
    if name == "auto":  # the old auto schedule wrote its applied lr as one number, not a list
        old["_applied"] = lrs[-1]
    p2 = torch.nn.Parameter(p.detach().clone())
    opt2 = torch.optim.SGD([p2], lr=9.0)
    resumed = make_lr_controller(name, opt2, lr=0.3, eta_min=0.01, warmup_steps=W, total_steps=8, ema=0.5)
    resumed.load_state_dict(old)
    assert resumed.get_last_lr() == [lrs[-1]] and opt2.param_groups[0]["lr"] == lrs[-1]
    assert [_step(p2, opt2, resumed, t) for t in range(2, 5)] == [_step(p, opt, ctl, t) for t in range(2, 5)]
    with pytest.raises(ValueError, match="state_dict is missing keys"):
        resumed.load_state_dict({k: v for k, v in state.items() if k not in ("t", "steps")})
