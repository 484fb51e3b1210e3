"""A 2-process step (torchrun, gloo, CPU, one thread per process) equals the one-process step on one batch.

The worker (``tests/distributed_worker.py``) runs every scenario of ``distributed_helpers.SCENARIOS`` --
ddp and fsdp; book-keeping (oblr + SNR) and plain (grpo) paths; whole-batch and micro-batched; with a KL
term and a second clipped epoch; gradient clipping; buckets small enough to need several collectives --
on its rank's half of a fixed batch. Here the same step runs in this process on the whole batch, and
gradients, parameter updates, per-prompt norms, ||gbar||^2, S, V, SNR, the unclamped signal and the
learning rate must agree by value within 1e-5 relative (the policy's KL over the step within 5e-4), and the N the statistics carry (which the lr
controller uses) must be the global prompt count. Metrics that are not sums or means (stds) are compared with the one-process step whose
micro-batches are the ranks' halves (a rank counts as a micro-batch, docs/distributed.md). The checkpointed
scenarios run the engine they name on the ranks and in the reference; the recompute engine's 2-process step
(the gradient through ddp's ``.grad`` or fsdp's ``grad_sink``) is also compared with the two-pass engine's
one-process step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_qwen3
from distributed_helpers import BF16_SCENARIO, ENGINE_CLASSES, SCENARIOS, N, engines_used, one_process_step

HERE = Path(__file__).resolve().parents[1]  # tests/: the worker and the shared helpers
RTOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _update_excess(a: torch.Tensor, b: torch.Tensor, start: torch.Tensor) -> float:
    """``||max(|a - b| - spacing(b), 0)|| / ||b - start||``: how far two updated float32 parameters differ beyond
    one float32 spacing of ``b`` per entry (one rounding apart), relative to the update ``b - start``."""
    b32 = b.detach().float()
    spacing = (torch.nextafter(b32, torch.full_like(b32, math.inf)) - b32).double()
    excess = ((a.double() - b.double()).abs() - spacing).clamp(min=0)
    return float(excess.norm() / (b.double() - start.double()).norm().clamp_min(1e-30))


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist") / "results.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(HERE / "distributed_worker.py"), str(out)]
    proc = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out, weights_only=False)


def _models(sc):
    return sc.policy(tiny_qwen3().train()), (tiny_qwen3().requires_grad_(False) if sc.kl_coef else None)


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_two_process_step_equals_one_process_step(worker_results, sc):
    assert worker_results["world_size"] == 2
    got = worker_results[sc.name]
    assert got["param_types"] == (["DTensor"] if sc.mode == "fsdp" else ["Parameter"])
    start = [p.detach().clone() for p in tiny_qwen3().parameters()]
    with engines_used() as engines:
        ref = one_process_step(*_models(sc), sc)
    if sc.checkpointing and (sc.need_snr or sc.baseline == "oblr"):  # the engine the scenario names ran, on both
        assert got["engines"] == sorted(set(engines)) == [ENGINE_CLASSES[sc.engine]]
    for key in ("grads", "grads2"):
        if key in ref:
            errs = [_rel(a, b) for a, b in zip(got[key], ref[key])]
            assert max(errs) < RTOL, (key, errs)
            assert min(float(g.norm()) for g in ref[key]) > 0  # every parameter has a gradient
    assert max(_rel(a, b) for a, b in zip(got["params"], ref["params"])) < RTOL
    # the update itself, to what float32 parameters resolve: an update of ~1e-5 of p (clipping on) spans ~100
    # spacings of p, so a last-bit difference of the lr (itself within RTOL) flips roundings by one spacing
    assert max(_update_excess(a, b, s) for a, b, s in zip(got["params"], ref["params"], start)) < 10 * RTOL
    assert _rel(got["grad_sq"], ref["grad_sq"]) < RTOL
    assert abs(got["lr"] - ref["lr"]) <= RTOL * ref["lr"]
    # policy/step_kl over the global batch: KL is quadratic in the update, whose own agreement is 10 RTOL, and is
    # a mean of d * d/2 over float32 log-prob differences d (rounding ~2e-7 each: 1e-10 where d ~ 5e-4, the
    # smallest steps here); one rank's rows alone would be off by far more
    assert ref["step_kl"] > 1e-8 and abs(got["step_kl"] - ref["step_kl"]) <= 50 * RTOL * ref["step_kl"] + 1e-10
    assert got["n_prompts"] == ref["n_prompts"] == N  # the global prompt count, not a rank's N/2
    # ||gbar||^2 and S, V have one home, the DataParallelUpdate: the update result carries neither
    assert not {"grad_sq_norm", "snr", "S", "V"} & set(got["update_fields"]), got["update_fields"]
    if sc.need_snr:
        assert got["gks"].shape == (N,) and _rel(got["gks"], ref["gks"]) < RTOL
        for k in ("S", "V", "snr", "signal"):  # by value; the unclamped signal is what the EMA averages
            assert float(ref[k]) > 0 and abs(float(got[k]) - float(ref[k])) <= RTOL * float(ref[k]), k
        assert got["n"] == ref["n"] == N  # the N of S/(S+V/N), which the lr controller reads from the stats
        assert ref["lr"] < 0.5  # the SNR rule did set it
        # the regime: with a rank's N/2 in the factor the lr would differ beyond the tolerance
        S, V = float(ref["S"]), float(ref["V"])
        assert abs(S / (S + V / (N // 2)) / (S / (S + V / N)) - 1) > 100 * RTOL
    else:
        assert got["gks"] is None and got["S"] is None and got["n"] is None


@pytest.mark.parametrize("sc", [s for s in SCENARIOS if s.engine == "recompute"], ids=lambda s: s.name)
def test_recompute_engine_on_two_ranks_equals_the_two_pass_engine_in_one_process(worker_results, sc):
    """The reference computed another way: the two-pass engine (a norm pass, then an ordinary backward) in one
    process; the ranks' recompute step (one backward, the gradient assembled from its kept contributions) must
    give its gradient, update, per-prompt norms, S, V and learning rate."""
    got = worker_results[sc.name]
    with engines_used() as engines:
        ref = one_process_step(*_models(sc), dataclasses.replace(sc, engine="two_pass"))
    assert got["engines"] == ["RecomputeBookKeeper"] and sorted(set(engines)) == ["TwoPassBookKeeper"]
    assert max(_rel(a, b) for a, b in zip(got["grads"], ref["grads"])) < RTOL
    assert max(_rel(a, b) for a, b in zip(got["params"], ref["params"])) < RTOL
    assert _rel(got["grad_sq"], ref["grad_sq"]) < RTOL and _rel(got["gks"], ref["gks"]) < RTOL
    S, V = float(ref["S"]), float(ref["V"])
    assert abs(float(got["V"]) - V) <= RTOL * V
    # S = ||gbar||^2 - V/N is a difference of float32 sums (here S << V/N): measured against its terms' size,
    # and so are the SNR and the learning rate made from it
    scale = (abs(S) + V / N) / abs(S)
    for k in ("S", "snr", "lr"):
        assert abs(float(got[k]) - float(ref[k])) <= RTOL * scale * abs(float(ref[k])), k


@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.name)
def test_metrics_equal_one_process_with_rank_sized_micro_batches(worker_results, sc):
    got = worker_results[sc.name]["metrics"]
    ref = one_process_step(*_models(sc), sc, micro_batch_groups=sc.micro_batch_groups or N // 2)["metrics"]
    assert set(got) == set(ref)
    for k, v in ref.items():
        assert abs(got[k] - v) <= RTOL * abs(v) + 1e-9, (k, got[k], v)


def test_collectives_on_two_ranks(worker_results):
    c = worker_results["collectives"]
    assert torch.equal(c["a"], torch.full((3,), 3.0))  # 1 + 2
    assert torch.equal(c["b"], torch.ones(3))  # rank 0's gradient, zeros from rank 1
    assert c["c_is_none"]  # no rank had one: stays None, as in one process
    assert c["objects"] == ["r0", "r1", "r1"] and c["chosen"] == "run-0"
    t = c["totals"]  # rank 0: 2 x 5 mask, rank 1: 3 x 7
    assert (t.sequences, t.tokens, t.width) == (5, 31.0, 7)


def test_fsdp_generation_context_lets_ranks_run_different_numbers_of_forwards(worker_results):
    g = worker_results["generation"]
    assert g["met"] == [0, 1]  # rank 0 ran 2 forwards, rank 1 ran 3, and both reached the next collective
    assert g["inside"] == ["Parameter"] and g["after"] == ["DTensor"] and g["grad_types"] == ["DTensor"]
    with torch.no_grad():  # the gathered model is the whole model
        ref = tiny_qwen3()(input_ids=torch.arange(1, 9).view(2, 4)).logits
    assert _rel(g["logits"], ref) < RTOL


def test_fsdp_with_bf16_compute_is_close_to_the_float32_step(worker_results):
    """distributed.options.param_dtype=bfloat16: parameters all-gathered and used in bf16, gradients and the
    norms' reductions in float32. The statistics stay within a few percent of the float32 one-process step,
    and differ from it (bf16 really was used)."""
    sc = BF16_SCENARIO
    got, ref = worker_results[sc.name], one_process_step(*_models(sc), sc)
    errs = {k: abs(got[k] - float(ref[k])) / abs(float(ref[k])) for k in ("grad_sq", "S", "V", "lr")}
    assert max(errs.values()) < 0.05, errs
    assert max(errs[k] for k in ("grad_sq", "S", "V")) > 1e-6, errs
