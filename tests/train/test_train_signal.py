"""Whole training steps with real signal, every number checked against an independent computation.

The test-sized built-in model (fixture ``small_builtin``) gets all-zero rewards on its own task, so these
tests train on the deterministic stub task of ``signal_task.py`` (non-zero rewards that differ within every
group, S > 0). A spy on the trainer's call of ``accumulate_policy_gradient`` keeps, for every
step, the rollout batch and a copy of the model before the step. From these alone the reference in
``step_reference.py`` recomputes the step (rewards reshaped prompt-major, advantages, w_i, one backward
per sequence, the gradient, S, V, the learning-rate factor and the lr, clipping, the optimizer's update,
a second epoch) and the test compares it with what the trainer logged and with the parameters it left.
The resume test runs AdamW with the SNR schedule and EMA on, so the checkpoint's optimizer, controller and
RNG state all matter.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from signal_task import SIGNAL_TASK, stub_reward
from step_reference import (
    SNRRate,
    clip_grad,
    flat_params,
    later_epoch_grad,
    reference,
    set_flat_params,
)

from oblr.config import load_config
from oblr.logprobs import token_logprobs
from oblr.train import Trainer

STUB = SIGNAL_TASK
N, G, MAX_NEW = 4, 4, 24
CLIP = 1e-4  # below every gradient norm of these runs: clipping is active on every step


def _config(model, out, steps: int, *overrides):
    return load_config(None, [
        f"model.name_or_path={model}", f"task.name={STUB}", f"train.steps={steps}", f"train.output_dir={out}",
        f"rollout.prompts_per_step={N}", f"rollout.group_size={G}", f"rollout.max_new_tokens={MAX_NEW}",
        "task.eval_size=0", "train.threads=1", "train.plots=false", *overrides])


@pytest.fixture
def recorder(monkeypatch):
    """Wraps the trainer's accumulate_policy_gradient: per step, the batch and the model before the step."""
    import oblr.distributed.step  # the trainer's step calls oblr.update through it

    real = oblr.distributed.step.accumulate_policy_gradient
    steps: list[dict] = []

    def spy(model, batch, rewards, settings, **kw):
        steps.append({"model": copy.deepcopy(model), "batch": batch})
        return real(model, batch, rewards, settings, **kw)

    monkeypatch.setattr(oblr.distributed.step, "accumulate_policy_gradient", spy)
    return steps


def _rows(run_dir) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "train/reward_mean" in r}


