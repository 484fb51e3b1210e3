"""The update steps compared by ``step_cost.py``: same model, same batch, same OBLR-PO gradient.

Each method fills ``.grad`` of the trainable parameters for one batch (no generation) and returns the
per-prompt squared norms ``||g_k||^2`` [N] it computed (None where it cannot); the harness adds the
optimizer step and the timing. Every OBLR-PO variant computes the same numbers:

- ``w_i = c_i^2 ||s_i||^2`` (``s_i = grad l_i``, ``c_i`` the aggregation's per-sequence factor),
- advantages from the leave-one-out weighted baseline (``oblr.estimators``, method ``"oblr"``),
- ``.grad = sum_i coeff_i s_i`` with ``coeff_i = -A_i c_i`` (the gradient of the policy loss),
- ``||g_k||^2`` with ``g_k = N sum_{i in k} coeff_i s_i`` (as :func:`oblr.update.accumulate_policy_gradient`).

Methods (see docs/performance.md):

- ``grpo``: :func:`oblr.update.accumulate_policy_gradient`, baseline ``"grpo"``, no SNR (the plain path), then
  the step's ``||gbar||^2`` (:func:`oblr.distributed.step.step_statistics`, as ``oblr train``'s step; every
  method that goes through the core does the same, with S, V when SNR is on);
- ``oblr``: the same function, baseline ``"oblr"``, SNR on (book-keeping: one forward, one backward);
- ``oblr_ghost`` / ``oblr_materialize``: the same with ``norms_method="ghost"`` / ``"materialize"`` instead of
  the engine's per-parameter choice (``auto``);
- ``oblr_loop``: the same function with ``norms_method="loop"`` (the trainer's slow exact reference: one
  batched forward, one backward per sequence through the BookKeeper interface);
- ``loop``: one forward + backward per sequence (batch of one), what public reimplementations do;
- ``two_backward``: a BookKeeper pass for the norms, then a second forward + ordinary backward;
- ``torch_func``: ``vmap(grad(...))`` per-sample gradients over the sequences of each prompt;
- ``opacus``: Opacus ghost clipping hooks for ``w_i`` then a second backward (retained graph);
- ``grpo_ckpt`` / ``oblr_ckpt``: ``grpo`` / ``oblr`` with Hugging Face non-reentrant activation
  checkpointing on for the call (``oblr.models.enable_activation_checkpointing``; OBLR-PO then runs on the
  two-pass engine, :class:`oblr.gradnorm.TwoPassBookKeeper`); compare ``oblr_ckpt`` with ``grpo_ckpt``;
- ``oblr_recompute``: ``oblr_ckpt`` on the recompute engine (``algorithm.checkpointed_engine=recompute``,
  :class:`oblr.gradnorm.RecomputeBookKeeper`): one backward, no gradient pass, per-row contributions kept;
  ``oblr_recompute_chunk`` the same with the output layer in chunks;
- ``grpo_ckpt_chunk`` / ``oblr_ckpt_chunk``: the same with the output layer applied ``LOGIT_CHUNK`` positions
  at a time (``model.logit_chunk_tokens``, :func:`oblr.logprobs.chunked_response_logprobs`);
- ``oblr_auto``: ``oblr`` plus one step of the ``auto`` lr schedule (:mod:`oblr.step_scale`: buffer
  copies, three dot products, the AdamW noise gain), on a shadow AdamW over the same parameters whose lr
  it sets (the harness's optimizer keeps lr 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

try:
    from oblr.distributed.step import step_statistics
except ImportError:  # src/ from before the core's statistics moved out (op_count.py --before an older revision)
    step_statistics = None
from oblr.estimators import compute_advantages
from oblr.gradnorm import BookKeeper
from oblr.logprobs import (
    forward_logits,
    gather_logprobs,
    position_ids_from_mask,
    sequence_logprobs,
    token_logprobs,
)
from oblr.losses import policy_loss, sequence_scale
from oblr.memory_model import LORA_TARGETS  # a real-model case's LoRA targets: the default model.lora_targets
from oblr.update import UpdateSettings, accumulate_policy_gradient

AGGREGATION = "seq_sum_const"
#: positions per output-layer chunk of the ``*_chunk`` methods (``model.logit_chunk_tokens``)
LOGIT_CHUNK = 128


@dataclass(frozen=True)
class Case:
    """A random-init Qwen3-shaped model and a batch of ``N*G`` sequences of ``prompt_len + response_len`` tokens."""

    hidden: int
    layers: int
    vocab: int
    prompt_len: int
    response_len: int
    n_prompts: int
    group_size: int
    tied: bool = True
    #: prompt groups per micro-batch for grpo / oblr / two_backward (0 = the whole batch, the trainer default)
    micro_batch_groups: int = 0
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 0  # 0: hidden / heads
    intermediate: int = 0  # 0: 3 * hidden
    #: a real checkpoint instead of the random Qwen3 (anything ``model.name_or_path`` takes, e.g.
    #: ``prepared:smollm2-135m-instruct``); ``hidden``/``layers``/``vocab``/``tied`` are then read from it
    model: str = ""
    #: train LoRA adapters of this rank (alpha 2 x rank) on :data:`LORA_TARGETS` (0 = every weight)
    lora_rank: int = 0

    @property
    def name(self) -> str:
        if self.model:
            how = f"LoRA r={self.lora_rank} on {'/'.join(LORA_TARGETS)}" if self.lora_rank else "full fine-tuning"
            return (f"{self.model} ({how}); T = {self.prompt_len}+{self.response_len}; "
                    f"B = {self.n_prompts}x{self.group_size}")
        tie = "tied" if self.tied else "untied"
        mb = (f"; micro-batches of {self.micro_batch_groups * self.group_size} sequences"
              if self.micro_batch_groups else "")
        default = (self.heads, self.kv_heads, self.head_dim, self.intermediate) == (4, 2, 0, 0)
        arch = "" if default else (f"; heads {self.heads}/{self.kv_heads} of {self.head_dim or self.hidden // self.heads},"
                                   f" MLP {self.intermediate or 3 * self.hidden}")
        lora = f"; LoRA r={self.lora_rank} on {'/'.join(LORA_TARGETS)}" if self.lora_rank else ""
        return (f"hidden {self.hidden}, {self.layers} layers, vocab {self.vocab} ({tie}); "
                f"T = {self.prompt_len}+{self.response_len}; B = {self.n_prompts}x{self.group_size}{mb}{arch}{lora}")


def qwen3_config(case: Case):
    """The ``Qwen3Config`` of a case (sdpa attention); by default 4 heads, 2 KV heads, MLP 3x hidden."""
    from transformers import Qwen3Config

    if not case.head_dim and case.hidden % case.heads:
        raise ValueError(f"hidden must be a multiple of heads ({case.heads}), got {case.hidden}")
    return Qwen3Config(vocab_size=case.vocab, hidden_size=case.hidden,
                       intermediate_size=case.intermediate or 3 * case.hidden, num_hidden_layers=case.layers,
                       num_attention_heads=case.heads, num_key_value_heads=case.kv_heads,
                       head_dim=case.head_dim or case.hidden // case.heads,
                       max_position_embeddings=case.prompt_len + case.response_len,
                       tie_word_embeddings=case.tied, attn_implementation="sdpa")


def build_model(case: Case, seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """Random-init ``Qwen3ForCausalLM`` of :func:`qwen3_config` (train mode) in ``dtype`` on ``device``, or with
    ``case.model`` that checkpoint (:func:`oblr.models.load_model_and_tokenizer`); LoRA-wrapped when
    ``case.lora_rank``."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    if case.model:
        from oblr.models import load_model_and_tokenizer, wrap_lora

        model, _ = load_model_and_tokenizer(case.model, dtype=str(dtype).removeprefix("torch."), device=device)
        if case.lora_rank:
            model = wrap_lora(model, rank=case.lora_rank, alpha=2 * case.lora_rank, targets=list(LORA_TARGETS))
        return model.train()
    with torch.device(device):
        model = Qwen3ForCausalLM(qwen3_config(case))
    model = model.to(dtype)
    if case.lora_rank:
        from oblr.models import wrap_lora

        model = wrap_lora(model, rank=case.lora_rank, alpha=2 * case.lora_rank, targets=list(LORA_TARGETS))
    return model.train()


