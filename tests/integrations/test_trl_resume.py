"""Resuming OBLRGRPOTrainer from a TRL checkpoint continues the learning-rate schedule: a run of 4 steps saves a
checkpoint after step 2; a new trainer resumed from it holds the schedule's state the first run had after step 2
(the SNR EMA averages and step count, the ``auto`` schedule's measured state with its buffers, or the ``kl``
schedule's averaged stiffness and lr) and logs the same statistics and lrs on steps 3 and 4. The uninterrupted run's lrs are also recomputed from its logged
statistics with the warm-up written out (the regime where the state decides the lr: EMA on, inside a warm-up)."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from oblr.models import load_model_and_tokenizer  # noqa: E402

from .test_trl_schedule import noisy_reward  # noqa: E402
from .trl_helpers import kl_rule_lrs, make_trainer  # noqa: E402

STEPS, SAVE_AT, WARMUP, EMA, ETA_MAX, G, ROWS = 4, 2, 3, 0.9, 1e-3, 4, 8


class ScheduleSnapshots(TrainerCallback):
    """Deep copies of the lr schedule's ``state_dict`` when training begins (after a resume has loaded it) and
    after each optimizer step."""

    def __init__(self):
        self.trainer = None
        self.at_begin = None
        self.after_step: dict[int, dict] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self.at_begin = copy.deepcopy(self.trainer.lr_scheduler.state_dict())

    def on_step_end(self, args, state, control, **kwargs):
        self.after_step[state.global_step] = copy.deepcopy(self.trainer.lr_scheduler.state_dict())


def _run(trl_model, out_dir, schedule: str, resume_from=None):
    model, tok = load_model_and_tokenizer(trl_model)
    kw = dict(learning_rate=ETA_MAX, oblr_snr_ema=EMA, oblr_lr_schedule=schedule)
    if schedule == "auto":
        kw = dict(learning_rate=0.05, oblr_lr_schedule="auto",
                  oblr_schedule_options={"max_change": 3.0, "probe": 1.0, "scale_ema": 0.5})
    trainer = make_trainer(model, tok, out_dir, reward=noisy_reward, per_device_train_batch_size=ROWS,
                           num_generations=G, max_steps=STEPS, warmup_steps=WARMUP, save_strategy="steps",
                           save_steps=SAVE_AT, save_only_model=False, **kw)
    snaps = ScheduleSnapshots()
    snaps.trainer = trainer
    trainer.add_callback(snaps)
    trainer.train(resume_from_checkpoint=resume_from)
    rows = {r["step"]: r for r in trainer.state.log_history if "oblr/lr" in r}
    return trainer, snaps, rows


def _same(a, b) -> bool:
    """Equal nested states: tensors bit for bit, floats exactly."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _snr_lrs_by_hand(rows: list[dict], n: int, beta1: float | None = None) -> list[float]:
    """lr_k = min(1, k/W) eta_max S/(S + kappa_k V/n) from the logged unclamped signal and V (bias-corrected
    EMA, clamped after averaging), written from the formula: kappa_k = 1 (snr), or the variance share of Adam's
    bias-corrected momentum after k steps, (1-b)(1+b^k)/((1+b)(1-b^k)) (snr_adam, b = beta1)."""
    s_avg = v_avg = 0.0
    out = []
    for k, r in enumerate(rows, start=1):
        s_avg = EMA * s_avg + (1 - EMA) * r["oblr/signal"]
        v_avg = EMA * v_avg + (1 - EMA) * r["oblr/V"]
        S, V = max(s_avg / (1 - EMA**k), 0.0), max(v_avg / (1 - EMA**k), 0.0)
        kappa = 1.0 if beta1 is None else (1 - beta1) * (1 + beta1**k) / ((1 + beta1) * (1 - beta1**k))
        out.append(min(1.0, k / WARMUP) * (ETA_MAX * S / (S + kappa * V / n) if S + V / n > 0 else 0.0))
    return out


@pytest.mark.parametrize("schedule", ["snr", "snr_adam", "auto", "kl"])
def test_resumed_trainer_continues_the_schedule_of_the_uninterrupted_run(trl_model, tmp_path, schedule):
    straight, snaps, rows = _run(trl_model, tmp_path / "straight", schedule)
    assert sorted(rows) == list(range(1, STEPS + 1))
    ckpt = tmp_path / "straight" / f"checkpoint-{SAVE_AT}"
    assert (ckpt / "scheduler.pt").is_file()
    resumed, rsnaps, rrows = _run(trl_model, tmp_path / "resumed", schedule, resume_from=str(ckpt))
    assert sorted(rrows) == list(range(1, STEPS + 1))  # steps 1-2 come from the checkpoint's trainer state
    # the state loaded from the checkpoint is the state of the first run after step SAVE_AT
    assert _same(rsnaps.at_begin, snaps.after_step[SAVE_AT])
    assert not _same(snaps.after_step[SAVE_AT], snaps.after_step[SAVE_AT - 1])  # it is a state that moves
    # the next steps: the same statistics and lrs, and the same final state
    for step in range(SAVE_AT + 1, STEPS + 1):
        for key in ("oblr/step_kl",) if schedule == "kl" else ("oblr/signal", "oblr/V"):
            assert rrows[step][key] == pytest.approx(rows[step][key], rel=1e-9, abs=1e-15), (step, key)
        for key in ("oblr/lr", "learning_rate"):
            assert rrows[step][key] == pytest.approx(rows[step][key], rel=1e-9, abs=1e-15), (step, key)
    assert _same(rsnaps.after_step[STEPS], snaps.after_step[STEPS])
    ctl, rctl = straight.lr_scheduler.controller, resumed.lr_scheduler.controller
    assert rctl.get_last_lr() == pytest.approx(ctl.get_last_lr(), rel=1e-9)
    lrs = [rows[s]["oblr/lr"] for s in range(1, STEPS + 1)]
    if schedule == "kl":  # each applied lr from the logged KLs by the rule, inside the warm-up
        assert lrs == pytest.approx(kl_rule_lrs([rows[s]["oblr/step_kl"] for s in range(1, STEPS + 1)], ETA_MAX,
                                                ctl.target, warmup=WARMUP), rel=1e-6)
        assert lrs[0] == pytest.approx(0.1 * ETA_MAX / WARMUP)
        assert ctl.n == rctl.n == STEPS and rctl.avg == pytest.approx(ctl.avg, rel=1e-9)
    elif schedule != "auto":
        n = ROWS // G
        beta1 = straight.args.adam_beta1 if schedule == "snr_adam" else None
        assert lrs == pytest.approx(_snr_lrs_by_hand([rows[s] for s in range(1, STEPS + 1)], n, beta1), rel=1e-9,
                                    abs=1e-15)
        if schedule == "snr_adam":  # the momentum's count moved the lr off the paper's rule
            assert lrs[1:] != pytest.approx(_snr_lrs_by_hand([rows[s] for s in range(1, STEPS + 1)], n), rel=1e-3)
        assert ctl.inner.steps == rctl.inner.steps == STEPS
        assert rctl.inner.state_dict()["s_avg"] == pytest.approx(ctl.inner.state_dict()["s_avg"], rel=1e-9)
    else:
        assert lrs[0] == pytest.approx(0.05 / WARMUP)  # probe 1: the guess, warmed up 1/3
        assert ctl.t == rctl.t == STEPS and rctl.n_avg == ctl.n_avg >= 1
        assert rctl.avgs == pytest.approx(ctl.avgs, rel=1e-9)
    # the regime: the lr still warming up when the run resumes, so the step count decides it
    assert SAVE_AT + 1 <= WARMUP
