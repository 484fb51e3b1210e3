"""Shared by the verl actor-step tests and their gloo worker: rollouts sampled at a temperature from a tiny
Qwen3 in verl's layout, oblr's native step on them, and the same step driven through verl's seams.

The verl step is what verl 0.9.1's trainer and actor worker do, with verl's own functions where they run
on CPU: the ``oblr`` norm pass on the actor (:func:`oblr.integrations.verl.actor.norm_pass`), the driver's
``ray_trainer.compute_advantage`` with the registered ``oblr`` estimator, the actor's update as
``TrainingWorker.train_batch`` runs it -- zero the gradient, per micro-batch of ``ppo_micro_batch_size_per_gpu``
rows the model's temperature-scaled log-probs of every valid token (unpadded, verl's model output) into
``workers.utils.losses.ppo_loss`` with the registered ``oblr`` loss and its backward, FSDP's average of the
gradient over ranks (gloo all-reduce / world size), then ``FSDPEngine.optimizer_step`` itself (verl's code:
clip, finite check, step) with oblr's learning rate in front of it (``wrap_optimizer_step``). verl's engine
forward and FSDP wrapping need CUDA and are not run.
"""

from __future__ import annotations

import copy
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from conftest import tiny_qwen3

from oblr.logprobs import forward_logits, position_ids_from_mask

N, G, VOCAB = 4, 3, 61
P_MAX, R_MAX = 5, 6
STOP, PAD = 12, 0  # tokens below STOP end a response (about one in five draws)
TEMPERATURE = 0.8
LR, CLIP = 1e-3, 0.1  # the clip is active: the step gradients have norms of about 0.3
MICRO_ROWS = 2 * G  # ppo_micro_batch_size_per_gpu (rows): two micro-batches on one rank


def initial_model():
    return tiny_qwen3(seed=5).train()