def build_batch(case: Case, seed: int = 0, vocab: int | None = None):
    """A rollout-shaped batch and rewards [N, G].

    Prompts fill the first ``prompt_len`` columns (no left padding); responses are right-padded with
    random lengths in ``[response_len/2, response_len]`` (row 0 has the full length); token ids are uniform in
    ``[1, vocab)`` (``vocab``: default ``case.vocab``; a real model's own size). Rewards are 0/1 with
    sample 0 of every group right and sample 1 wrong, so every group carries signal.
    """
    gen = torch.Generator().manual_seed(seed)
    N, G, P, L = case.n_prompts, case.group_size, case.prompt_len, case.response_len
    B, T = N * G, P + L
    lengths = torch.randint(max(1, L // 2), L + 1, (B,), generator=gen)
    lengths[0] = L
    cols = torch.arange(T)
    am = (cols[None, :] < P + lengths[:, None]).long()
    rm = am * (cols[None, :] >= P).long()
    ids = torch.randint(1, vocab or case.vocab, (B, T), generator=gen) * am
    rewards = (torch.rand(N, G, generator=gen) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    batch = SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm, response_lengths=lengths,
                            group_ids=torch.arange(N).repeat_interleave(G))
    return batch, rewards


@dataclass
class Ctx:
    model: torch.nn.Module
    batch: SimpleNamespace
    rewards: torch.Tensor  # [N, G]
    max_len: int
    micro_batch_groups: int = 0

    @property
    def scale(self) -> torch.Tensor:  # [B] c_i
        return sequence_scale(self.batch.response_mask.float(), AGGREGATION, max_len=self.max_len)

    def params(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]


def _settings(ctx: Ctx, baseline: str, need_snr: bool, norms_method: str = "auto",
              logit_chunk: int = 0, engine: str = "two_pass") -> UpdateSettings:
    return UpdateSettings(baseline=baseline, aggregation=AGGREGATION, max_len=ctx.max_len, need_snr=need_snr,
                          micro_batch_groups=ctx.micro_batch_groups, norms_method=norms_method,
                          logit_chunk_tokens=logit_chunk, checkpointed_engine=engine)


def _core(ctx: Ctx, settings: UpdateSettings) -> SimpleNamespace:
    """One step of the update core as ``oblr train`` runs it in one process: the core, then the step's
    ``||gbar||^2`` and S, V (:func:`oblr.distributed.step.step_statistics`, float32 as the trainer's)."""
    res = accumulate_policy_gradient(ctx.model, ctx.batch, ctx.rewards, settings)
    if step_statistics is None:  # an older core summed ||gbar||^2 and formed S, V itself
        return res
    grad_sq, stats = step_statistics(ctx.params(), res.per_prompt_sq_norms, float64=False)
    return SimpleNamespace(per_prompt_sq_norms=res.per_prompt_sq_norms, grad_sq=grad_sq, snr=stats)


def step_grpo(ctx: Ctx):
    return _core(ctx, _settings(ctx, "grpo", False)).per_prompt_sq_norms


def step_oblr(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True)).per_prompt_sq_norms


def step_oblr_recompute(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, engine="recompute")).per_prompt_sq_norms


