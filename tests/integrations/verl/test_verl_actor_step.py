"""One OBLR-PO step driven through verl's seams equals oblr's native step (CPU, float32, within 1e-5).

verl 0.9.1's engine workers need CUDA, so the step is driven as its worker drives it, with verl's own
functions (tests/verl_step_helpers.py): the norm pass on the actor, ``compute_advantage`` with the registered
estimator, ``ppo_loss`` with the registered loss over two micro-batches, ``FSDPEngine.optimizer_step`` with
oblr's learning rate in front. Rollouts are sampled at temperature 0.8 and their rewards vary. Checked:
w_i, advantages, the gradient, S, V, the lr, and the parameters after two steps (``snr`` and ``auto``;
``auto`` measures from its second step). The two-rank test runs the same on 2 gloo processes, each with
whole groups, against the one-process step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not os.environ.get("OBLR_REQUIRE_VERL"):
    pytest.importorskip("verl", reason="verl is not installed here (pip install 'oblr[verl]': docs/verl.md)")

import verl_step_helpers as h  # noqa: E402

from oblr.integrations.verl.actor import META_KEY, ActorLearningRate, norm_pass  # noqa: E402

TOL = 1e-5


def assert_stats_close(got: dict, ref: dict) -> None:
    """V within TOL relative. S = ||gbar||^2 - V/N is a difference: its float32 rounding is relative to the
    terms it is the difference of (a 1e-7 relative change of the gradient moves S by ~1e-5 relative when
    V/N is 17 to 42 times S, as here), so S is held to TOL x (S + V/N) and the lr to TOL x eta_max."""
    scale = ref["S"] + ref["V"] / ref["n"]
    assert abs(got["V"] - ref["V"]) <= TOL * abs(ref["V"]), ("V", got["V"], ref["V"])
    assert abs(got["S"] - ref["S"]) <= TOL * scale, ("S", got["S"], ref["S"], scale)
    assert abs(got["lr"] - ref["lr"]) <= TOL * h.LR, ("lr", got["lr"], ref["lr"])


@pytest.mark.parametrize("schedule", ["snr", "auto"])
def test_verl_step_equals_oblrs_native_step(schedule):
    (m1, o1, c1), (m2, eng, lr2) = h.pair(schedule)
    for step in range(2):
        ro = h.sample_rollouts(m1, seed=10 + step)
        assert ro.rewards.std(-1).min() > 0 and len(set(ro.response_mask.sum(-1).tolist())) > 1
        perm = torch.randperm(h.N * h.G, generator=torch.Generator().manual_seed(step))  # verl may reorder rows
        data = h.data_proto(ro, perm)
        nat = h.native_step(m1, o1, c1, ro)
        ver = h.verl_step(m2, eng, lr2, data)
        assert data.meta_info[META_KEY]["n_prompts"] == h.N
        assert (nat["w"] > 0).all() and nat["w"].std() > 0
        assert h.rel(ver["w"], nat["w"][perm]) < TOL
        assert h.rel(ver["norm_pass_adv"], nat["adv"][perm]) < TOL
        assert h.rel(ver["adv"], nat["adv"][perm]) < TOL
        assert h.rel(ver["grads"], nat["grads"]) < TOL
        assert nat["S"] > 0 and nat["V"] > 0
        assert_stats_close(ver, nat)
        if schedule == "auto" and step == 1:
            assert c1.last.get("auto/skipped") == 0.0  # the second step was measured, not skipped
        assert h.rel([p.detach() for p in m2.parameters()], [p.detach() for p in m1.parameters()]) < TOL
    assert nat["lr"] != h.LR  # the schedule moved the lr


def test_norm_pass_micro_batches_do_not_change_its_results():
    model = h.initial_model()
    ro = h.sample_rollouts(model, seed=3)
    out = []
    for micro in (h.G, h.N * h.G):  # one group per micro-batch, then all four at once
        cfg = h.actor_config(ppo_micro_batch_size_per_gpu=micro)
        data = h.data_proto(ro)
        out.append(norm_pass(model, data, cfg, rollout_n=h.G, temperature=h.TEMPERATURE))
    assert h.rel(out[0].weights, out[1].weights) < TOL
    assert abs(float(out[0].gk_sq_sum) - float(out[1].gk_sq_sum)) <= TOL * float(out[1].gk_sq_sum)


def test_norm_pass_refuses_split_groups_missing_rewards_and_refused_settings():
    model = h.initial_model()
    ro = h.sample_rollouts(model, seed=4)
    data = h.data_proto(ro, torch.arange(h.N * h.G - 1))  # the last group lost a row on this rank
    with pytest.raises(ValueError, match="unequal sizes"):
        norm_pass(model, data, h.actor_config(), rollout_n=h.G)
    data = h.data_proto(ro, torch.arange(0, h.N * h.G, 2))  # rows alternate: groups of 2 or 1
    with pytest.raises(ValueError, match="unequal sizes|split over data-parallel ranks"):
        norm_pass(model, data, h.actor_config(), rollout_n=h.G)
    data = h.data_proto(ro)
    with pytest.raises(ValueError, match=r"groups of 3 rows, not rollout.n = 4: a group is split"):
        norm_pass(model, data, h.actor_config(), rollout_n=4)
    data.batch.pop("token_level_scores")
    with pytest.raises(ValueError, match="has no rewards"):
        norm_pass(model, data, h.actor_config(), rollout_n=h.G)
    cfg = h.actor_config(entropy_coeff=0.01)
    with pytest.raises(ValueError, match=r"^oblr norm pass: actor\.entropy_coeff=0.01 is not supported"):
        norm_pass(model, h.data_proto(ro), cfg, rollout_n=h.G)


def test_actor_learning_rate_refuses_schedules_without_snr_and_needs_the_norm_pass():
    model = h.initial_model()
    opt = torch.optim.AdamW(model.parameters(), lr=h.LR)
    with pytest.raises(ValueError, match="does not use S and V"):
        ActorLearningRate(opt, "cosine", lr=h.LR)
    lr = ActorLearningRate(opt, "snr", lr=h.LR)
    with pytest.raises(ValueError, match=r"no meta_info\['oblr_norm_pass'\]"):
        lr.pending_from(h.data_proto(h.sample_rollouts(model, seed=5)))
    assert lr.before_step() is None  # nothing pending: the lr is left alone
    assert opt.param_groups[0]["lr"] == h.LR


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_with_whole_groups_equal_the_one_process_step(tmp_path):
    """2 processes (gloo), each with 2 whole groups: the same w_i (its rows), S, V and lr on both ranks, equal
    to the one-process step of the same 4 groups; the averaged gradient equals the one-process gradient."""
    (m1, o1, c1), _ = h.pair("snr")
    ro = h.sample_rollouts(m1, seed=21)
    nat = h.native_step(m1, o1, c1, ro)
    torch.save(vars(ro), tmp_path / "rollouts.pt")
    torch.save(nat["grads"], tmp_path / "native_grads.pt")
    tests = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(tests / "verl_dp_worker.py"), str(r), "2", str(port),
                               str(tmp_path / f"rank{r}.json"), str(tmp_path / "rollouts.pt"),
                               str(tmp_path / "native_grads.pt")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    half = h.N * h.G // 2
    for r, out in enumerate(ranks):
        assert h.rel(torch.tensor(out["w"]), nat["w"][r * half:(r + 1) * half]) < TOL
        assert h.rel(torch.tensor(out["adv"]), nat["adv"][r * half:(r + 1) * half]) < TOL
        assert out["grad_rel_to_native"] < TOL
        assert_stats_close(out, nat)
        for k in ("S", "V", "lr"):
            assert out[k] == ranks[0][k]  # identical on every rank
