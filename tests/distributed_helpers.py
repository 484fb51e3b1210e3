"""Shared by the multi-process tests and their torchrun worker: a fixed batch, the scenarios, one full step.

A step is what the trainer does (``oblr.trainer.Trainer.train_step``): zero_grad, the policy-gradient
accumulation, ``||gbar||^2``, S/V/SNR, the SNR learning rate, gradient clipping, an SGD step (SGD, not
AdamW, so that the parameter change is proportional to the gradient it checks), and optionally a second
clipped epoch. ``one_process_step`` is the reference; ``data_parallel_step`` the same on a rank's rows.
With activation checkpointing a scenario names its exact-norm engine (``engine``: the two-pass or the recompute
engine); ``engines_used`` records which engines the update core built, so a test can tell that one ran.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from oblr.distributed import grad_sq_norm
from oblr.snr import SNRLearningRate, snr_statistics
from oblr.update import UpdateSettings, accumulate_clipped_gradient, accumulate_policy_gradient, step_kl_sums

N, G, VOCAB = 4, 4, 61


@dataclass(frozen=True)
class Scenario:
    name: str
    mode: str  # ddp | fsdp
    baseline: str = "oblr"
    need_snr: bool = True
    aggregation: str = "seq_sum_const"
    max_len: int | None = None
    micro_batch_groups: int = 0
    kl_coef: float = 0.0
    epochs: int = 1
    grad_clip: float = 0.0
    bucket_mb: float = 25.0
    checkpointing: bool = False  # model.activation_checkpointing: the checkpointed norm engine below
    engine: str = "two_pass"  # algorithm.checkpointed_engine: two_pass | recompute (with checkpointing only)
    logit_chunk: int = 0  # model.logit_chunk_tokens: the output layer in chunks
    steps: int = 1  # steps on the same batch and model, each with a fresh optimizer; the last one is compared

    def __post_init__(self):
        if self.engine != "two_pass" and not self.checkpointing:
            raise ValueError(f"scenario {self.name}: engine {self.engine!r} is a checkpointed engine; set checkpointing")

    def policy(self, model):
        """``model`` with this scenario's activation checkpointing (non-reentrant) switched on if asked."""
        if self.checkpointing:
            from oblr.models import enable_activation_checkpointing

            enable_activation_checkpointing(model)
        return model

    def settings(self) -> UpdateSettings:
        return UpdateSettings(baseline=self.baseline, aggregation=self.aggregation, max_len=self.max_len,
                              need_snr=self.need_snr, micro_batch_groups=self.micro_batch_groups,
                              kl_coef=self.kl_coef, logit_chunk_tokens=self.logit_chunk,
                              checkpointed_engine=self.engine)


#: the engine class the update core builds for a checkpointed scenario's ``engine``
ENGINE_CLASSES = {"two_pass": "TwoPassBookKeeper", "recompute": "RecomputeBookKeeper"}


@contextmanager
def engines_used():
    """The class names of the books :func:`oblr.update.accumulate_policy_gradient` builds inside (a list)."""
    import oblr.update

    made, orig = [], oblr.update.make_book

    def spy(*a, **kw):
        book = orig(*a, **kw)
        made.append(type(book).__name__)
        return book

    oblr.update.make_book = spy
    try:
        yield made
    finally:
        oblr.update.make_book = orig