def step_oblr_recompute_chunk(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, logit_chunk=LOGIT_CHUNK, engine="recompute")) \
        .per_prompt_sq_norms


def step_grpo_chunk(ctx: Ctx):
    return _core(ctx, _settings(ctx, "grpo", False, logit_chunk=LOGIT_CHUNK)).per_prompt_sq_norms


def step_oblr_chunk(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, logit_chunk=LOGIT_CHUNK)).per_prompt_sq_norms


def step_oblr_ghost(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, "ghost")).per_prompt_sq_norms


def step_oblr_materialize(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, "materialize")).per_prompt_sq_norms


def step_oblr_loop(ctx: Ctx):
    return _core(ctx, _settings(ctx, "oblr", True, "loop")).per_prompt_sq_norms


def _coeffs(ctx: Ctx, sq: torch.Tensor, k0: int, k1: int) -> torch.Tensor:
    """coeff_i = -A_i c_i for prompts k0..k1-1 from raw ``||s_i||^2`` [(k1-k0)*G]."""
    G = ctx.rewards.shape[1]
    c = ctx.scale[k0 * G:k1 * G]
    lengths = ctx.batch.response_lengths[k0 * G:k1 * G].float().view(k1 - k0, G)
    adv = compute_advantages("oblr", ctx.rewards[k0:k1], weights=(sq * c.pow(2)).view(k1 - k0, G), lengths=lengths)
    return -adv.reshape(-1) * c