def sample_rollouts(model, seed: int, n: int = N):
    """``n`` prompts (random tokens, unequal lengths, left-padded) x G responses sampled from ``model`` at
    TEMPERATURE (full distribution, no top-k/top-p), stopped at the first token below STOP; rewards vary with the response."""
    gen = torch.Generator().manual_seed(seed)
    plens = torch.randint(2, P_MAX + 1, (n,), generator=gen).tolist()
    prompts = torch.full((n, P_MAX), PAD, dtype=torch.long)
    pmask = torch.zeros(n, P_MAX, dtype=torch.long)
    for k, p in enumerate(plens):
        prompts[k, P_MAX - p:] = torch.randint(4, VOCAB, (p,), generator=gen)
        pmask[k, P_MAX - p:] = 1
    ids, am = prompts.repeat_interleave(G, 0), pmask.repeat_interleave(G, 0)
    done = torch.zeros(ids.shape[0], dtype=torch.bool)
    resp, rmask = [], []
    with torch.no_grad():
        for _ in range(R_MAX):
            logits = forward_logits(model, torch.cat([ids] + resp, 1) if resp else ids,
                                    torch.cat([am] + rmask, 1) if rmask else am)[:, -1].float()
            tok = torch.multinomial(torch.softmax(logits / TEMPERATURE, -1), 1, generator=gen).squeeze(1)
            tok = torch.where(done, torch.full_like(tok, PAD), tok)
            resp.append(tok[:, None])
            rmask.append((~done).long()[:, None])
            done = done | (tok < STOP)
    responses, response_mask = torch.cat(resp, 1), torch.cat(rmask, 1)
    low = ((responses < VOCAB // 2) & response_mask.bool()).sum(-1).float()
    rewards = low / response_mask.sum(-1).clamp(min=1) + 0.05 * response_mask.sum(-1)
    return SimpleNamespace(prompts=ids, prompt_mask=am, responses=responses, response_mask=response_mask,
                           rewards=rewards.view(n, G))


def with_tool_output(ro, start: int = 1, width: int = 2):
    """The rollouts with response positions ``start .. start+width-1`` of every response of at least
    ``start + width + 1`` tokens made tool output: still attended (``response_attention`` 1), out of the loss
    (``response_mask`` 0), so the response mask is no longer the attention mask's tail."""
    att = ro.response_mask.clone()
    rm = att.clone()
    long = att.sum(-1) >= start + width + 1
    rm[long, start:start + width] = 0
    return SimpleNamespace(**{**vars(ro), "response_mask": rm, "response_attention": att})


def _response_attention(ro):
    return getattr(ro, "response_attention", ro.response_mask)


def core_batch(ro):
    """The native step's batch (prompt-major, as oblr train builds it)."""
    ids = torch.cat([ro.prompts, ro.responses], 1)
    am = torch.cat([ro.prompt_mask, _response_attention(ro)], 1)
    rm = torch.cat([torch.zeros_like(ro.prompt_mask), ro.response_mask], 1)
    return SimpleNamespace(input_ids=ids, attention_mask=am, response_mask=rm, response_lengths=rm.sum(-1))


def data_proto(ro, rows=None, prompt_offset: int = 0):
    """verl's batch of these rollouts after generation and reward (rows ``rows``, default all, in that order):
    input_ids = prompt | response, position_ids from the mask, the reward on each response's last token
    (``token_level_scores``), ``uid`` per prompt. With tool output (:func:`with_tool_output`) the attention
    mask covers it and ``response_mask`` does not."""
    from verl import DataProto

    B = ro.prompts.shape[0]
    rows = torch.arange(B) if rows is None else rows
    ids = torch.cat([ro.prompts, ro.responses], 1)
    am = torch.cat([ro.prompt_mask, _response_attention(ro)], 1)
    scores = torch.zeros(ro.responses.shape)
    last = _response_attention(ro).sum(-1) - 1
    scores[torch.arange(B), last] = ro.rewards.reshape(-1)
    uid = np.array([f"q{prompt_offset + k}" for k in range(B // G) for _ in range(G)], dtype=object)
    t = {"input_ids": ids, "attention_mask": am, "position_ids": position_ids_from_mask(am), "prompts": ro.prompts,
         "responses": ro.responses, "response_mask": ro.response_mask, "token_level_scores": scores}
    return DataProto.from_dict(tensors={k: v[rows] for k, v in t.items()}, non_tensors={"uid": uid[rows.numpy()]})


def actor_config(**kw):
    """verl's actor config for these tests (``kw`` overrides fields)."""
    from verl.workers.config import FSDPActorConfig, PolicyLossConfig

    base = dict(strategy="fsdp2", rollout_n=G, ppo_mini_batch_size=N, ppo_micro_batch_size_per_gpu=MICRO_ROWS,
                use_torch_compile=False, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=R_MAX,
                policy_loss=PolicyLossConfig(loss_mode="oblr"))
    return FSDPActorConfig(**{**base, **kw})


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def native_step(model, opt, ctl, ro, micro_groups: int = MICRO_ROWS // G) -> dict:
    """oblr's own step on the rollouts (what ``oblr train`` does with ``algorithm.aggregation=seq_sum_const``,
    ``max_len=R_MAX``): the update core, S and V, the schedule, clipping, the optimizer step, and for a schedule
    that reads it (``kl``) the step's KL on its rows, observed by the schedule (``step_kl``)."""
    from oblr.distributed import clip_grads_
    from oblr.distributed.step import step_statistics
    from oblr.update import UpdateSettings, accumulate_policy_gradient, step_kl_sums, trainable_params

    opt.zero_grad(set_to_none=True)
    settings = UpdateSettings(baseline="oblr", aggregation="seq_sum_const", max_len=R_MAX, need_snr=True,
                              micro_batch_groups=micro_groups, temperature=TEMPERATURE)
    res = accumulate_policy_gradient(model, core_batch(ro), ro.rewards, settings)
    grad_sq, st = step_statistics(trainable_params(model), res.per_prompt_sq_norms, float64=False)  # one process
    g = grads(model)
    ctl.step(st)
    lr = opt.param_groups[0]["lr"]
    clip_grads_(trainable_params(model), CLIP, grad_sq)
    opt.step()
    out = {"w": res.estimate.weights.reshape(-1), "adv": res.advantages.reshape(-1), "grads": g,
           "S": float(st.S), "V": float(st.V), "n": st.n, "lr": lr}
    if getattr(ctl, "needs_step_kl", False):
        kl, tokens = (float(x) for x in step_kl_sums(model, core_batch(ro), res.old_logprobs, settings, G))
        out["step_kl"] = kl / tokens
        ctl.observe_step_kl(out["step_kl"])
    return out


def verl_engine(model, opt):
    """An object whose ``optimizer_step`` is verl's own ``FSDPEngine.optimizer_step`` on a plain module (its
    ``torch.nn.utils.clip_grad_norm_`` branch), with the attributes it reads, and ``save_checkpoint`` /
    ``load_checkpoint`` with verl's signatures that keep the model's and the optimizer's state in the folder."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    eng = SimpleNamespace(module=model, optimizer=opt, optimizer_config=SimpleNamespace(clip_grad=CLIP), scaler=None,
                          _qat_enabled=False)
    eng.optimizer_step = types.MethodType(FSDPEngine.optimizer_step, eng)

    def save_checkpoint(local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """What verl's checkpoint manager keeps of a plain module: the model's and the optimizer's state."""
        Path(local_path).mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, Path(local_path) / "model_optim.pt")

    def load_checkpoint(local_path, hdfs_path=None, del_local_after_load=False):
        state = torch.load(Path(local_path) / "model_optim.pt", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    eng.save_checkpoint, eng.load_checkpoint = save_checkpoint, load_checkpoint
    return eng


def verl_step(model, engine, lr, data, *, dp_group=None, world: int = 1, total_rows: int | None = None) -> dict:
    """The step verl drives (module docstring) on this rank's ``data``. Returns w_i and advantages (row
    order of ``data``), the gradient before the optimizer step, S, V and the lr set. ``total_rows``: the rows
    of the global batch (default: this rank's times ``world``, i.e. equal shares)."""
    import torch.distributed as dist
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from oblr.integrations.verl.actor import norm_pass

    cfg = actor_config()
    b = data.batch
    B = len(data)
    total_rows = B * world if total_rows is None else total_rows
    npass = norm_pass(model, data, cfg, rollout_n=G, temperature=TEMPERATURE, dp_group=dp_group)
    lr.pending_from(data, npass.step_kl)
    ids, am = b["input_ids"], b["attention_mask"]
    R = b["responses"].shape[1]
    P = ids.shape[1] - R

    def token_logprobs(mb):  # the actor's log-probs of each next token, logits / temperature (verl's forward)
        logits = forward_logits(model, ids[mb], am[mb]).float() / TEMPERATURE
        lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[mb, 1:, None]).squeeze(-1)
        return torch.cat([lp, lp.new_zeros(lp.shape[0], 1)], 1)  # position t scores token t+1

    with torch.no_grad():  # compute_log_prob: old_log_probs
        old = token_logprobs(slice(None))[:, P - 1:-1] * b["response_mask"]
    data.batch["old_log_probs"] = old
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]  # fit: no KL in the reward
    data = compute_advantage(data, adv_estimator="oblr")
    adv = data.batch["advantages"]
    rm = b["response_mask"].float()
    n_tok = rm.sum()
    if dp_group is not None:
        dist.all_reduce(n_tok, group=dp_group)
    opt = engine.optimizer
    opt.zero_grad(set_to_none=True)  # engine.optimizer_zero_grad
    for s in range(0, B, MICRO_ROWS):  # prepare_micro_batches without dynamic batch size: consecutive rows
        mb = slice(s, min(B, s + MICRO_ROWS))
        lp = token_logprobs(mb)
        fields = {"prompts": ids[mb, :P], "responses": ids[mb, P:], "attention_mask": am[mb], "response_mask": rm[mb],
                  "old_log_probs": old[mb], "advantages": adv[mb]}
        td = tu.get_tensordict(fields, {"dp_size": world, "batch_num_tokens": int(n_tok),
                                        "global_batch_size": total_rows})
        loss, _ = ppo_loss(cfg, {"log_probs": lp[am[mb].bool()]}, td)
        loss.backward()
    if dp_group is not None:  # FSDP: gradients averaged over the data-parallel ranks
        for p in model.parameters():
            dist.all_reduce(p.grad, group=dp_group)
            p.grad.div_(world)
    g = grads(model)
    engine.optimizer_step()
    st = lr.last
    return {"w": npass.weights, "norm_pass_adv": npass.advantages, "adv": (adv * rm).sum(-1) / rm.sum(-1),
            "grads": g, "S": float(st.S), "V": float(st.V), "n": st.n, "lr": opt.param_groups[0]["lr"],
            "step_kl": lr.last_step_kl}


def per_row_scores(model, ids, am, rm) -> torch.Tensor:
    """Row i: the gradient of ``sum_t rm[i, t] log softmax(logits / TEMPERATURE)[token t]`` for sequence i ALONE
    (its padding stripped, default positions, its own forward and backward; no oblr code), flattened over the
    parameters. [B, P] float64."""
    params = list(model.parameters())
    out = []
    for i in range(ids.shape[0]):
        keep = am[i].bool()
        seq, mask = ids[i][keep][None], rm[i][keep][None].float()
        logits = model(input_ids=seq).logits.float() / TEMPERATURE
        lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, seq[:, 1:, None]).squeeze(-1)
        g = torch.autograd.grad((lp * mask[:, 1:]).sum(), params, allow_unused=True)
        out.append(torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1).double()
                              for x, p in zip(g, params)]))
    return torch.stack(out)


