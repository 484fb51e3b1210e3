"""OBLRGRPOTrainer's learning rate: every step's ``oblr/lr`` recomputed by an independent controller from the
logged unclamped signal and V and the configured N (the generation batch's prompts, here twice a per-device
batch's: gradient accumulation 2), with a noisy reward (the regime where clamping before the
EMA changes the lr); the ``auto`` schedule (``learning_rate="auto"``) runs in TRL with its probe and its
bounded changes; the ``kl`` schedule measures the KL each step moved the policy by (against a float64
one-sequence-at-a-time reference from the weights before and after the step, clipping on) and sets each lr
from it by the rule."""

import zlib

import pytest

pytest.importorskip("trl")

from transformers import TrainerCallback  # noqa: E402

from oblr.kl_rate import KLStepSchedule  # noqa: E402
from oblr.models import load_model_and_tokenizer  # noqa: E402
from oblr.step_scale import AutoStepSchedule  # noqa: E402

from .trl_helpers import KeepRounds, kl_rule_lrs, make_trainer, one_at_a_time_step_kl  # noqa: E402

# per optimizer step: one generation batch of 4 prompts x 4 completions, folded in 2 chunks of 8 rows, so the
# N of S/(S + V/N) (the generation batch's prompts) differs from a chunk's (a per-device batch's) 2 prompts
ETA_MAX, EMA, G, ROWS, GA = 1e-3, 0.9, 4, 8, 2


def noisy_reward(prompts, completions, **kwargs) -> list[float]:
    """0 or 1 from a hash of the completion: spread inside groups, unrelated to any gradient direction, so the
    signal estimate is often negative (noise dominates)."""
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def _independent_lrs(rows, n: int) -> list[float]:
    """lr_t = eta_max S/(S + V/n) with S, V the bias-corrected EMAs of the UNCLAMPED signal and V, clamped
    after averaging (written here from the formula, not with oblr.snr)."""
    s_avg = v_avg = 0.0
    out = []
    for k, row in enumerate(rows, start=1):
        s_avg = EMA * s_avg + (1 - EMA) * row["oblr/signal"]
        v_avg = EMA * v_avg + (1 - EMA) * row["oblr/V"]
        corr = 1 - EMA**k
        S, V = max(s_avg / corr, 0.0), max(v_avg / corr, 0.0)
        out.append(ETA_MAX * S / (S + V / n) if S + V / n > 0 else 0.0)
    return out


def test_trl_lr_is_the_snr_rule_on_the_logged_unclamped_statistics(trl_model, tmp_path):
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, reward=noisy_reward, per_device_train_batch_size=ROWS,
                           gradient_accumulation_steps=GA, num_generations=G, max_steps=8, learning_rate=ETA_MAX,
                           oblr_snr_ema=EMA)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "oblr/lr" in r]
    assert len(rows) == 8
    n = ROWS * GA // G  # the prompts of one optimizer step, not of one per-device batch
    assert all(r["oblr/n"] == n for r in rows)
    signals = [r["oblr/signal"] for r in rows]
    assert min(signals) < 0 < max(signals), f"need steps with negative and positive signal, got {signals}"
    expected = _independent_lrs(rows, n)
    for r, lr in zip(rows, expected):
        assert r["oblr/lr"] == pytest.approx(lr, rel=1e-6, abs=1e-15)
        assert r["learning_rate"] == pytest.approx(r["oblr/lr"], rel=1e-6, abs=1e-15)
    # the regime matters: averaging the clamped S instead gives a different lr on some step
    clamped = _independent_lrs([{**r, "oblr/signal": max(r["oblr/signal"], 0.0)} for r in rows], n)
    assert any(abs(a - b) > 1e-3 * max(abs(b), 1e-12) for a, b in zip(clamped, expected))