def _per_group_from_flat(ctx: Ctx, per_group) -> torch.Tensor:
    """Shared tail of loop/torch_func: per prompt k, ``S`` [G, P] flattened per-sequence gradients ->
    coefficients, ``g_k``, ``.grad``. ``per_group(k)`` returns S."""
    N = ctx.rewards.shape[0]
    params = ctx.params()
    total = torch.zeros(sum(p.numel() for p in params))
    gks = []
    for k in range(N):
        S = per_group(k)
        coeffs = _coeffs(ctx, (S * S).sum(1), k, k + 1)
        gk = coeffs @ S
        gks.append((N * gk).pow(2).sum())
        total += gk
    off = 0
    for p in params:
        g = total[off:off + p.numel()].view_as(p).to(p.dtype)
        p.grad = g.clone() if p.grad is None else p.grad.add_(g)
        off += p.numel()
    return torch.stack(gks)


def step_loop(ctx: Ctx):
    b, G, params = ctx.batch, ctx.rewards.shape[1], ctx.params()

    def per_group(k):
        rows = []
        for i in range(k * G, (k + 1) * G):
            lp = sequence_logprobs(token_logprobs(ctx.model, b.input_ids[i:i + 1], b.attention_mask[i:i + 1]),
                                   b.response_mask[i:i + 1])
            rows.append(torch.cat([g.reshape(-1).float() for g in torch.autograd.grad(lp.sum(), params)]))
        return torch.stack(rows)

    return _per_group_from_flat(ctx, per_group)


def step_two_backward(ctx: Ctx):
    """Per micro-batch of whole groups: a BookKeeper pass (w_i, advantages, ||g_k||^2), then a second
    forward and an ordinary backward of the policy loss."""
    b, (N, G) = ctx.batch, ctx.rewards.shape
    step = ctx.micro_batch_groups or N
    c_all, gks = ctx.scale, []
    for k0 in range(0, N, step):
        k1 = min(N, k0 + step)
        rows = slice(k0 * G, k1 * G)
        ids, am, rm = b.input_ids[rows], b.attention_mask[rows], b.response_mask[rows]
        book = BookKeeper(ctx.model)
        with book.record():
            book.backward(sequence_logprobs(gather_logprobs(forward_logits(ctx.model, ids, am), ids), rm))
        coeffs = _coeffs(ctx, book.sq_norms(), k0, k1)
        gks.append(book.group_sq_norms(coeffs * N, b.group_ids[rows]))
        book.clear()
        c = c_all[rows]
        tok_lp = gather_logprobs(forward_logits(ctx.model, ids, am), ids)
        loss, _ = policy_loss(tok_lp, tok_lp.detach(), coeffs / -c, rm.float(), aggregation=AGGREGATION,
                              max_len=ctx.max_len, seq_scale=c)
        loss.backward()
    return torch.cat(gks)