def token_mean_entropy(model, batch) -> float:
    """Mean over response tokens of the entropy of the model's next-token distribution (written out here,
    not oblr's token_entropy)."""
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.double()
    p = torch.softmax(logits[:, :-1], -1)
    ent = -(p * torch.log(p.clamp_min(1e-300))).sum(-1)  # predicts token t+1
    mask = batch.response_mask[:, 1:].double()
    return float((ent * mask).sum() / mask.sum())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def check_steps(trainer: Trainer, recorded: list[dict], *, update_tol: float = 2e-3) -> list[dict]:
    """Recompute every recorded step from the model before it and its batch; compare with the log and with
    the parameters after it. Returns the reference numbers per step."""
    cfg = trainer.cfg
    a, o = cfg.algorithm, cfg.optim
    max_len = a.max_len or cfg.rollout.max_new_tokens
    rows = _rows(trainer.run_dir)
    snr = SNRRate(o.lr, ema=o.snr_ema, warmup_steps=o.warmup_steps, eta_min=o.eta_min)
    adam = None
    if o.optimizer == "adamw":
        flat = torch.nn.Parameter(flat_params(recorded[0]["model"]).float())
        adam = torch.optim.AdamW([flat], lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    after = [flat_params(r["model"]) for r in recorded[1:]] + [flat_params(trainer.model)]
    out = []
    for t, (rec, p_after) in enumerate(zip(recorded, after)):
        row, model, batch = rows[t + 1], rec["model"], rec["batch"]
        rewards = torch.tensor([stub_reward(r) for r in batch.responses]).view(N, G)  # rows are prompt-major
        assert (rewards.std(-1) > 0).sum() >= 2, "groups must carry signal"
        ref = reference(model, batch, rewards, a.aggregation, a.baseline, max_len)
        assert row["train/reward_mean"] == pytest.approx(float(rewards.mean()), rel=1e-6)
        # the reward-side signatures docs/spec.md lists, recomputed from the rewards and the batch
        assert row["train/pass_rate"] == pytest.approx(float((rewards == 1).float().mean()), abs=1e-9)
        assert row["train/pass_at_g"] == pytest.approx(float((rewards == 1).any(1).float().mean()), abs=1e-9)
        equal = [len(set(g.tolist())) == 1 for g in rewards]
        assert row["train/all_equal_share"] == pytest.approx(sum(equal) / N, abs=1e-9)
        lengths = batch.response_mask.sum(-1).double()
        assert row["train/response_length_mean"] == pytest.approx(float(lengths.mean()), rel=1e-9)
        assert row["train/response_length_max"] == pytest.approx(float(lengths.max()), rel=1e-9)
        assert row["train/entropy"] == pytest.approx(token_mean_entropy(model, batch), rel=1e-4)
        assert row["optim/grad_norm"] == pytest.approx(float(ref["grad"].norm()), rel=1e-4)
        assert row["baseline/mean"] == pytest.approx(float((rewards - ref["adv"]).mean()), rel=1e-4)
        assert row["adv/std"] == pytest.approx(float(ref["adv"].std(correction=0)), rel=1e-4)
        if a.baseline == "oblr":
            assert row["weights/mean"] == pytest.approx(float(ref["w"].mean()), rel=1e-4)
        if a.lr_schedule == "snr":
            lr_ref = snr.step(float(ref["S"]), float(ref["V"]), N)
            assert lr_ref["S"] > 0 and lr_ref["V"] > 0 and lr_ref["lr"] > 0
            for k in ("S", "V", "factor"):
                assert row[f"snr/{k}"] == pytest.approx(lr_ref[k], rel=1e-3), (t, k)
            # the logged factor is S / (S + V/N) with N the prompts per step, and the lr follows from it
            assert row["snr/factor"] == pytest.approx(row["snr/S"] / (row["snr/S"] + row["snr/V"] / N), rel=1e-9)
            lr = lr_ref["lr"]
        else:
            lr = o.lr
        assert row["optim/lr"] == pytest.approx(lr, rel=1e-3)
        lr = row["optim/lr"]  # the logged lr (checked above) drives the update, as in the run

        p0 = flat_params(model)
        grad = clip_grad(ref["grad"], o.grad_clip)
        if adam is None:
            p1 = p0 - lr * grad
        else:
            with torch.no_grad():
                adam.param_groups[0]["params"][0].copy_(p0)
            adam.param_groups[0]["lr"] = lr
            adam.param_groups[0]["params"][0].grad = grad.float()
            adam.step()
            p1 = adam.param_groups[0]["params"][0].detach().double()
        for _ in range(a.epochs - 1):  # later epochs: clipped ratio against the rollout log-probs, same lr
            moved = copy.deepcopy(model)
            set_flat_params(moved, p1)
            with torch.no_grad():
                rollout_lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
            g2 = later_epoch_grad(moved, batch, rollout_lp, ref["adv"], a.aggregation, max_len, a.clip_eps)
            p1 = p1 - lr * clip_grad(g2, o.grad_clip)
        err = _rel(p_after - p0, p1 - p0)
        assert err < update_tol, f"step {t + 1}: parameter update differs from the reference by {err:.2e}"
        out.append({"ref": ref, "lr": lr, "row": row})
    return out


SGD = ["optim.optimizer=sgd", "optim.momentum=0", f"optim.grad_clip={CLIP}"]
CASES = {
    # book-keeping path, SNR from the current batch only
    "oblr-snr-sgd": ["algorithm.baseline=oblr", "algorithm.lr_schedule=snr", "optim.snr_ema=0", "optim.lr=1000",
                     *SGD],
    # micro-batches (3 + 1 groups), seq_mean, EMA and warm-up, two epochs per batch
    "oblr-snr-micro-epochs": ["algorithm.baseline=oblr", "algorithm.lr_schedule=snr", "optim.snr_ema=0.5",
                              "optim.warmup_steps=2", "optim.lr=3000", "algorithm.aggregation=seq_mean",
                              "algorithm.micro_batch_groups=3", "algorithm.epochs=2", *SGD],
    # the plain path (no weights, no SNR): update = -lr * grad, no clipping
    "rloo-constant-plain": ["algorithm.baseline=rloo", "algorithm.lr_schedule=constant", "optim.lr=2",
                            "algorithm.aggregation=token_mean", "optim.optimizer=sgd", "optim.grad_clip=0"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_training_steps_match_the_reference(small_builtin, tmp_path, recorder, case):
    trainer = Trainer(_config(small_builtin, tmp_path / "run", 2, *CASES[case]), quiet=True)
    trainer.run()
    assert len(recorder) == 2
    steps = check_steps(trainer, recorder)
    if "grad_clip=0" not in " ".join(CASES[case]):
        assert min(s["row"]["optim/grad_norm"] for s in steps) > 10 * CLIP  # clipping was active
    if "algorithm.epochs=2" in CASES[case]:
        assert all(abs(s["row"]["actor/ratio_mean"] - 1) > 1e-3 for s in steps)  # the ratio was in play


def test_resume_with_snr_ema_and_adamw_reproduces_the_straight_run(small_builtin, tmp_path, recorder):
    """AdamW, SNR schedule with EMA: 2 steps, stop (with an eval the straight run does not have), resume to 4.
    lr, S, V, rewards and the final parameters equal the straight run's; the straight run also matches
    the reference step by step (AdamW reproduced by a fresh torch AdamW on the reference gradient)."""
    common = ["algorithm.lr_schedule=snr", "optim.snr_ema=0.9", "optim.optimizer=adamw", "optim.lr=3e-3",
              "train.save_every=0", "train.eval_every=0", "task.eval_size=4", "train.eval_samples=1"]
    a, b = tmp_path / "straight", tmp_path / "resumed"
    straight = Trainer(_config(small_builtin, a, 4, *common), quiet=True)
    straight.run()
    steps = check_steps(straight, list(recorder))
    first = Trainer(_config(small_builtin, b, 2, *common), quiet=True)
    first.run()
    resumed = Trainer(_config(small_builtin, b, 4, *common), resume=True, quiet=True)
    resumed.run()
    ra, rb = _rows(a), _rows(b)
    assert sorted(rb) == [1, 2, 3, 4]
    assert all(s["row"]["snr/S"] > 0 and s["row"]["snr/V"] > 0 for s in steps)  # the EMA state is non-zero
    for step in (3, 4):
        for k in ("train/reward_mean", "optim/grad_norm", "optim/lr", "snr/S", "snr/V", "snr/factor",
                  "weights/mean", "adv/std", "train/response_length_mean"):
            assert rb[step][k] == pytest.approx(ra[step][k], rel=1e-6, abs=1e-12), (step, k)
    pa, pb = flat_params(straight.model), flat_params(resumed.model)
    assert _rel(pb, pa) < 1e-7 and _rel(flat_params(recorder[0]["model"]), pa) > 1e-4  # trained, identically
