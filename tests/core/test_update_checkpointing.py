"""oblr.update with activation checkpointing on: both checkpointed engines (two-pass, recompute) give the same
w_i (through the advantages), per-prompt norms, .grad and S, V as the loop reference, whole batch and per
micro-batch, with and without the KL term, full fine-tuning and LoRA, whole and chunked logits."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import make_batch

from oblr.distributed.step import step_statistics
from oblr.update import UpdateSettings, accumulate_policy_gradient

N, G = 3, 4
MAX_LEN = 7
RTOL = 1e-5


def _batch(vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(2, 5, (N,), generator=gen).repeat_interleave(G).tolist()
    resps = torch.randint(1, MAX_LEN + 1, (N * G,), generator=gen).tolist()
    ids, am, rm = make_batch(vocab, prompts, resps, seed=seed)
    batch = SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm, response_lengths=rm.sum(-1))
    rewards = (torch.rand(N, G, generator=gen) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    return batch, rewards


def _run(model, batch, rewards, ref, **kw):
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    settings = UpdateSettings(**{"aggregation": "seq_sum_const", "max_len": MAX_LEN, "baseline": "oblr", **kw})
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref)
    # the step's ||gbar||^2 and S, V as oblr train's one-process step forms them
    gks = res.per_prompt_sq_norms
    stats = None if gks is None else step_statistics(params, gks, float64=False)
    return res, [p.grad.clone() for p in params], stats


def _rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _same(a, b):
    (ra, ga, (qa, sa)), (rb, gb, (qb, sb)) = a, b
    assert _rel(ra.advantages, rb.advantages) < RTOL  # the advantages carry w_i
    assert _rel(ra.estimate.weights, rb.estimate.weights) < RTOL
    assert _rel(ra.per_prompt_sq_norms, rb.per_prompt_sq_norms) < RTOL
    assert max(_rel(x, y) for x, y in zip(ga, gb)) < RTOL
    assert _rel(qa, qb) < RTOL
    assert _rel(sa.V, sb.V) < RTOL
    # S = ||gbar||^2 - V/N is a difference of float32 sums: measured against the size of its terms
    assert float((sa.S - sb.S).abs() / (sb.S.abs() + sb.V / sb.n)) < RTOL


def _models(lora: bool):
    model = tiny_qwen3(seed=3)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"],
                                                           init_lora_weights=False))
    ref = copy.deepcopy(tiny_qwen3(seed=4)).eval().requires_grad_(False)
    return model.train(), ref


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("kl_coef", [0.0, 0.2])
@pytest.mark.parametrize("micro", [0, 1])
def test_checkpointed_update_equals_the_loop_and_the_unchecked_step(lora, kl_coef, micro):
    model, ref = _models(lora)
    batch, rewards = _batch(model.config.vocab_size)
    plain = _run(model, batch, rewards, ref, kl_coef=kl_coef, micro_batch_groups=micro)  # checkpointing off
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loop = _run(model, batch, rewards, ref, kl_coef=kl_coef, micro_batch_groups=micro, norms_method="loop")
    for engine in ("two_pass", "recompute"):
        got = _run(model, batch, rewards, ref, kl_coef=kl_coef, micro_batch_groups=micro, checkpointed_engine=engine)
        _same(got, loop)
        _same(got, plain)
        assert torch.equal(got[0].old_logprobs, plain[0].old_logprobs)


@pytest.mark.parametrize("engine", ["two_pass", "recompute"])
def test_checkpointed_update_without_snr_and_without_assembly(engine):
    model, ref = _models(False)
    batch, rewards = _batch(model.config.vocab_size)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loop = _run(model, batch, rewards, ref, norms_method="loop")
    res, g, stats = _run(model, batch, rewards, ref, need_snr=False, checkpointed_engine=engine)  # weights only
    assert res.per_prompt_sq_norms is None and stats is None
    assert _rel(res.advantages, loop[0].advantages) < RTOL
    assert max(_rel(x, y) for x, y in zip(g, loop[1])) < RTOL
    for p in model.parameters():
        p.grad = None
    settings = UpdateSettings(aggregation="seq_sum_const", max_len=MAX_LEN, baseline="oblr", assemble_grad=False,
                              checkpointed_engine=engine)
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref)
    assert all(p.grad is None for p in model.parameters())
    assert _rel(res.per_prompt_sq_norms, loop[0].per_prompt_sq_norms) < RTOL


@pytest.mark.parametrize("engine", ["two_pass", "recompute"])
def test_a_step_that_fails_after_the_retained_backward_leaves_no_hooks(engine, monkeypatch):
    """With KL the first backward keeps the graph (and the two-pass engine its Taps) for the second one; an
    error in between (here the estimator) must not leave hooks on the model: the next step is exact."""
    import oblr.update as update

    model, ref = _models(False)
    batch, rewards = _batch(model.config.vocab_size)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    want = _run(model, batch, rewards, ref, kl_coef=0.2, micro_batch_groups=1, checkpointed_engine=engine)
    hooks = sum(len(m._forward_hooks) for m in model.modules())  # checkpointing's own (the embedding's) included
    real = update.estimate

    def fail_second(*a, **k):  # the second micro-batch's estimator raises
        fail_second.calls += 1
        if fail_second.calls == 2:
            raise RuntimeError("injected")
        return real(*a, **k)

    fail_second.calls = 0
    monkeypatch.setattr(update, "estimate", fail_second)
    with pytest.raises(RuntimeError, match="injected"):
        _run(model, batch, rewards, ref, kl_coef=0.2, micro_batch_groups=1, checkpointed_engine=engine)
    assert sum(len(m._forward_hooks) for m in model.modules()) == hooks
    monkeypatch.setattr(update, "estimate", real)
    _same(_run(model, batch, rewards, ref, kl_coef=0.2, micro_batch_groups=1, checkpointed_engine=engine), want)


@pytest.mark.parametrize("tied,lora,kl_coef,micro,sampling", [
    (True, False, 0.0, 0, (1.0, 1.0)),
    (True, False, 0.2, 1, (0.7, 1.0)),   # KL's second norm pass, micro-batches, temperature
    (False, False, 0.0, 1, (1.0, 1.0)),  # untied output layer
    (True, True, 0.2, 0, (1.0, 1.0)),    # LoRA: the output layer is frozen
])
def test_chunked_output_layer_equals_the_loop_and_the_whole_logits(tied, lora, kl_coef, micro, sampling):
    """model.logit_chunk_tokens: the output layer in chunks of 3 positions (batches of 6-11 tokens, so 2-4
    chunks per row, the last one short) gives the loop reference's numbers and the unchunked step's, and the
    same log-probs, entropy and loss."""
    temperature, top_p = sampling
    model, ref = _models(lora)
    if not tied:
        model = tiny_qwen3(seed=3, tied=False).train()
    batch, rewards = _batch(model.config.vocab_size)
    kw = dict(kl_coef=kl_coef, micro_batch_groups=micro, temperature=temperature, top_p=top_p)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loop = _run(model, batch, rewards, ref, norms_method="loop", **kw)
    whole = _run(model, batch, rewards, ref, **kw)
    chunked = _run(model, batch, rewards, ref, logit_chunk_tokens=3, **kw)
    _same(chunked, loop)
    _same(chunked, whole)
    _same(_run(model, batch, rewards, ref, logit_chunk_tokens=3, checkpointed_engine="recompute", **kw), loop)
    a, b = chunked[0], whole[0]
    assert _rel(a.old_logprobs, b.old_logprobs) < RTOL
    for key in ("train/entropy", "optim/loss") + (("actor/kl",) if kl_coef else ()):
        assert _rel(a.metrics[key], b.metrics[key]) < RTOL, key


def test_chunked_output_layer_on_the_plain_path_and_refusals():
    """GRPO (no exact norms) chunks without checkpointing; the one-pass engine and logit-based weights refuse."""
    model, ref = _models(False)
    model.train()
    batch, rewards = _batch(model.config.vocab_size)
    whole = _run(model, batch, rewards, ref, baseline="grpo", need_snr=False)
    chunked = _run(model, batch, rewards, ref, baseline="grpo", need_snr=False, logit_chunk_tokens=4)
    assert max(_rel(x, y) for x, y in zip(chunked[1], whole[1])) < RTOL
    assert _rel(chunked[0].metrics["train/entropy"], whole[0].metrics["train/entropy"]) < RTOL
    with pytest.raises(ValueError, match="needs activation checkpointing"):
        _run(model, batch, rewards, ref, logit_chunk_tokens=4)  # exact norms, one-pass engine
    with pytest.raises(ValueError, match="weighs outputs by their logits"):
        _run(model, batch, rewards, ref, baseline="otb_proxy", need_snr=False, logit_chunk_tokens=4)
