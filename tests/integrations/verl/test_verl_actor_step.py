"""One OBLR-PO step driven through verl's seams equals oblr's native step (CPU, float32, within 1e-5).

verl 0.9.1's engine workers need CUDA, so the step is driven as its worker drives it, with verl's own
functions (tests/verl_step_helpers.py): the norm pass on the actor, ``compute_advantage`` with the registered
estimator, ``ppo_loss`` with the registered loss over two micro-batches, ``FSDPEngine.optimizer_step`` with
oblr's learning rate in front. Rollouts are sampled at temperature 0.8 and their rewards vary. Checked:
w_i, advantages, the gradient, S, V, the lr, and the parameters after two steps (``snr``, ``snr_adam``,
``auto``, ``kl``; ``auto`` measures from its second step; ``kl`` measures each step's KL after the engine's
update and sets the next lr from it). The two-rank tests run the same on 2 gloo processes, each with whole
groups, against the one-process step (``snr``, and ``kl``: the KL over both ranks' rows)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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


#: kl's target in the step-equality test: the step's KL is compared at TOL, which needs a step large against
#: float32's rounding of the weights on the two paths (1e-7 of them); with the default 1.5e-3 x N / 128 the second
#: step moves the policy by 2.5e-5 nats per token and the two paths' KLs differ by 1.1e-5 of it, at 3e-3 x N / 128
#: by less than TOL. The default target's N is checked on its own below.
KL_TARGET = 3e-3 * h.N / 128


@pytest.mark.parametrize("schedule", ["snr", "snr_adam", "auto", "kl"])
def test_verl_step_equals_oblrs_native_step(schedule):
    (m1, o1, c1), (m2, eng, lr2) = h.pair(schedule, **({"target": KL_TARGET} if schedule == "kl" else {}))
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
        if schedule == "kl":  # the lr from the last step's KL (none before step 1: the probe)
            assert ver["lr"] == pytest.approx(nat["lr"], rel=TOL)
            assert nat["step_kl"] > 0 and ver["step_kl"] == pytest.approx(nat["step_kl"], rel=TOL)
            assert lr2.controller.lr == pytest.approx(c1.lr, rel=TOL)  # the next step's lr
            assert lr2.controller.target == c1.target == KL_TARGET
        else:
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
    with pytest.raises(ValueError, match="does not use S and V or the step's KL"):
        ActorLearningRate(opt, "cosine", lr=h.LR)
    kl_opt = torch.optim.AdamW(model.parameters(), lr=h.LR)
    kl = ActorLearningRate(kl_opt, "kl", lr=h.LR)  # kl: no silent constant lr without the norm pass's rows
    with pytest.raises(ValueError, match="needs the norm pass's rows"):
        kl.set_pending(1.0, 4)
    lr = ActorLearningRate(opt, "snr", lr=h.LR)
    with pytest.raises(ValueError, match=r"no meta_info\['oblr_norm_pass'\]"):
        lr.pending_from(h.data_proto(h.sample_rollouts(model, seed=5)))
    assert lr.before_step() is None  # nothing pending: the lr is left alone
    assert opt.param_groups[0]["lr"] == h.LR


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(tmp_path, ro, native_grads, split: list[int] | None = None, schedule: str = "snr") -> list[dict]:
    """tests/verl_dp_worker.py on 2 gloo processes (rank r takes ``split[r]`` whole groups; default equal
    halves); each rank's JSON result."""
    torch.save(vars(ro), tmp_path / "rollouts.pt")
    torch.save(native_grads, tmp_path / "native_grads.pt")
    tests = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    port = _free_port()
    extra = [",".join(map(str, split)) if split else "-", schedule]
    procs = [subprocess.Popen([sys.executable, str(tests / "verl_dp_worker.py"), str(r), "2", str(port),
                               str(tmp_path / f"rank{r}.json"), str(tmp_path / "rollouts.pt"),
                               str(tmp_path / "native_grads.pt"), *extra], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_gloo_ranks_with_whole_groups_equal_the_one_process_step(tmp_path):
    """2 processes (gloo), each with 2 whole groups: the same w_i (its rows), S, V and lr on both ranks, equal
    to the one-process step of the same 4 groups; the averaged gradient equals the one-process gradient."""
    (m1, o1, c1), _ = h.pair("snr")
    ro = h.sample_rollouts(m1, seed=21)
    nat = h.native_step(m1, o1, c1, ro)
    ranks = _two_ranks(tmp_path, ro, nat["grads"])
    half = h.N * h.G // 2
    for r, out in enumerate(ranks):
        assert h.rel(torch.tensor(out["w"]), nat["w"][r * half:(r + 1) * half]) < TOL
        assert h.rel(torch.tensor(out["adv"]), nat["adv"][r * half:(r + 1) * half]) < TOL
        assert out["grad_rel_to_native"] < TOL
        assert_stats_close(out, nat)
        for k in ("S", "V", "lr"):
            assert out[k] == ranks[0][k]  # identical on every rank


def test_the_kl_default_targets_n_is_the_norm_pass_prompt_count():
    """No target given: verl's kl takes the default target of the norm pass's prompts (oblr train's
    rollout.prompts_per_step), 1.5e-3 x N / 128 with AdamW, 3e-3 with SGD, set when the norm pass's sums arrive."""
    from oblr.kl_rate import default_target

    for opt, want in ((torch.optim.AdamW, 1.5e-3 * 12 / 128), (torch.optim.SGD, 3e-3)):
        lr = ActorLearningRate(opt(h.initial_model().parameters(), lr=h.LR), "kl", lr=h.LR)
        lr.set_pending(1.0, 12, step_kl=object())  # the rows are only kept here, measured after a step
        assert lr.controller.target == pytest.approx(want, rel=1e-15) == default_target(12, opt is torch.optim.AdamW)


def test_two_gloo_ranks_measure_the_kl_schedules_step_kl_over_the_global_batch(tmp_path):
    """kl on 2 processes (gloo), each with 2 whole groups: the step's KL is the one-process step's KL on the same
    4 groups (the sums added over ranks), identical on both ranks, and so is the next lr it sets."""
    (m1, o1, c1), _ = h.pair("kl")
    ro = h.sample_rollouts(m1, seed=22)
    nat = h.native_step(m1, o1, c1, ro)
    ranks = _two_ranks(tmp_path, ro, nat["grads"], schedule="kl")
    assert nat["step_kl"] > 0
    for out in ranks:
        assert out["grad_rel_to_native"] < TOL
        assert out["step_kl"] == pytest.approx(nat["step_kl"], rel=TOL)
        assert out["next_lr"] == pytest.approx(c1.lr, rel=TOL)
        assert out["step_kl"] == ranks[0]["step_kl"] and out["next_lr"] == ranks[0]["next_lr"]


# --- tool output inside a response (zeros inside the response mask); ranks with different prompt counts ---

def _reference_step(model, ro) -> dict:
    """The step written from its definition on per-row autograd scores (tests/verl_step_helpers.per_row_scores,
    no oblr code), the response mask deciding which tokens a row's score sums: w_i = c_i^2 ||s_i||^2 with
    c = 1/(N G R_MAX), the leave-one-out baseline weighted by w, the gradient -sum_i A_i c_i s_i, g_k = N times
    prompt k's part of it, V = (sum_k ||g_k||^2 - N ||gbar||^2)/(N - 1), S = ||gbar||^2 - V/N, lr = LR S/(S + V/N)."""
    n, g = ro.rewards.shape
    ids = torch.cat([ro.prompts, ro.responses], 1)
    am = torch.cat([ro.prompt_mask, getattr(ro, "response_attention", ro.response_mask)], 1)
    rm = torch.cat([torch.zeros_like(ro.prompt_mask), ro.response_mask], 1)
    s = h.per_row_scores(model, ids, am, rm)
    c = 1.0 / (n * g * h.R_MAX)
    w = c * c * s.pow(2).sum(-1)
    r = ro.rewards.double().reshape(-1)
    adv = torch.empty_like(r)
    for k in range(n):
        rows = range(k * g, (k + 1) * g)
        for i in rows:
            others = [j for j in rows if j != i]
            adv[i] = r[i] - sum(w[j] * r[j] for j in others) / sum(w[j] for j in others)
    rows_grad = -(adv * c)[:, None] * s
    gbar = rows_grad.sum(0)
    gk = n * rows_grad.view(n, g, -1).sum(1)
    V = float((gk.pow(2).sum() - n * gbar.pow(2).sum()) / (n - 1))
    S = float(gbar.pow(2).sum()) - V / n
    return {"w": w, "adv": adv, "grad": gbar, "S": S, "V": V, "n": n,
            "lr": h.LR * max(S, 0.0) / (max(S, 0.0) + V / n), "scores": s}


def test_tool_output_inside_responses_stays_out_of_w_the_advantages_and_the_gradient():
    """Responses with tool output inside them (attended, response mask 0): the norm pass's w_i and advantages,
    the gradient of verl's loss, S, V and the lr equal the reference built on the response mask; a reference
    that scored the attention mask's tail instead differs beyond the tolerance on the rows with tool output."""
    (m1, _, _), (m2, eng, lr2) = h.pair("snr")
    ro = h.with_tool_output(h.sample_rollouts(m1, seed=38))
    holes = (ro.response_attention - ro.response_mask).sum(-1) > 0
    assert 3 <= int(holes.sum()) < h.N * h.G and (ro.response_mask.sum(-1) > 0).all()
    ref = _reference_step(m1, ro)
    tail = _reference_step(m1, SimpleNamespace(**{**vars(ro), "response_mask": ro.response_attention}))
    assert all(abs(a / b - 1) > 1e-3 for a, b in zip(tail["w"][holes], ref["w"][holes]))  # the regime
    assert torch.equal(tail["w"][~holes], ref["w"][~holes])
    perm = torch.randperm(h.N * h.G, generator=torch.Generator().manual_seed(3))
    data = h.data_proto(ro, perm)
    assert not torch.equal(data.batch["response_mask"], data.batch["attention_mask"][:, -h.R_MAX:])
    ver = h.verl_step(m2, eng, lr2, data)
    assert h.rel(ver["w"], ref["w"][perm].float()) < TOL
    assert h.rel(ver["norm_pass_adv"], ref["adv"][perm].float()) < TOL
    assert h.rel(ver["adv"], ref["adv"][perm].float()) < TOL
    assert h.rel(torch.cat([x.reshape(-1).double() for x in ver["grads"]]), ref["grad"]) < TOL
    assert ref["S"] > 0 and ref["V"] > 0
    assert_stats_close(ver, ref)


def test_two_gloo_ranks_holding_1_and_3_prompts_equal_the_one_process_step(tmp_path):
    """Rank 0 holds 1 group, rank 1 holds 3 (verl's dispatch does not promise equal shares of prompts): each
    rank's w_i and advantages, the averaged gradient, S, V and lr equal the one-process step on the 4 groups,
    and S, V, lr are identical on both ranks (N = 4 is the global count; either rank's own count, 1 or 3, or
    twice it would scale c_i and N wrongly)."""
    (m1, o1, c1), _ = h.pair("snr")
    ro = h.sample_rollouts(m1, seed=21)
    nat = h.native_step(m1, o1, c1, ro)
    ranks = _two_ranks(tmp_path, ro, nat["grads"], split=[1, 3])
    bounds = [(0, h.G), (h.G, h.N * h.G)]
    for (a, b), out in zip(bounds, ranks):
        assert len(out["w"]) == b - a
        assert h.rel(torch.tensor(out["w"]), nat["w"][a:b]) < TOL
        assert h.rel(torch.tensor(out["adv"]), nat["adv"][a:b]) < TOL
        assert out["grad_rel_to_native"] < TOL
        assert out["n"] == h.N
        assert_stats_close(out, nat)
        for k in ("S", "V", "lr"):
            assert out[k] == ranks[0][k]


@pytest.mark.parametrize("micro_rows", [h.G, h.MICRO_ROWS])
def test_the_advantages_are_estimated_once_with_the_numbers_of_a_second_estimate(micro_rows):
    """The norm pass estimates the advantages (in the update core, one call per micro-batch of groups);
    ``compute_advantage`` puts exactly those on the response tokens, and they are bit for bit what oblr's
    estimator gives when run again on verl's rows with the norm pass's w_i (what the driver computed before)."""
    from verl.trainer.ppo.ray_trainer import compute_advantage

    import oblr.estimators
    from oblr.integrations.verl.estimator import group_rows

    model = h.initial_model()
    ro = h.sample_rollouts(model, seed=12)
    perm = torch.randperm(h.N * h.G, generator=torch.Generator().manual_seed(3))
    data = h.data_proto(ro, perm)
    calls = []
    run = oblr.estimators._run
    with pytest.MonkeyPatch.context() as m:
        m.setattr(oblr.estimators, "_run", lambda *a: calls.append(a[0]) or run(*a))
        npass = norm_pass(model, data, h.actor_config(ppo_micro_batch_size_per_gpu=micro_rows), rollout_n=h.G,
                          temperature=h.TEMPERATURE)
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        data = compute_advantage(data, adv_estimator="oblr")
    assert calls == ["oblr"] * (h.N * h.G // micro_rows)  # the norm pass's micro-batches; none on the driver
    rm = data.batch["response_mask"]
    assert torch.equal(data.batch["advantages"], npass.advantages[:, None] * rm.float())
    rows = group_rows(data.non_tensor_batch["uid"])
    again = oblr.estimators.estimate("oblr", data.batch["token_level_rewards"].sum(-1)[rows],
                                     weights=npass.weights[rows]).advantages
    assert torch.equal(npass.advantages[rows], again)