def step_torch_func(ctx: Ctx):
    """Per-sample gradients with ``torch.func``; rows run without an attention mask, which is exact here
    because the benchmark batch has no left padding and attention is causal (right padding cannot reach
    the response tokens)."""
    from torch.func import functional_call, grad, vmap

    b, G = ctx.batch, ctx.rewards.shape[1]
    named = [(n, p) for n, p in ctx.model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in named}

    def seq_lp(p, ids, rm):
        logits = functional_call(ctx.model, p, (), {"input_ids": ids[None], "use_cache": False}).logits[0]
        tok = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[1:, None]).squeeze(-1)
        return (tok * rm[1:]).sum()

    per_sample = vmap(grad(seq_lp), in_dims=(None, 0, 0))

    def per_group(k):
        rows = slice(k * G, (k + 1) * G)
        g = per_sample(params, b.input_ids[rows], b.response_mask[rows].float())
        return torch.cat([g[n].reshape(G, -1).float() for n, _ in named], 1)

    return _per_group_from_flat(ctx, per_group)


class OpacusStep:
    """Opacus ghost clipping (``GradSampleModuleFastGradientClipping``) used for ``w_i``: a backward of
    ``sum_i l_i`` with its hooks (per-sample norms), then a second backward of ``sum_i coeff_i l_i`` on the
    retained graph with hooks off -- Opacus's own two-pass pattern. No per-prompt norms (Opacus computes
    per-sample norms only). ``setup``/``teardown`` wrap and unwrap the model outside the timed region."""

    def __init__(self):
        self.gsm = None

    def setup(self, ctx: Ctx) -> None:
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        self.gsm = GradSampleModuleFastGradientClipping(ctx.model, batch_first=True, loss_reduction="sum",
                                                         strict=False, use_ghost_clipping=True)

    def teardown(self, ctx: Ctx) -> None:
        if self.gsm is not None:
            self.gsm.remove_hooks()
            for p in ctx.model.parameters():
                for attr in ("_norm_sample", "grad_sample", "_forward_counter"):
                    if hasattr(p, attr):
                        delattr(p, attr)
            for m in ctx.model.modules():
                for attr in ("activations", "max_batch_len"):
                    if attr in m.__dict__:
                        delattr(m, attr)
            self.gsm = None

    def __call__(self, ctx: Ctx):
        b, N = ctx.batch, ctx.rewards.shape[0]
        out = self.gsm(input_ids=b.input_ids, attention_mask=b.attention_mask,
                       position_ids=position_ids_from_mask(b.attention_mask), use_cache=False)
        seq_lp = sequence_logprobs(gather_logprobs(out.logits, b.input_ids), b.response_mask)
        seq_lp.sum().backward(retain_graph=True)
        coeffs = _coeffs(ctx, self.gsm.get_norm_sample().detach().pow(2), 0, N)
        for p in ctx.params():
            p.grad = None
        self.gsm.disable_hooks()
        try:
            (coeffs * seq_lp).sum().backward()
        finally:
            self.gsm.enable_hooks()


@dataclass(frozen=True)
class Method:
    name: str
    fn: object  # callable(ctx) -> [N] per-prompt squared norms or None
    what: str
    setup: object = None
    teardown: object = None


class AutoStep:
    """``oblr`` then the auto schedule's ``step`` (its per-step cost). The controller and its shadow AdamW
    (state created by one zero-lr step) are built once, in ``setup`` of the first call."""

    def __init__(self):
        self.ctl = None

    def setup(self, ctx: Ctx) -> None:
        if self.ctl is None:
            from oblr.schedules import make_lr_controller

            shadow = torch.optim.AdamW(ctx.params(), lr=0.0)
            for p in ctx.params():
                p.grad = torch.zeros_like(p)
            shadow.step()
            self.ctl = make_lr_controller("auto", shadow, lr=1e-4, ema=0.9, grad_clip=1.0)

    def __call__(self, ctx: Ctx):
        res = _core(ctx, _settings(ctx, "oblr", True))
        self.ctl.step(res.snr)
        return res.per_prompt_sq_norms


def _checkpointing_on(ctx: Ctx) -> None:
    from oblr.models import enable_activation_checkpointing

    enable_activation_checkpointing(ctx.model)


def _checkpointing_off(ctx: Ctx) -> None:
    from oblr.models import disable_activation_checkpointing

    disable_activation_checkpointing(ctx.model)


