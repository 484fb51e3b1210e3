"""The actor side of OBLR-PO in verl: the norm pass (w_i, advantages, per-prompt norms) and the SNR learning rate.

Whose code: oblr's -- the norm pass and :class:`ActorLearningRate`; verl's -- the ``DataProto`` fields
read and the engine whose public ``optimizer_step`` / ``save_checkpoint`` / ``load_checkpoint`` are wrapped.
No private verl name is touched here (docs/integrations_private_api.md).

:func:`norm_pass` runs on a data-parallel rank of verl's actor, with the actor's module and the batch as the
actor sees it (a ``DataProto`` with ``input_ids`` = left-padded prompt then right-padded response,
``attention_mask``, ``responses``, ``response_mask``, the rewards, and ``uid``), BEFORE verl forms the
advantages. Positions are derived from the attention mask (:func:`oblr.logprobs.forward_logits`), which is
what verl's ``position_ids`` are for a text model; the batch's ``position_ids`` are not read. It calls oblr's update core, :func:`oblr.update.accumulate_policy_gradient`, with
``assemble_grad=False`` (nothing is written to ``.grad``: verl's own loss and backward follow): one forward
and one activation-only backward per micro-batch of whole groups give each row's exact
``w_i = c_i^2 ||s_i||^2`` and, with the advantages, the per-prompt squared norms ``||g_k||^2``. The factors
are those of the ``oblr`` policy loss, ``c_i = 1 / (global batch rows x loss_scale_factor)``, so w_i and g_k
describe the gradient verl's ``ppo_loss`` then produces. The advantages A_i are computed here, once per step
(the core's :func:`oblr.estimators.estimate` with those w_i), and go into the batch where the registered ``oblr``
estimator reads them instead of estimating again (:func:`~oblr.integrations.verl.put_advantages`); the sum of
``||g_k||^2`` over every rank and the global prompt count go into ``meta_info[META_KEY]``.

:class:`ActorLearningRate` turns those into the learning rate: before the actor's optimizer step
:func:`oblr.distributed.step.step_statistics` (as in ``oblr train`` on ranks) sums ``||gbar||^2`` of verl's
reduced gradient once (float64) and forms S, V with :func:`oblr.snr.snr_statistics`; it then steps an oblr
schedule (:func:`oblr.schedules.make_lr_controller`: ``snr``, ``snr_adam``, ``auto`` or ``kl``), which sets
every param group's lr. With ``kl`` it also measures, right after the optimizer step, the per-token
KL(pi_old || pi_new) the step moved the policy by on the norm pass's rows with ``oblr train``'s own function,
:func:`oblr.distributed.step.data_parallel_step_kl` (the norm pass's own old log-probs: one forward pass without
gradients per micro-batch, the sums gathered over ``dp_group`` and added in rank order, so every rank sets the
same next lr).
:func:`wrap_optimizer_step` installs both around a verl engine's ``optimizer_step`` (the lr before its gradient
clipping, so S and V see the unclipped gradient; the KL after its update).
:func:`wrap_checkpointing` puts the schedule's state (EMA averages, step count, the ``auto`` scale) into the
engine's checkpoints, one file per rank beside verl's own shards (:data:`STATE_FILE`), and restores it on load,
so a resumed run continues the same learning-rate trajectory.

Data parallel: each rank must hold whole groups (every ``uid`` of a rank has ``rollout_n`` rows; a split
group is refused); the per-prompt sums and counts are all-reduced over ``dp_group``. Micro-batches: verl's
``ppo_micro_batch_size_per_gpu`` rows, taken as whole groups (at least one group per micro-batch). Nothing
here imports verl; the DataProto is read by its ``batch`` / ``non_tensor_batch`` / ``meta_info``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from .estimator import group_rows, put_advantages
from .loss import _get, refusal

#: ``meta_info`` key of the S/V inputs the norm pass leaves in the batch: {"gk_sq_sum": float, "n_prompts": int}
META_KEY = "oblr_norm_pass"
#: the schedule's state file in a verl checkpoint folder (one per rank, named like verl's own shards)
STATE_FILE = "oblr_lr_world_size_{world}_rank_{rank}.pt"
#: batch keys read for the rewards, first present wins (row sums)
REWARD_KEYS = ("token_level_rewards", "token_level_scores", "rm_scores")


@dataclass
class NormPass:
    """One norm pass on one rank. Row tensors are in the batch's (verl's) row order."""

    weights: torch.Tensor        # [B] w_i
    advantages: torch.Tensor     # [B] A_i of the oblr estimator with those w_i
    per_prompt_sq_norms: torch.Tensor  # [N_local] ||g_k||^2 of this rank's prompts (g_k scaled by the global N)
    gk_sq_sum: torch.Tensor      # float64 0-d: sum of ||g_k||^2 over every rank's prompts
    n_prompts: int               # prompts of the global batch
    metrics: dict
    step_kl: StepKLRound | None = None  # what the kl schedule needs to measure the coming step's KL


@dataclass
class StepKLRound:
    """The rows of one norm pass as the step's KL is measured on them after the optimizer step: the core's
    batch, the policy's log-probs before the step (the norm pass's own), its micro-batching and scoring."""

    module: object
    batch: object
    old_logprobs: torch.Tensor
    settings: object             # oblr.update.UpdateSettings of the norm pass
    group_size: int
    dp_group: object = None
    autocast: object = None

    def measure(self) -> float:
        """The per-token KL(pi_old || pi_new) over every rank's rows, with the module's weights now."""
        from oblr.distributed.step import data_parallel_step_kl

        return data_parallel_step_kl(self.module, self.batch, self.old_logprobs, self.settings, self.group_size,
                                     autocast=self.autocast, group=self.dp_group, gather=self.dp_group is not None)


def _rank_info(dp_group):
    import torch.distributed as dist

    if dp_group is None or not dist.is_initialized():
        return None
    return dp_group


def _all_sum(t: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t


def core_batch(data, rollout_n: int | None = None):
    """``(batch, rewards [N, G], rows [N, G])``: the core's prompt-major batch from verl's rows.

    ``rows[k, j]`` is the verl row of output j of prompt k. Refuses missing fields, unequal or split groups
    (every group must have ``rollout_n`` rows when given), and rows whose ``input_ids`` do not end with
    their ``responses``."""
    b = data.batch
    for key in ("input_ids", "attention_mask", "responses", "response_mask"):
        if key not in b.keys():
            raise ValueError(f"oblr norm pass: the batch has no '{key}' (verl's actor batch after generation)")
    rkey = next((k for k in REWARD_KEYS if k in b.keys()), None)
    if rkey is None:
        raise ValueError(f"oblr norm pass: the batch has no rewards (one of {', '.join(REWARD_KEYS)}); run it "
                         f"after the rewards are computed")
    uid = data.non_tensor_batch.get("uid") if hasattr(data, "non_tensor_batch") else None
    rows = group_rows(uid)
    G = rows.shape[1]
    if rollout_n is not None and G != rollout_n:
        raise ValueError(f"oblr norm pass: this rank holds groups of {G} rows, not rollout.n = {rollout_n}: a "
                         f"group is split over data-parallel ranks (set trainer.balance_batch=False and a batch "
                         f"size per rank that is a multiple of rollout.n)")
    ids, am = b["input_ids"], b["attention_mask"]
    R = b["responses"].shape[1]
    if not torch.equal(ids[:, -R:], b["responses"]):
        raise ValueError("oblr norm pass: input_ids do not end with responses (expected verl's layout: "
                         "left-padded prompt, then the response)")
    rm = torch.zeros_like(am)
    rm[:, -R:] = b["response_mask"].to(am.dtype)
    flat = rows.reshape(-1).to(ids.device)
    rm = rm[flat]
    batch = SimpleNamespace(input_ids=ids[flat], attention_mask=am[flat], response_mask=rm,
                            response_lengths=rm.sum(-1))
    rewards = b[rkey].sum(-1).to(torch.float32)[flat].view(rows.shape)
    return batch, rewards, rows


def norm_pass(module, data, actor_config, *, rollout_n: int, temperature: float = 1.0, dp_group=None,
              autocast=None, norms_method: str = "auto") -> NormPass:
    """Run oblr's norm pass on this rank's rows and put its results into ``data`` (module docstring).

    ``actor_config``: verl's actor config (``loss_scale_factor``, ``ppo_micro_batch_size_per_gpu`` and the
    settings :data:`~oblr.integrations.verl.RULES` checks); ``temperature``: the rollout's (verl divides the
    actor's logits by it); ``dp_group``: the actor's data-parallel process group (None: one rank)."""
    from oblr.losses import BatchTotals, sequence_scale
    from oblr.update import UpdateSettings, accumulate_policy_gradient

    msg = refusal(actor_config)
    if msg is not None:
        raise ValueError(msg.replace("oblr policy loss", "oblr norm pass"))
    batch, rewards, rows = core_batch(data, rollout_n)
    n_local, G = rewards.shape
    group = _rank_info(dp_group)
    dev = batch.input_ids.device
    n_total = int(_all_sum(torch.tensor([n_local], dtype=torch.float64, device=dev), group)[0])
    width = int(_get(actor_config, "loss_scale_factor"))
    micro = _get(actor_config, "ppo_micro_batch_size_per_gpu") or G
    # c_i of the oblr policy loss: seq_sum_const over the global batch at verl's loss_scale_factor
    scale = sequence_scale(batch.response_mask, "seq_sum_const", max_len=width,
                           totals=BatchTotals(n_total * G, 0.0, width))
    settings = UpdateSettings(baseline="oblr", aggregation="seq_sum_const", max_len=width, need_snr=True,
                              norms_method=norms_method, micro_batch_groups=max(1, int(micro) // G),
                              temperature=float(temperature), top_p=1.0, assemble_grad=False)
    res = accumulate_policy_gradient(module, batch, rewards, settings, seq_scale=scale, n_prompts=n_total,
                                     autocast=autocast)
    B = n_local * G
    flat = rows.reshape(-1).to(dev)
    w = torch.empty(B, dtype=torch.float32, device=dev)
    w[flat] = res.estimate.weights.reshape(-1).to(torch.float32)
    adv = torch.empty(B, dtype=torch.float32, device=dev)
    adv[flat] = res.advantages.reshape(-1).to(torch.float32)
    gks = res.per_prompt_sq_norms.double()
    gk_sum = _all_sum(gks.sum().reshape(1).clone(), group)[0]
    put_advantages(data, adv)
    data.meta_info[META_KEY] = {"gk_sq_sum": float(gk_sum), "n_prompts": n_total}
    kl_round = StepKLRound(module, batch, res.old_logprobs, settings, G, group, autocast)
    return NormPass(w, adv, gks, gk_sum, n_total, res.metrics, kl_round)


def _sharded(params) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in params)


class ActorLearningRate:
    """oblr's learning-rate schedule on the actor's optimizer, stepped from the norm pass's statistics.

    ``schedule``: a name of :data:`oblr.schedules.SCHEDULES` that needs S and V (``snr``, ``snr_adam``, ``auto``)
    or the step's KL (``kl``); ``lr``: eta_max (``snr``) or the initial guess (``auto``, ``kl``); the rest as
    :func:`oblr.schedules.make_lr_controller`. Per optimizer step: :meth:`set_pending` with the norm pass's
    ``(gk_sq_sum, n_prompts)`` (and, for ``kl``, its :class:`StepKLRound`), then :meth:`before_step` after the
    backward (``.grad`` reduced over ranks, not yet clipped) and before ``optimizer.step()``, and
    :meth:`after_step` after it. ``auto`` reads whole parameters and gradients: refused when they are sharded.
    ``kl`` without a ``target`` option takes the default target of the norm pass's prompt count
    (:func:`oblr.kl_rate.default_target`), as ``oblr train`` takes ``rollout.prompts_per_step``."""

    def __init__(self, optimizer, schedule: str = "snr", *, lr: float, eta_min: float = 0.0, ema: float = 0.0,
                 warmup_steps: int = 0, total_steps: int = 1, grad_clip: float = 0.0, **options):
        from oblr.schedules import SCHEDULES, make_lr_controller

        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        if any(type(p).__name__ == "FlatParameter" for p in params):
            raise ValueError("oblr learning rate: FSDP1 flat parameters (actor.strategy=fsdp) are not supported; "
                             "use actor.strategy=fsdp2")
        if schedule == "auto" and _sharded(params):
            raise ValueError("oblr learning rate: lr_schedule=auto reads whole parameters and gradients, which "
                             "FSDP2 shards over ranks; use lr_schedule=snr")
        factory = SCHEDULES.get(schedule)  # refused from the class, before it touches the optimizer's lr
        self.needs_step_kl = bool(getattr(factory, "needs_step_kl", False))
        if not (getattr(factory, "needs_snr", False) or self.needs_step_kl):
            raise ValueError(f"oblr learning rate: schedule {schedule!r} does not use S and V or the step's KL; keep "
                             f"verl's own lr scheduler instead")
        self._default_target = self.needs_step_kl and options.get("target") is None
        self.controller = make_lr_controller(schedule, optimizer, lr=lr, eta_min=eta_min, ema=ema,
                                             warmup_steps=warmup_steps, total_steps=total_steps,
                                             grad_clip=grad_clip, **options)
        self.params = params
        self.schedule = schedule
        self.pending: tuple[float, int] | None = None
        self.kl_round: StepKLRound | None = None
        self.last = None  # SNRStats of the last step
        self.last_step_kl: float | None = None
        self.logged: dict = {}  # before_step's and after_step's metrics since pop_metrics

    def pop_metrics(self) -> dict:
        """The ``oblr/*`` metrics of the optimizer steps since the last call (the last step's values; the
        recipe's worker adds them to verl's actor metrics), and forget them."""
        out, self.logged = self.logged, {}
        return out

    def state_dict(self) -> dict:
        """The schedule's name and state (what a resumed run needs to set the same lrs)."""
        return {"schedule": self.schedule, "controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output (the schedule re-applies its last lr to the optimizer)."""
        if state.get("schedule") != self.schedule:
            raise ValueError(f"oblr learning rate: the checkpoint holds the state of schedule "
                             f"{state.get('schedule')!r}, this run uses {self.schedule!r}")
        self.controller.load_state_dict(state["controller"])
        self.pending = self.kl_round = None

    def set_pending(self, gk_sq_sum, n_prompts: int, step_kl: StepKLRound | None = None) -> None:
        """The norm pass's S and V inputs for the coming step, and its rows for the step's KL (``kl``)."""
        self.pending = (float(gk_sq_sum), int(n_prompts))
        if self.needs_step_kl:
            if step_kl is None:
                raise ValueError("oblr learning rate: the kl schedule needs the norm pass's rows to measure the "
                                 "step's KL (set_pending(..., step_kl=NormPass.step_kl))")
            self.kl_round = step_kl
            if self._default_target:  # the N of the default target: the norm pass's prompts (the same every step)
                from oblr.kl_rate import default_target, is_sgd

                self.controller.target = default_target(int(n_prompts), adaptive=not is_sgd(self.controller.optimizer))

    def pending_from(self, data, step_kl: StepKLRound | None = None) -> None:
        """:meth:`set_pending` from the ``meta_info`` the norm pass left in a batch."""
        info = data.meta_info.get(META_KEY)
        if info is None:
            raise ValueError(f"oblr learning rate: the batch has no meta_info['{META_KEY}'] (run the norm pass)")
        self.set_pending(info["gk_sq_sum"], info["n_prompts"], step_kl)

    def before_step(self) -> dict | None:
        """S, V from the pending sums and ``||gbar||^2`` of ``.grad`` now; the schedule sets the lr. Returns
        ``oblr/*`` metrics, or None when nothing is pending (a second optimizer step on the same batch)."""
        from oblr.distributed.step import step_statistics

        if self.pending is None:
            return None
        gk_sum, n = self.pending
        self.pending = None
        gbar_sq, st = step_statistics(self.params, torch.tensor(gk_sum, dtype=torch.float64), n)
        self.controller.step(st)
        self.last = st
        lr = self.controller.get_last_lr()[0]
        out = {"oblr/S": float(st.S), "oblr/V": float(st.V), "oblr/snr": float(st.snr),
               "oblr/grad_norm": float(gbar_sq.double().sqrt()), "oblr/lr": lr, "oblr/n": n}
        self.logged.update(out)
        return out

    def after_step(self) -> dict | None:
        """``kl``: the KL the optimizer step just taken moved the policy by (:meth:`StepKLRound.measure`), fed to
        the schedule, which sets the next step's lr from it. Returns ``oblr/step_kl`` and the schedule's
        ``oblr/kl/*``, or None (another schedule, or nothing pending)."""
        if self.kl_round is None:
            return None
        kl_round, self.kl_round = self.kl_round, None
        kl = kl_round.measure()
        self.controller.observe_step_kl(kl)
        self.last_step_kl = kl
        out = {"oblr/step_kl": kl, **{f"oblr/{k}": float(v) for k, v in self.controller.metrics().items()
                                      if k.startswith("kl/")}}
        self.logged.update(out)
        return out


def wrap_optimizer_step(engine, lr: ActorLearningRate) -> None:
    """Put ``lr.before_step`` in front of a verl engine's ``optimizer_step`` (before its clipping) and
    ``lr.after_step`` behind it (the ``kl`` schedule's measurement of the step just taken)."""
    if getattr(engine, "scaler", None) is not None:
        raise ValueError("oblr learning rate: a gradient scaler (fp16) scales .grad before the step; use bf16")
    inner = engine.optimizer_step

    def optimizer_step():
        lr.before_step()
        out = inner()
        lr.after_step()
        return out

    engine.optimizer_step = optimizer_step


def _rank_world() -> tuple[int, int]:
    from oblr.distributed.env import rank, world_size

    return rank(), world_size()


def save_lr_state(lr: ActorLearningRate, local_path) -> str:
    """Write this rank's :meth:`ActorLearningRate.state_dict` into the checkpoint folder ``local_path``
    (:data:`STATE_FILE`; written to a temporary name and renamed, so a crash leaves no half file)."""
    import os

    rank, world = _rank_world()
    os.makedirs(local_path, exist_ok=True)
    path = os.path.join(str(local_path), STATE_FILE.format(world=world, rank=rank))
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(lr.state_dict(), tmp)
    os.replace(tmp, path)
    return path


def load_lr_state(lr: ActorLearningRate, local_path) -> bool:
    """Restore this rank's state from the checkpoint folder ``local_path``; False (and the schedule starts
    afresh) when the folder has no oblr state, i.e. a checkpoint made without the recipe."""
    import os
    import warnings

    rank, world = _rank_world()
    path = os.path.join(str(local_path), STATE_FILE.format(world=world, rank=rank))
    if not os.path.isfile(path):
        others = sorted(f for f in os.listdir(local_path) if f.startswith("oblr_lr_world_size_")) \
            if os.path.isdir(local_path) else []
        if others:
            raise ValueError(f"oblr learning rate: {local_path} holds the schedule state of another world size "
                             f"({others[0]}), not {os.path.basename(path)}; resume with the same number of ranks")
        warnings.warn(f"oblr learning rate: {local_path} has no {os.path.basename(path)} (a checkpoint made "
                      f"without the oblr recipe); the schedule starts afresh", stacklevel=2)
        return False
    lr.load_state_dict(torch.load(path, weights_only=True))
    return True


def wrap_checkpointing(engine, lr: ActorLearningRate) -> None:
    """Make a verl engine's ``save_checkpoint`` / ``load_checkpoint`` carry the schedule's state too: saved
    after verl's own files (into the same folder), restored after verl has loaded the optimizer, so the lr the
    schedule re-applies is the one in force."""
    inner_save, inner_load = engine.save_checkpoint, engine.load_checkpoint

    def save_checkpoint(local_path, *args, **kwargs):
        out = inner_save(local_path, *args, **kwargs)
        if local_path is not None:
            save_lr_state(lr, local_path)
        return out

    def load_checkpoint(local_path, *args, **kwargs):
        out = inner_load(local_path, *args, **kwargs)
        if local_path is not None:
            load_lr_state(lr, local_path)
        return out

    engine.save_checkpoint, engine.load_checkpoint = save_checkpoint, load_checkpoint
