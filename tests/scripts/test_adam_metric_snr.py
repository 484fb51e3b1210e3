"""benchmarks/adam_metric_snr.py: S and V in Adam's metric from a run's checkpoint (per-prompt backward passes,
checked against the exact-norm engine), and its pieces by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import adam_metric_snr as am  # noqa: E402

from oblr.snr import snr_statistics  # noqa: E402


def test_adam_denominator_is_the_step_adamw_takes_next():
    p = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))
    opt = torch.optim.AdamW([p], lr=0.0, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.0)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        p.grad = torch.randn(5, generator=gen, dtype=torch.float64)
        opt.step()
    D, block, steps = am.adam_denominator(opt)
    st = opt.state[p]
    assert steps == 3
    want = 1 / ((st["exp_avg_sq"] / (1 - 0.99**3)).sqrt() + 1e-6)
    assert torch.allclose(D[p], want, rtol=1e-12)
    assert block[p] == pytest.approx(1 / (float((st["exp_avg_sq"] / (1 - 0.99**3)).mean()) ** 0.5 + 1e-6), rel=1e-12)
    # the update AdamW applies with lr 1 is -mhat * D: the denominator is the step's own
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = torch.optim.AdamW([q], lr=1.0, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.0)
    opt2.load_state_dict(opt.state_dict() | {"param_groups": opt2.state_dict()["param_groups"]})
    q.grad = torch.randn(5, generator=gen, dtype=torch.float64)
    before = q.detach().clone()
    m = 0.9 * st["exp_avg"] + 0.1 * q.grad
    v = 0.99 * st["exp_avg_sq"] + 0.01 * q.grad**2
    opt2.step()
    step = -(m / (1 - 0.9**4)) / ((v / (1 - 0.99**4)).sqrt() + 1e-6)
    assert torch.allclose(q.detach() - before, step, rtol=1e-10)


def test_metric_statistics_by_hand_and_a_constant_metric_leaves_the_ratio():
    gen = torch.Generator().manual_seed(1)
    grads = [[torch.randn(3, 2, generator=gen, dtype=torch.float64) + 0.3, torch.randn(4, generator=gen,
                                                                                      dtype=torch.float64)]
             for _ in range(6)]
    w = [torch.rand(3, 2, generator=gen, dtype=torch.float64), torch.rand(4, generator=gen, dtype=torch.float64)]
    sq, mean_sq = am.metric_statistics(grads, w)
    flat = torch.stack([torch.cat([g[0].reshape(-1), g[1]]) for g in grads])
    wf = torch.cat([w[0].reshape(-1), w[1]])
    assert torch.allclose(sq, (flat**2 * wf).sum(-1), rtol=1e-12)
    assert float(mean_sq) == pytest.approx(float((flat.mean(0) ** 2 * wf).sum()), rel=1e-12)
    e = snr_statistics(*am.metric_statistics(grads, None), 6)
    c = snr_statistics(*am.metric_statistics(grads, [torch.full_like(x, 7.0) for x in w]), 6)
    assert float(c.signal / c.V) == pytest.approx(float(e.signal / e.V), rel=1e-12)
    assert float(snr_statistics(sq, mean_sq, 6).signal / snr_statistics(sq, mean_sq, 6).V) != pytest.approx(
        float(e.signal / e.V), rel=1e-3)  # a non-constant metric does change it


def test_a_run_folder_is_measured_and_its_per_prompt_norms_match_the_engine(small_builtin, tmp_path):
    import signal_task  # registers the reward stub with signal in every group (tests/signal_task.py)

    from oblr.config import load_config
    from oblr.train.trainer import train

    run = tmp_path / "run"
    cfg = load_config(None, [f"task.name={signal_task.SIGNAL_TASK}", f"model.name_or_path={small_builtin}", "rollout.prompts_per_step=4",
                             "rollout.group_size=4", "rollout.max_new_tokens=12", "train.steps=2",
                             "train.save_every=2", "train.eval_every=0", "task.eval_size=4", "train.threads=1",
                             "train.plots=false", "optim.optimizer=adamw", f"train.output_dir={run}"])
    train(cfg, quiet=True)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    rec = am.measure(run, batches=2)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before  # the run folder is not touched
    assert rec["step"] == 2 and rec["n"] == 4 and len(rec["per_batch"]) == 2
    assert rec["engine_check_max_rel"] < 1e-4  # float32 engine against per-prompt float64 sums
    assert all(r["V_euclid"] > 0 and r["V_adam"] > 0 and r["V_block"] > 0 for r in rec["per_batch"])
    assert 0 < rec["kappa"] < 1 and 0 <= rec["factor_snr"] <= rec["factor_snr_adam"] <= 1
    assert "| run | task |" in am.table([rec])
    with pytest.raises(SystemExit, match="no checkpoint"):
        am.measure(tmp_path, batches=1)