def rel(a, b) -> float:
    """Relative difference in norm of two tensors or two lists of tensors."""
    if isinstance(a, list):
        num = torch.sqrt(sum(((x - y) ** 2).sum() for x, y in zip(a, b)))
        den = torch.sqrt(sum((y ** 2).sum() for y in b))
    else:
        num, den = torch.linalg.norm((a - b).double()), torch.linalg.norm(b.double())
    return float(num / den)


def pair(schedule: str, **options):
    """Two copies of the initial model, each with an AdamW (verl's default optimizer) and oblr's schedule
    (``options``: the schedule's own, given to both): (native model, optimizer, controller), (verl model,
    engine, ActorLearningRate)."""
    from oblr.integrations.verl.actor import ActorLearningRate, wrap_optimizer_step
    from oblr.schedules import make_lr_controller

    m1 = initial_model()
    m2 = copy.deepcopy(m1)
    o1 = torch.optim.AdamW(m1.parameters(), lr=LR, weight_decay=0.0)
    o2 = torch.optim.AdamW(m2.parameters(), lr=LR, weight_decay=0.0)
    c1 = make_lr_controller(schedule, o1, lr=LR, grad_clip=CLIP, prompts_per_step=N, **options)  # oblr train passes N
    c2 = ActorLearningRate(o2, schedule, lr=LR, grad_clip=CLIP, **options)
    engine = verl_engine(m2, o2)
    wrap_optimizer_step(engine, c2)  # what the recipe's worker does to the actor's engine
    return (m1, o1, c1), (m2, engine, c2)
