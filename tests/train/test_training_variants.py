"""Short training runs (built-in test-sized model, 2 steps) of the non-default paths: KL on, epochs > 1,
micro-batches, and every gradient-norm method, on the reward stub of ``signal_task.py`` (non-zero rewards
that differ within every group, so every step has a gradient). Step 1 samples the same rollouts in every
variant (same seed, weights not yet updated), so its statistics can be compared across variants."""

from __future__ import annotations

import math

import pytest
from signal_task import SIGNAL_TASK

from oblr.config import load_config
from oblr.gradnorm import NORMS_METHODS
from oblr.tracking import read_metrics
from oblr.train import Trainer

# the SNR schedule (the default before the kl one): its S and V are the statistics compared across paths
TINY = [f"task.name={SIGNAL_TASK}", "algorithm.lr_schedule=snr", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16", "task.eval_size=0",
        "train.threads=1", "train.plots=false", "train.save_every=0"]


def _train(model, out, *extra, steps=2):
    cfg = load_config(None, [f"model.name_or_path={model}", f"train.steps={steps}", f"train.output_dir={out}",
                             *TINY, *extra])
    Trainer(cfg, quiet=True).run()
    rows = [r for r in read_metrics(out) if "train/reward_mean" in r]
    assert all(r["adv/std"] > 0 and r["optim/grad_norm"] > 0 for r in rows), "every step must carry signal"
    return rows


@pytest.fixture(scope="module")
def default_run(small_builtin, tmp_path_factory):
    return _train(small_builtin, tmp_path_factory.mktemp("default") / "run")


def _same_step1(a: dict, b: dict, keys, rel=1e-4):
    for k in keys:
        assert b[k] == pytest.approx(a[k], rel=rel, abs=1e-9), k


STEP1 = ("train/reward_mean", "weights/mean", "adv/std", "baseline/mean", "snr/S", "snr/V", "optim/grad_norm",
         "optim/loss", "train/entropy")


@pytest.mark.parametrize("method", [m for m in NORMS_METHODS.names() if m != "auto"])
def test_every_norms_method_trains_like_auto(small_builtin, tmp_path, default_run, method):
    rows = _train(small_builtin, tmp_path / "run", f"algorithm.norms_method={method}")
    assert [r["step"] for r in rows] == [1, 2]
    _same_step1(default_run[0], rows[0], STEP1)


def test_micro_batches_train_like_the_whole_batch(small_builtin, tmp_path, default_run):
    rows = _train(small_builtin, tmp_path / "run", "algorithm.micro_batch_groups=2")
    _same_step1(default_run[0], rows[0], STEP1)


def test_kl_on_logs_kl_and_keeps_v_nonnegative(small_builtin, tmp_path):
    rows = _train(small_builtin, tmp_path / "run", "algorithm.kl_coef=0.5", "algorithm.micro_batch_groups=2",
                  steps=3)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["actor/kl"] == pytest.approx(0.0, abs=1e-6)  # the policy starts at the reference
    assert rows[-1]["actor/kl"] > 0 and all(math.isfinite(r["optim/loss"]) for r in rows)
    assert all(r["snr/V"] >= 0 for r in rows)


def test_epochs_above_one_use_the_clipped_loss(small_builtin, tmp_path):
    rows = _train(small_builtin, tmp_path / "run", "algorithm.epochs=2", "algorithm.kl_coef=0.1")
    for r in rows:
        assert 0 <= r["actor/clip_frac"] <= 1 and r["actor/ratio_mean"] > 0 and r["optim/skipped"] == 0
        assert math.isfinite(r["actor/pg_loss"]) and r["actor/kl"] >= 0


def test_auto_schedule_options_come_from_the_config_and_the_clip_factor_reaches_kappa(small_builtin, tmp_path):
    """``algorithm.schedule_options`` reaches the auto schedule (the probe sets step 1's lr), and with SGD (noise
    gain exactly 1) and clipping active the noise bias the trainer's schedule used at step 2 is
    ``kappa = -lr_1 c V_1 / N`` with ``c = optim.grad_clip / |g_1|`` -- recovered from the logged d and
    kappa share. A trainer that did not pass optim.grad_clip to the schedule would use c = 1."""
    rows = _train(small_builtin, tmp_path / "run", "optim.optimizer=sgd", "optim.lr=0.5", "algorithm.lr_schedule=auto",
                  "optim.grad_clip=0.02", "algorithm.schedule_options={probe: 0.2, max_change: 1000000, "
                  "scale_ema: 0, confidence: 0}", steps=2)
    r1, r2 = rows
    assert r1["optim/lr"] == pytest.approx(0.5 * 0.2)
    c = 0.02 / r1["optim/grad_norm"]
    assert c < 0.5, "clipping must be active for this test to mean anything"
    kappa_expected = -r1["optim/lr"] * c * r1["snr/V"] / 4
    d, share = r2["auto/d"], r2["auto/kappa_share"]
    kappa_logged = d * r1["optim/lr"] / (1 - 1 / share)
    assert kappa_logged == pytest.approx(kappa_expected, rel=1e-4)
    assert kappa_logged != pytest.approx(kappa_expected / c, rel=1e-2)  # c = 1 is told apart


KL_RULE = ["optim.optimizer=adamw", "optim.lr=0.01", "algorithm.lr_schedule=kl", "optim.grad_clip=0.5",
           "algorithm.schedule_options={target: 0.0001, probe: 0.1, kl_ema: 0, max_change: 2}"]