#: ``oblr_dense``'s ``assembly.KEEP_DENSE_SLACK``: every weight whose per-row gradients take at most this many times
#: its factors' memory is kept dense (at the random-init cases' widths and the SmolLM2 shape: all of them)
DENSE_SLACK = 8.0


class DenseSlack:
    """``oblr`` with the one-pass engine's keep-dense rule relaxed to :data:`DENSE_SLACK` for the call (restored
    in ``teardown``): per-row gradients materialised once after the backward instead of ghost Grams -- fewer
    FLOPs, more memory (the question: does the FLOP saving survive the memory traffic on this machine?)."""

    def setup(self, ctx: Ctx) -> None:
        from oblr.gradnorm import assembly

        self.saved = assembly.KEEP_DENSE_SLACK
        assembly.KEEP_DENSE_SLACK = DENSE_SLACK

    def teardown(self, ctx: Ctx) -> None:
        from oblr.gradnorm import assembly

        assembly.KEEP_DENSE_SLACK = self.saved


def methods() -> list[Method]:
    """Every compared method, GRPO (the denominator) first."""
    opacus, auto, dense = OpacusStep(), AutoStep(), DenseSlack()
    return [
        Method("grpo", step_grpo, "GRPO, plain path: 1 forward + 1 backward"),
        Method("oblr", step_oblr, "OBLR-PO, book-keeping: 1 forward + 1 backward, w_i, ||g_k||^2"),
        Method("grpo_ckpt", step_grpo, "GRPO with activation checkpointing (recompute in the backward)",
               _checkpointing_on, _checkpointing_off),
        Method("oblr_ckpt", step_oblr, "OBLR-PO with activation checkpointing: two-pass engine (norm pass into "
               "per-prompt Grams, then an ordinary backward)", _checkpointing_on, _checkpointing_off),
        Method("oblr_recompute", step_oblr_recompute, "OBLR-PO with activation checkpointing: recompute engine (one "
               "backward; each recomputed layer's per-row contributions kept, no second backward)",
               _checkpointing_on, _checkpointing_off),
        Method("grpo_ckpt_chunk", step_grpo_chunk, f"grpo_ckpt with the output layer in chunks of {LOGIT_CHUNK} "
               "positions (model.logit_chunk_tokens)", _checkpointing_on, _checkpointing_off),
        Method("oblr_ckpt_chunk", step_oblr_chunk, f"oblr_ckpt with the output layer in chunks of {LOGIT_CHUNK} "
               "positions (model.logit_chunk_tokens)", _checkpointing_on, _checkpointing_off),
        Method("oblr_recompute_chunk", step_oblr_recompute_chunk, f"oblr_recompute with the output layer in chunks "
               f"of {LOGIT_CHUNK} positions", _checkpointing_on, _checkpointing_off),
        Method("oblr_auto", auto, "OBLR-PO as oblr + the auto lr schedule's step (oblr.step_scale)", auto.setup),
        Method("oblr_ghost", step_oblr_ghost, "OBLR-PO as oblr with norms_method=ghost (ghost norms wherever "
               "the rule allows)"),
        Method("oblr_materialize", step_oblr_materialize, "OBLR-PO as oblr with norms_method=materialize (every "
               "per-row gradient materialised)"),
        Method("oblr_dense", step_oblr, f"OBLR-PO as oblr with every per-row gradient up to {DENSE_SLACK:g}x its "
               "factors' memory kept dense (assembly.KEEP_DENSE_SLACK raised): no ghost Grams", dense.setup,
               dense.teardown),
        Method("oblr_loop", step_oblr_loop, "OBLR-PO, norms_method=loop: 1 forward + 1 backward per sequence"),
        Method("loop", step_loop, "loop: 1 forward + 1 backward per sequence"),
        Method("two_backward", step_two_backward, "BookKeeper norms pass, then forward + ordinary backward"),
        Method("torch_func", step_torch_func, "torch.func vmap(grad) per-sample gradients per prompt"),
        Method("opacus", opacus, "Opacus ghost clipping norms + second backward (no ||g_k||^2)",
               opacus.setup, opacus.teardown),
    ]