def test_auto_schedule_runs_in_trl_from_learning_rate_auto(trl_model, tmp_path):
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, learning_rate="auto", max_steps=5,
                           oblr_schedule_options={"max_change": 1.5})
    assert trainer.args.oblr_lr_schedule == "auto"
    trainer.train()
    ctrl = trainer.lr_scheduler.controller
    assert isinstance(ctrl, AutoStepSchedule) and ctrl.max_change == 1.5
    rows = [r for r in trainer.state.log_history if "oblr/lr" in r]
    assert len(rows) == 5
    lrs = [r["oblr/lr"] for r in rows]
    assert lrs[0] == pytest.approx(0.01 * 1e-3)  # the probe: probe x the initial guess
    assert all("oblr/auto/d" in r for r in rows[1:])  # measured from the second step on
    for a, b in zip(lrs, lrs[1:]):
        assert a / 1.5 * (1 - 1e-9) <= b <= a * 1.5 * (1 + 1e-9)
    assert len(set(lrs)) > 1  # it moved
    assert [r["learning_rate"] for r in rows] == pytest.approx(lrs)


class WeightSnapshots(TrainerCallback):
    """Copies of the model's weights after each optimizer step."""

    def __init__(self, model_fn):
        self.model_fn = model_fn
        self.after: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.after.append({k: v.detach().clone() for k, v in self.model_fn().state_dict().items()})


def test_kl_schedule_in_trl_measures_each_steps_kl_and_sets_the_next_lr_from_it(trl_model, tmp_path):
    steps, guess = 4, 0.05
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, reward=noisy_reward, per_device_train_batch_size=ROWS,
                           gradient_accumulation_steps=GA, num_generations=G, max_steps=steps, learning_rate=guess,
                           oblr_lr_schedule="kl", max_grad_norm=0.05)
    keep = KeepRounds(trainer)
    snaps = WeightSnapshots(lambda: trainer.model)
    trainer.add_callback(snaps)
    trainer.train()
    ctrl = trainer.lr_scheduler.controller
    n = ROWS * GA // G  # the generation batch's prompts: the N of the default target
    assert isinstance(ctrl, KLStepSchedule) and ctrl.target == pytest.approx(1.5e-3 * n / 128)
    rows = [r for r in trainer.state.log_history if "oblr/lr" in r]
    assert len(rows) == steps and all("oblr/step_kl" in r for r in rows)
    assert not any("oblr/S" in r for r in rows)  # kl reads no S and V: they are not computed
    assert all(r["oblr/kl/target"] == pytest.approx(ctrl.target) for r in rows)
    # each step's KL against the float64 reference from the weights before and after it, on its own rows
    build = lambda: load_model_and_tokenizer(trl_model)[0]  # noqa: E731
    before = build().double()
    assert len(keep.rounds) == len(snaps.after) == steps
    for t, ((batch, _), after_sd) in enumerate(zip(keep.rounds, snaps.after)):
        after = build()
        after.load_state_dict(after_sd)
        after.double()
        kl, tokens = one_at_a_time_step_kl(before, after, batch.input_ids, batch.attention_mask, batch.response_mask,
                                           trainer.temperature)
        assert kl > 0
        assert rows[t]["oblr/step_kl"] == pytest.approx(kl / tokens, rel=2e-3), t
        before = after
    # each lr from the logged KLs by the rule, and the lr TRL applied
    lrs = [r["oblr/lr"] for r in rows]
    assert lrs == pytest.approx(kl_rule_lrs([r["oblr/step_kl"] for r in rows], guess, ctrl.target), rel=1e-6)
    assert [r["learning_rate"] for r in rows] == pytest.approx(lrs, rel=1e-6)
    assert len(set(lrs)) == steps  # it moved every step
    # the regime: clipping was on (the rule measures the step that was taken, whatever its size)
    assert max(r["grad_norm"] for r in rows) > 0.05


def test_kl_schedule_is_refused_in_trl_with_an_unknown_option(tmp_path):
    from oblr.integrations.trl import OBLRGRPOConfig

    with pytest.raises(ValueError, match="oblr_schedule_options=.*kl: target, "):
        OBLRGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True,
                       report_to=[], oblr_lr_schedule="kl", oblr_schedule_options={"eta_max": 1.0})
