"""OBLRGRPOTrainer on 2 processes (accelerate launch, gloo, CPU): S, V, the SNR and the lr are the same on both
ranks and equal to a one-sequence-at-a-time single-process computation on the same global batch; with the kl
schedule, the KL of a step and the next lr are the same on both ranks and equal to a float64
one-sequence-at-a-time computation over the global batch."""

import pytest
import torch

pytest.importorskip("trl")

from oblr.estimators import compute_advantages  # noqa: E402
from oblr.models import load_model_and_tokenizer  # noqa: E402
from oblr.snr import SNRLearningRate, snr_statistics  # noqa: E402

from .trl_helpers import kl_rule_lrs, one_at_a_time_grads, one_at_a_time_step_kl, rel_err  # noqa: E402

G, LR, EMA = 4, 1e-3, 0.5  # as in trl_two_process.py / make_trainer


def test_two_processes_match_one_process_on_the_global_batch(two_process_run, trl_model):
    files = [two_process_run.out / f"rank{r}.pt" for r in (0, 1)]
    assert all(f.exists() for f in files), two_process_run.output()
    r0, r1 = (torch.load(f, weights_only=False) for f in files)
    assert r0["world"] == r1["world"] == 2
    assert r0["refused"].startswith("OBLRGRPOConfig: per_device_train_batch_size=2 is not supported")
    log0, log1 = r0["logs"][0], r1["logs"][0]
    for key in ("oblr/S", "oblr/V", "oblr/snr", "oblr/signal", "oblr/lr", "oblr/grad_norm", "learning_rate"):
        assert log0[key] == log1[key], key  # identical on both ranks (same reductions)
    assert torch.equal(r0["grads"][0], r1["grads"][0])
    # the single-process reference on the global batch (rank 0's prompts first), from the initial weights
    model = load_model_and_tokenizer(trl_model)[0]
    s_rows, c_rows, rewards = [], [], []
    for r in (r0, r1):
        b = r["rounds"][0]
        assert b["rewards"].shape == (2, G)  # whole groups on each process
        s_rows.append(one_at_a_time_grads(model, b["input_ids"], b["attention_mask"], b["response_mask"], 0.9))
        c_rows.append(b["seq_scale"].double())
        rewards.append(b["rewards"].double())
    s, c, rewards = torch.cat(s_rows), torch.cat(c_rows), torch.cat(rewards)
    N = rewards.shape[0]
    w = (s.pow(2).sum(-1) * c * c).view(N, G)
    adv = compute_advantages("oblr", rewards, weights=w)
    contrib = -adv.reshape(-1, 1) * c[:, None] * s           # [B, P] per-sequence gradient terms
    gbar = contrib.sum(0)                                      # the full-batch gradient
    assert rel_err(r0["grads"][0], gbar) < 1e-4
    g_k = N * contrib.view(N, G, -1).sum(1)                    # per-prompt estimates, mean_k g_k = gbar
    st = snr_statistics(g_k.pow(2).sum(-1), gbar.pow(2).sum())
    assert float(st.S) > 0 and float(st.V) > 0                 # the varied reward gives a signal to compare
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    lr = SNRLearningRate(opt, eta_max=LR, ema=EMA).step(st.signal, st.V, N)[0]
    for key, ref in (("oblr/S", st.S), ("oblr/V", st.V), ("oblr/snr", st.snr), ("oblr/lr", lr)):
        assert log0[key] == pytest.approx(float(ref), rel=1e-4), key


def test_kl_schedule_on_two_processes_measures_the_global_batchs_kl(two_process_run, trl_model):
    files = [two_process_run.out / f"kl_rank{r}.pt" for r in (0, 1)]
    assert all(f.exists() for f in files), two_process_run.output()
    r0, r1 = (torch.load(f, weights_only=False) for f in files)
    rows0, rows1 = ([r for r in x["logs"] if "oblr/lr" in r] for x in (r0, r1))
    assert len(rows0) == len(rows1) == 2
    for a, b in zip(rows0, rows1):  # every rank reads the same KL, so sets the same lr
        assert a["oblr/step_kl"] == b["oblr/step_kl"] and a["oblr/lr"] == b["oblr/lr"]
    assert all(torch.equal(r0["after"][k], r1["after"][k]) for k in r0["after"])
    # step 1's KL over the global batch (both ranks' rows), from the initial weights to those after step 1
    before = load_model_and_tokenizer(trl_model)[0].double()
    after = load_model_and_tokenizer(trl_model)[0]
    after.load_state_dict(r0["after"])
    after.double()
    kl = tokens = 0.0
    for r in (r0, r1):
        b = r["round"]
        assert b["rewards"].shape == (2, G)
        k, t = one_at_a_time_step_kl(before, after, b["input_ids"], b["attention_mask"], b["response_mask"])
        kl, tokens = kl + k, tokens + t
    assert rows0[0]["oblr/step_kl"] == pytest.approx(kl / tokens, rel=2e-3)
    N = 2 * 2  # prompts of the generation batch over both processes: the default target's N
    assert r0["target"] == pytest.approx(1.5e-3 * N / 128)
    assert [r["oblr/lr"] for r in rows0] == pytest.approx(
        kl_rule_lrs([r["oblr/step_kl"] for r in rows0], 0.05, r0["target"]), rel=1e-6)