def test_kl_schedule_sets_each_lr_from_the_kl_the_trainer_measured_after_the_previous_update(small_builtin, tmp_path):
    """With ``kl_ema`` 0 the lr of step t+1 is ``sqrt(target / k_t)``, ``k_t = policy/step_kl / lr_t^2`` (the first
    measurement uncapped, later ones at most 2 lr_t), recomputed here from the logged rows; step 1 runs at the
    probe. A trainer that passed the KL before the update, or another step's, would set other lrs."""
    rows = _train(small_builtin, tmp_path / "run", *KL_RULE, steps=4)
    assert rows[0]["optim/lr"] == pytest.approx(0.01 * 0.1)
    kls = [r["policy/step_kl"] for r in rows]
    assert all(k > 0 for k in kls) and len(set(kls)) == 4 and all(r["time/step_kl"] > 0 for r in rows)
    moved = 0
    for t in range(3):
        lr, kl = rows[t]["optim/lr"], kls[t]
        want = math.sqrt(1e-4 * lr**2 / kl)
        expected = want if t == 0 else min(want, 2 * lr)
        assert rows[t + 1]["optim/lr"] == pytest.approx(expected, rel=1e-9), t
        assert rows[t]["kl/stiffness"] == pytest.approx(kl / lr**2, rel=1e-9)  # logged with the step it measured
        moved += abs(rows[t + 1]["optim/lr"] / lr - 1) > 0.05
    assert moved >= 2  # the rule moved the lr: the comparison is not between constants


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_kl_schedule_default_target_is_scaled_by_the_runs_prompts_per_step_with_adamw(small_builtin, tmp_path,
                                                                                      optimizer):
    """No ``target`` given: the trainer passes rollout.prompts_per_step (4 here), so with AdamW the rule aims at
    1.5e-3 x 4 / 128 (the N = 128 default would set an lr sqrt(32) = 5.7x larger), with SGD at 3e-3; the second
    lr is sqrt(target / k_1) from the logged KL."""
    rows = _train(small_builtin, tmp_path / "run", *KL_RULE[1:4], f"optim.optimizer={optimizer}",
                  "algorithm.schedule_options={kl_ema: 0}", steps=2)
    target = 1.5e-3 * 4 / 128 if optimizer == "adamw" else 3e-3
    assert [r["kl/target"] for r in rows] == [target, target]
    lr, kl = rows[0]["optim/lr"], rows[0]["policy/step_kl"]
    assert rows[1]["optim/lr"] == pytest.approx(math.sqrt(target * lr**2 / kl), rel=1e-9)


def test_kl_schedule_resumes_with_the_lrs_of_the_uninterrupted_run(small_builtin, tmp_path):
    straight = _train(small_builtin, tmp_path / "a", *KL_RULE, steps=4)
    _train(small_builtin, tmp_path / "b", *KL_RULE, steps=2)
    cfg = load_config(None, [f"model.name_or_path={small_builtin}", "train.steps=4", f"train.output_dir={tmp_path / 'b'}",
                             *TINY, *KL_RULE])
    Trainer(cfg, resume=True, quiet=True).run()
    resumed = [r for r in read_metrics(tmp_path / "b") if "train/reward_mean" in r]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        assert b["optim/lr"] == pytest.approx(a["optim/lr"], rel=1e-6) and b["policy/step_kl"] == pytest.approx(
            a["policy/step_kl"], rel=1e-4)


def test_track_step_kl_logs_the_policys_change_with_a_fixed_lr(small_builtin, tmp_path):
    rows = _train(small_builtin, tmp_path / "run", "algorithm.baseline=grpo", "algorithm.lr_schedule=constant",
                  "optim.lr=0.001", "algorithm.track_step_kl=true")
    assert all(r["policy/step_kl"] > 0 and r["optim/lr"] == 0.001 for r in rows)
    plain = _train(small_builtin, tmp_path / "plain", "algorithm.baseline=grpo", "algorithm.lr_schedule=constant",
                   "optim.lr=0.001")
    assert not any("policy/step_kl" in r for r in plain)
    for a, b in zip(rows, plain):  # measuring changes nothing the run does
        assert a["optim/loss"] == b["optim/loss"] and a["train/reward_mean"] == b["train/reward_mean"]


RECOMPUTE = "algorithm.checkpointed_engine=recompute"


@pytest.mark.parametrize("extra", [(), ("algorithm.micro_batch_groups=2", "algorithm.kl_coef=0.5"),
                                   ("model.logit_chunk_tokens=5",), (RECOMPUTE,),
                                   (RECOMPUTE, "algorithm.micro_batch_groups=2", "algorithm.kl_coef=0.5")])
def test_activation_checkpointing_trains_like_the_default(small_builtin, tmp_path, default_run, extra, monkeypatch):
    """Each step runs the engine algorithm.checkpointed_engine names (the two-pass one by default; the update
    core's books are recorded), and step 1 equals the default run's where the objective is the same."""
    import oblr.update

    made, make_book = [], oblr.update.make_book
    monkeypatch.setattr(oblr.update, "make_book", lambda *a, **kw: made.append(make_book(*a, **kw)) or made[-1])
    rows = _train(small_builtin, tmp_path / "run", "model.activation_checkpointing=true", *extra)
    assert [r["step"] for r in rows] == [1, 2]
    engine = "RecomputeBookKeeper" if RECOMPUTE in extra else "TwoPassBookKeeper"
    assert made and {type(b).__name__ for b in made} == {engine}
    if "algorithm.kl_coef=0.5" not in extra:  # step 1: the same rollouts, so the same weights, norms, S, V,
        #                                       gradient, loss and entropy as without it
        _same_step1(default_run[0], rows[0], STEP1, rel=1e-5)