# fsdp first: the first BookKeeper of the worker process then verifies the RMSNorm rule on DTensor weights
SCENARIOS = [
    Scenario("fsdp-oblr-token_mean", "fsdp", aggregation="token_mean", bucket_mb=0.002),
    Scenario("fsdp-oblr-microbatch-kl-2epochs", "fsdp", max_len=12, micro_batch_groups=1, kl_coef=0.1, epochs=2,
             grad_clip=0.05),
    Scenario("fsdp-grpo-plain", "fsdp", baseline="grpo", need_snr=False, aggregation="seq_mean"),
    Scenario("fsdp-oblr-checkpointing-microbatch-kl", "fsdp", max_len=12, micro_batch_groups=1, kl_coef=0.1,
             grad_clip=0.05, checkpointing=True),
    Scenario("fsdp-oblr-checkpointing-chunked-logits-kl", "fsdp", max_len=12, kl_coef=0.1, checkpointing=True,
             logit_chunk=3),
    # the recompute engine: its one backward's contributions, the gradient through fsdp's grad_sink
    Scenario("fsdp-oblr-recompute-microbatch-kl-2steps", "fsdp", max_len=12, micro_batch_groups=1, kl_coef=0.1,
             grad_clip=0.05, checkpointing=True, engine="recompute", steps=2),  # FSDP2 ran no ordinary backward
    Scenario("fsdp-oblr-recompute-chunked-logits-kl", "fsdp", max_len=12, kl_coef=0.1, checkpointing=True,
             engine="recompute", logit_chunk=3),
    Scenario("ddp-oblr-token_mean", "ddp", aggregation="token_mean", bucket_mb=0.002),
    Scenario("ddp-oblr-microbatch-kl-2epochs", "ddp", max_len=12, micro_batch_groups=1, kl_coef=0.1, epochs=2,
             grad_clip=0.05),
    Scenario("ddp-grpo-plain", "ddp", baseline="grpo", need_snr=False, aggregation="seq_mean"),
    Scenario("ddp-oblr-checkpointing-microbatch-kl", "ddp", max_len=12, micro_batch_groups=1, kl_coef=0.1,
             checkpointing=True),
    Scenario("ddp-oblr-recompute-microbatch-kl", "ddp", max_len=12, micro_batch_groups=1, kl_coef=0.1,
             grad_clip=0.05, checkpointing=True, engine="recompute", bucket_mb=0.002),
    Scenario("ddp-grpo-chunked-logits", "ddp", baseline="grpo", need_snr=False, logit_chunk=4),
]

# fsdp with bf16 compute (distributed.options.param_dtype=bfloat16, float32 reductions): close to the float32
# step, not equal, so it is compared loosely in its own test
BF16_SCENARIO = Scenario("fsdp-oblr-bf16-compute", "fsdp", aggregation="token_mean")


def fixed_batch():
    """N*G rows ``[pad prompt | response pad]`` with different prompt and response lengths; rewards vary
    within every group (so w_i, advantages, S and V are all non-zero)."""
    gen = torch.Generator().manual_seed(3)
    B, P, L = N * G, 5, 9
    prompt_lens = torch.randint(2, P + 1, (B,), generator=gen)
    resp_lens = torch.randint(2, L + 1, (B,), generator=gen)
    cols = torch.arange(P + L)
    am = ((cols[None] >= P - prompt_lens[:, None]) & (cols[None] < P + resp_lens[:, None])).long()
    rm = am * (cols[None] >= P).long()
    ids = torch.randint(1, VOCAB, (B, P + L), generator=gen) * am
    batch = SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm, response_lengths=resp_lens)
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.2], [0.3, 0.0, 0.0, 1.0], [1.0, 0.6, 0.0, 0.9]])
    return batch, rewards


def _finish(params, opt, lr_ctrl, grad_sq, stats, sc: Scenario, clip):
    if lr_ctrl is not None:
        lr_ctrl.step(stats.S, stats.V, stats.n)  # the step's own N, as the trainer's controller gets it
    grads = [p.grad.detach().clone() for p in params]
    if sc.grad_clip > 0:
        clip(params, sc.grad_clip, grad_sq)
    opt.step()
    return grads


def _stat_values(st, n_prompts: int) -> dict:
    """The step's statistics as values to compare: S, V, SNR, the unclamped signal, the N they were made
    with (the stats' own and the step's prompt count); None when the step needs no SNR."""
    if st is None:
        return {"S": None, "V": None, "snr": None, "signal": None, "n": None, "n_prompts": n_prompts}
    return {"S": st.S, "V": st.V, "snr": st.snr, "signal": st.signal, "n": st.n, "n_prompts": n_prompts}


def _torch_clip(params, max_norm, grad_sq):
    torch.nn.utils.clip_grad_norm_(params, max_norm)


