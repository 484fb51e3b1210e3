"""benchmarks/trl_lr_trajectory.py without training: its independent replay of the SNR rule agrees with
oblr.snr.SNRLearningRate on a noisy sequence (negative signals, EMA and clamp both deciding the lr) and not with
the clamp-before-EMA variant; the recording schedule records each step's statistics, sets the forced lrs on
the optimizer for the first steps and the rule's afterwards; the summary has one row per run and stretch;
bad step and batch counts are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import trl_lr_trajectory as tlt

from oblr.schedules import make_lr_controller
from oblr.snr import SNRLearningRate, snr_statistics


def _noisy_sequence(steps=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    sig = (torch.randn(steps, generator=g, dtype=torch.float64) * 3e-3 + 5e-4).tolist()
    V = (0.05 + 0.3 * torch.rand(steps, generator=g, dtype=torch.float64)).tolist()
    return [(s, v, 16) for s, v in zip(sig, V)]


def test_replay_matches_the_library_rule_where_ema_and_clamp_decide():
    seq = _noisy_sequence()
    assert sum(s < 0 for s, _, _ in seq) >= 10  # the clamp matters
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    rule = SNRLearningRate(opt, eta_max=1e-3, ema=0.9)
    lib = [rule.step(s, v, n)[0] for s, v, n in seq]
    lrs, smooth = tlt.replay_lr(seq, 1e-3, 0.9)
    assert lrs == pytest.approx(lib, rel=1e-12, abs=1e-18)
    assert sum(x == 0 for x in lrs) >= 3 and max(lrs) > 5e-5
    assert smooth[0] == pytest.approx(seq[0][0]) and smooth[-1] != pytest.approx(seq[-1][0])
    clamped = tlt.replay_lr([(max(s, 0.0), v, n) for s, v, n in seq], 1e-3, 0.9)[0]
    assert max(abs(x - y) for x, y in zip(clamped, lib)) > 1e-5  # the replay can tell the clamped-EMA bug


def _stats(signal, V, n=16):
    # per-prompt sums that give exactly this signal and V: ||gbar||^2 = signal + V/n
    gbar_sq = signal + V / n
    total = V * (n - 1) + n * gbar_sq
    return snr_statistics(torch.tensor(total, dtype=torch.float64), torch.tensor(gbar_sq, dtype=torch.float64), n)


@pytest.fixture
def recording_schedule():
    """The benchmark's recording schedule, registered for one test and removed after it (the registry is global:
    left in, it would show in every later test's list of schedules)."""
    from oblr.schedules import SCHEDULES

    tlt._register_recording_schedule()
    tlt._register_recording_schedule()  # idempotent
    yield
    SCHEDULES.unregister("snr_recorded")


def test_recording_schedule_forces_the_first_lrs_then_follows_the_rule(recording_schedule):
    seq = _noisy_sequence(12, seed=1)
    forced = [2e-4, 0.0, 1.5e-4]
    tlt.RECORD.clear()
    tlt.FORCED[:] = forced
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    ctrl = make_lr_controller("snr_recorded", opt, lr=1e-3, ema=0.9, total_steps=12, grad_clip=1.0)
    applied = []
    for s, v, n in seq:
        ctrl.step(_stats(s, v, n))
        applied.append(opt.param_groups[0]["lr"])
    rule = tlt.replay_lr(seq, 1e-3, 0.9)[0]
    assert applied[:3] == forced and [r["lr"] for r in tlt.RECORD][:3] == forced
    assert applied[3:] == pytest.approx(rule[3:], rel=1e-9, abs=1e-18)
    assert [r["rule_lr"] for r in tlt.RECORD] == pytest.approx(rule, rel=1e-9, abs=1e-18)
    assert [r["signal"] for r in tlt.RECORD] == pytest.approx([s for s, _, _ in seq], rel=1e-9, abs=1e-12)
    assert [r["V"] for r in tlt.RECORD] == pytest.approx([v for _, v, _ in seq], rel=1e-9)
    tlt.FORCED.clear()


@pytest.mark.parametrize("argv,named", [(["--trl-steps", "0"], "--trl-steps"),
                                        (["--steps", "10", "--trl-steps", "20"], "--trl-steps"),
                                        (["--bf16-batches", "1"], "--bf16-batches")])
def test_bad_counts_are_refused(argv, named, capsys):
    with pytest.raises(SystemExit):
        tlt.parse_args(argv)
    assert named in capsys.readouterr().err


def test_render_has_one_row_per_run_and_stretch(tmp_path):
    seq = _noisy_sequence(12, seed=2)
    lrs = tlt.replay_lr(seq, 1e-3, 0.9)[0]
    steps = [{"signal": s, "V": v, "n": n, "logged_lr": lr, "grad_sq": v / n + s, "reward": 0.2, "entropy": 0.2}
             for (s, v, n), lr in zip(seq, lrs)]
    forced = [dict(st, logged_lr=1e-4, rule_lr=st["logged_lr"]) if k < 5 else st for k, st in enumerate(steps)]
    runs = {"trl seed 0": {"steps": steps[:5], "bf16": True}, "native seed 0": {"steps": steps},
            "native forced seed 0": {"steps": forced}, "native seed 4": {"steps": steps}}
    a = tlt.parse_args(["--seeds", "0", "--extra-seeds", "4", "--steps", "12", "--trl-steps", "5"])
    md = tlt.render(a, runs, [])
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| run |")]
    assert len(rows) == 7 and len(set(rows)) == 7
    assert sum("seed 4" in r for r in rows) == 2 and "bf16 autocast" in md
    assert all(r.rstrip(" |").endswith("e-20") or r.rstrip(" |").endswith("0.0e+00") for r in rows)  # replay agrees