def one_process_step(model, ref_model, sc: Scenario, micro_batch_groups: int | None = None) -> dict:
    """The reference: the whole batch in one process (``micro_batch_groups`` overrides the scenario's);
    ``sc.steps`` steps, the last one's results."""
    for _ in range(sc.steps):
        out = _one_process_step(model, ref_model, sc, micro_batch_groups)
    return out


def data_parallel_step(model, ref_model, sc: Scenario, parallel, rank: int, world: int) -> dict:
    """The same step on this rank's rows (``model``/``ref_model`` prepared by ``parallel``); ``sc.steps`` steps,
    the last one's results."""
    for _ in range(sc.steps):
        out = _data_parallel_step(model, ref_model, sc, parallel, rank, world)
    return out


def _one_process_step(model, ref_model, sc: Scenario, micro_batch_groups: int | None = None) -> dict:
    batch, rewards = fixed_batch()
    settings = sc.settings()
    if micro_batch_groups is not None:
        settings = dataclasses.replace(settings, micro_batch_groups=micro_batch_groups)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.5)
    lr_ctrl = SNRLearningRate(opt, eta_max=0.5) if sc.need_snr else None
    opt.zero_grad(set_to_none=True)
    res = accumulate_policy_gradient(model, batch, rewards, settings, ref_model=ref_model)
    grad_sq = grad_sq_norm(params)  # float64 accumulation of float32 per-parameter sums
    st = None
    if res.per_prompt_sq_norms is not None:
        st = snr_statistics(res.per_prompt_sq_norms.double(), grad_sq, N)
    grads = _finish(params, opt, lr_ctrl, grad_sq, st, sc, _torch_clip)
    out = {"grads": grads, "grad_sq": grad_sq, **_stat_values(st, N), "lr": opt.param_groups[0]["lr"],
           "gks": res.per_prompt_sq_norms, "metrics": {k: float(v) for k, v in res.metrics.items()}}
    if sc.epochs > 1:
        opt.zero_grad(set_to_none=True)
        accumulate_clipped_gradient(model, batch, res, settings)
        out["grads2"] = [p.grad.detach().clone() for p in params]
        opt.step()
    out["params"] = [p.detach().clone() for p in params]
    kl = step_kl_sums(model, batch, res.old_logprobs, settings, G)  # the policy's change over the whole step
    out["step_kl"] = float(kl[0] / kl[1])
    return out


def _data_parallel_step(model, ref_model, sc: Scenario, parallel, rank: int, world: int) -> dict:
    from oblr.distributed import (
        clip_grads_,
        data_parallel_clipped_gradient,
        data_parallel_gradient,
        data_parallel_step_kl,
    )
    from oblr.distributed.layout import prompt_slice, row_slice, shard_rows

    batch, rewards = fixed_batch()
    batch = shard_rows(batch, row_slice(N, G, world, rank))
    rewards = rewards[prompt_slice(N, world, rank)]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.5)
    lr_ctrl = SNRLearningRate(opt, eta_max=0.5) if sc.need_snr else None
    opt.zero_grad(set_to_none=True)
    up = data_parallel_gradient(model, batch, rewards, sc.settings(), parallel, ref_model=ref_model)
    st = up.snr
    grads = _finish(params, opt, lr_ctrl, up.grad_sq, st, sc, clip_grads_)
    out = {"grads": grads, "grad_sq": up.grad_sq, **_stat_values(st, up.n_prompts), "lr": opt.param_groups[0]["lr"],
           "gks": up.update.per_prompt_sq_norms, "metrics": {k: float(v) for k, v in up.update.metrics.items()},
           # what the update result carries: the rank's rows' fields only, no step statistics
           "update_fields": sorted(f.name for f in dataclasses.fields(up.update))}
    if sc.epochs > 1:
        opt.zero_grad(set_to_none=True)
        data_parallel_clipped_gradient(model, batch, up.update, sc.settings(), parallel, up.totals)
        out["grads2"] = [p.grad.detach().clone() for p in params]
        opt.step()
    out["params"] = [p.detach().clone() for p in params]
    out["step_kl"] = data_parallel_step_kl(model, batch, up.update.old_logprobs, sc.settings(), G)
    return out
