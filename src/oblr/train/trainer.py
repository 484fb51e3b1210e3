"""The RL loop: prompts -> rollouts -> rewards -> gradient, norms, S, V -> learning rate -> optimizer step.

The trainer only wires the pieces (each is a plain function or a small object, tested on its own):
the rollout engine (:func:`oblr.rollout.make_engine`, :func:`oblr.rollout.generate_and_score`; its weights
synced after every step, its log-probs of its samples compared with the update's: ``rollout/logprob_gap_*``), the
task's reward (:func:`oblr.tasks.reward_scorer`), :func:`oblr.update.accumulate_policy_gradient` (advantages,
``.grad``, per-prompt norms and the :class:`oblr.snr.SNRStats`), the schedule (:mod:`oblr.schedules`),
the optimizer (:mod:`oblr.train.optimizers`), the run folder (:mod:`oblr.train.run_dir`), checkpoints
(:mod:`oblr.train.checkpoint`) and the metric sinks (:mod:`oblr.tracking`). docs/architecture.md follows
one step through it. Under torchrun (``distributed.strategy: ddp`` or ``fsdp``, :mod:`oblr.train.ranks`)
each rank generates its block of the step's prompts, :func:`oblr.distributed.data_parallel_gradient` gives
the global gradient and S, V (the same learning rate on every rank), evaluation is split over ranks and
gathered, and rank 0 alone writes metrics, samples, plots and the summary. Checkpoints: ddp writes the
replicated weights and optimizer state from rank 0; fsdp writes the sharded model and optimizer state with
torch.distributed.checkpoint (every rank its shards, :mod:`oblr.distributed.sharded_state`) into the same
atomic checkpoint folder, and the consolidated Hugging Face weights at the end of the run.

A run holds its folder's lock from start to end. The state changes of a step (update, logging) run with
Ctrl-C and SIGTERM held back (:mod:`oblr.train.interrupts`; SIGTERM is an interrupt like Ctrl-C during a
run), and ``self._done`` keeps the last completed step with the RNG state from its end, so the checkpoint
written after Ctrl-C or SIGTERM is the one an uninterrupted run would have written. summary.json is written on every exit path and describes what metrics.jsonl holds.
docs/faults.md lists what happens on each fault.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

from oblr.config import Config, ConfigError, save_config
from oblr.distributed import (
    all_gather_cat,
    all_gather_objects,
    all_reduce_sum,
    broadcast_object,
    clip_grads_,
    data_parallel_clipped_gradient,
    data_parallel_gradient,
    grad_sq_norm,
    prompt_slice,
    rank_seed,
    shutdown,
    split_evenly,
)
from oblr.logprobs import logprob_gap
from oblr.params import trainable_params
from oblr.provenance import CODE_FILE, code_identity, code_record
from oblr.rollout import generate_and_score, make_engine
from oblr.schedules import make_lr_controller
from oblr.tasks import get_task, reward_scorer
from oblr.tasks.base import RewardFailures, task_accepts
from oblr.tracking.metrics import METRICS_FILE, set_aside_damaged_tail
from oblr.train import checkpoint as ckpt
from oblr.train.evaluation import heldout_eval, sample_rows, write_samples
from oblr.train.interrupts import hold_interrupts, sigint_deferred, sigterm_as_interrupt
from oblr.train.optimizers import make_optimizer
from oblr.train.ranks import shared_run_dir, start
from oblr.train.run_dir import check_writable, lock_run_dir, resolve_run_dir
from oblr.update import UpdateSettings


class TrainingError(RuntimeError):
    pass


class _NoLogger:
    """What ranks other than 0 log to: nothing."""

    def log(self, step, metrics) -> None:
        pass

    def close(self) -> None:
        pass


def _to_float(v):
    if isinstance(v, torch.Tensor):
        v = v.detach().float().item()
    return float(v)


class Trainer:
    def __init__(self, cfg: Config, *, resume: bool = False, quiet: bool = False, or_start: bool = False):
        self.cfg, self.resume, self.or_start = cfg, resume or or_start, or_start
        self.dist, self.parallel = start(cfg)  # one-line refusals of a bad setup, before anything loads
        self.quiet = quiet or not self.dist.is_main
        self.run_dir = shared_run_dir(lambda: resolve_run_dir(cfg, resume=self.resume, or_start=or_start), self.dist)
        self._saved_step = -1  # step of the newest checkpoint of this run (-1: none)
        self._done = {"step": 0, "rng": None, "metrics": None, "logged": True}  # the last completed step

    # ------------------------------------------------------------------------------------------ setup
    def _setup(self) -> None:
        from oblr.models import enable_activation_checkpointing, load_model_and_tokenizer, wrap_lora
        from oblr.tracking import MetricsLogger, ProgressDisplay

        cfg = self.cfg
        try:  # transformers 5 prints a progress bar for every save/load of a tiny checkpoint
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:  # pragma: no cover
            pass
        if cfg.train.threads > 0:
            cores = os.cpu_count() or 1
            if cfg.train.threads > cores:
                self._warn(f"train.threads={cfg.train.threads} exceeds this machine's {cores} CPU cores; threads "
                           f"will compete for them")
            torch.set_num_threads(cfg.train.threads)
        if cfg.algorithm.lr_schedule == "auto" and cfg.optim.optimizer == "sgd":
            self._warn("algorithm.lr_schedule=auto with optim.optimizer=sgd: measured to fail there (held-out accuracy "
                       "far below a tuned fixed rate, docs/algorithm.md); it is meant for AdamW")
        # data first: a malformed data file fails before a model loads
        self.task = get_task(cfg.task.name, **cfg.task.options)
        if len(self.task.train) < cfg.rollout.prompts_per_step:
            raise ConfigError(f"config key 'rollout.prompts_per_step': {cfg.rollout.prompts_per_step} exceeds the "
                              f"{len(self.task.train)} training prompts of task {cfg.task.name!r}")
        self.eval_examples = self.task.eval[: cfg.task.eval_size]
        self.device = self.dist.device
        torch.manual_seed(cfg.train.seed)
        self.model, self.tokenizer = load_model_and_tokenizer(self._model_name(), dtype=cfg.model.dtype,
                                                              device=str(self.device),
                                                              trust_remote_code=cfg.model.trust_remote_code)
        if task_accepts(cfg.task.name, "tokenizer") and "tokenizer" not in cfg.task.options:
            # prompts rendered with the model's chat template when the task's template asks for it ("auto"),
            # exactly as `oblr eval` renders them; the data was already validated above
            self.task = get_task(cfg.task.name, **cfg.task.options, tokenizer=self.tokenizer)
            self.eval_examples = self.task.eval[: cfg.task.eval_size]
        m, o = cfg.model, cfg.optim
        if m.activation_checkpointing:  # a model that cannot checkpoint is refused here, before any step
            enable_activation_checkpointing(self.model)
        if m.lora_rank > 0:
            self.model = wrap_lora(self.model, rank=m.lora_rank, alpha=m.lora_alpha, targets=m.lora_targets)
        self.ref_model = None
        if cfg.algorithm.kl_coef > 0:  # the initial weights, placed like the policy (fsdp: sharded too)
            self.ref_model = self.parallel.prepare(copy.deepcopy(self.model).eval().requires_grad_(False))
        self.model = self.parallel.prepare(self.model)  # ddp: rank 0's weights on every rank; fsdp: shards
        torch.manual_seed(rank_seed(cfg.train.seed, self.dist.rank))  # sampling differs per rank
        self.optimizer = make_optimizer(o.optimizer, trainable_params(self.model), o)
        self.lr_ctrl = make_lr_controller(cfg.algorithm.lr_schedule, self.optimizer, lr=o.lr, eta_min=o.eta_min,
                                          warmup_steps=o.warmup_steps, total_steps=cfg.train.steps, ema=o.snr_ema,
                                          grad_clip=o.grad_clip, **cfg.algorithm.schedule_options)
        self.settings = UpdateSettings.from_config(cfg, schedule_needs_snr=self.lr_ctrl.needs_snr)
        self.start_step = 0
        self.history: dict = {"eval": []}
        main = self.dist.is_main
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if not (self.resume and self._restore()) and main:
            save_config(cfg, self.run_dir / "config.yaml")
        if main:  # which code makes (this segment of) the run
            ckpt.write_text_atomic(self.run_dir / CODE_FILE, code_record(self.run_dir, self.start_step))
        # built with the restored weights; sync_weights after every optimizer step keeps it on-policy
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, batch_size=cfg.rollout.batch_size,
                                  **cfg.rollout.engine_options)
        self.logger = MetricsLogger(self.run_dir, tensorboard=cfg.train.tensorboard, wandb=cfg.train.wandb,
                                    config=cfg.to_dict(), resume=self.start_step if self._saved_step >= 0 else False) \
            if main else _NoLogger()
        self.progress = None if self.quiet else ProgressDisplay(cfg.train.steps)
        self.reward_failures = RewardFailures()
        self.score = reward_scorer(self.task, self.reward_failures)
        self.bad_steps = 0

    def _restore(self) -> bool:
        """Load the newest intact checkpoint (rank 0 chooses it, every rank loads it); False (and the run
        restarts from step 0) when there is none."""
        main = self.dist.is_main
        path = self._resume_point() if main else None
        path = broadcast_object(None if path is None else str(path))
        if path is None:
            if not self.or_start:
                raise ConfigError(f"--resume: no intact checkpoint in {self.run_dir} (see the warnings above), so "
                                  f"there is nothing to resume; --resume-or-start would start from step 0")
            metrics = self.run_dir / "metrics.jsonl"
            if main and metrics.is_file():  # the rows of the attempt that saved nothing are kept aside
                metrics.replace(self.run_dir / "metrics.jsonl.restarted")
            self._log(f"no checkpoint in {self.run_dir}; starting from step 0 (--resume-or-start)")
            return False
        path = Path(path)
        state = ckpt.load_trainer_state(path)
        self.parallel.load_state(path, self.model, self.optimizer, state)  # fsdp: every rank its shards
        saved_world = state.get("world_size", 1)
        if saved_world != self.dist.world_size:
            self._warn(f"warning: checkpoint {path} was written by {saved_world} process(es), this run has "
                       f"{self.dist.world_size}: it continues, but not on the trajectory of the run that wrote it "
                       "(the ranks' sampling streams differ)")
        self.lr_ctrl.load_state_dict(state["lr_controller"])
        self.start_step = state["step"]
        self.history = state.get("history", self.history)
        ranks = state.get("rng_ranks")  # every rank's sampling state (a distributed run's checkpoint)
        ckpt.set_rng_state(ranks[self.dist.rank] if ranks and len(ranks) == self.dist.world_size else state["rng"])
        self._saved_step = self.start_step
        self._log(f"resumed from {path} at step {self.start_step}")
        return True

    def _resume_point(self) -> Path | None:
        """The checkpoint to resume from (rank 0). A damaged last record of metrics.jsonl (a crash or a full
        disk mid-write) is kept aside in ``metrics.jsonl.damaged`` and reported; when its step is at or before
        the newest checkpoint, the run resumes from an earlier checkpoint so that the step is re-run and its
        record rebuilt, or, with none, it is refused (the record could not be rebuilt)."""
        damaged = set_aside_damaged_tail(self.run_dir / METRICS_FILE)
        path = ckpt.latest_checkpoint(self.run_dir, deep=True, warn=self._warn)
        if damaged is None:
            return path
        step, text = damaged
        where = self.run_dir / (METRICS_FILE + ".damaged")
        if path is None or step is None or step > ckpt.checkpoint_step(path):
            self._warn(f"warning: the last record of {self.run_dir / METRICS_FILE} was damaged (step "
                       f"{'?' if step is None else step}, {len(text)} bytes); kept aside in {where}; that step is "
                       f"re-run from the checkpoint")
            return path
        earlier = ckpt.latest_checkpoint(self.run_dir, deep=True, warn=self._warn, before=step)
        if earlier is None:
            raise TrainingError(f"the record of step {step} in {self.run_dir / METRICS_FILE} is damaged (kept "
                                f"aside in {where}) and no checkpoint before step {step} exists to re-run it; "
                                f"resuming would leave metrics.jsonl without that step")
        self._warn(f"warning: the record of step {step} in {self.run_dir / METRICS_FILE} was damaged; kept aside in "
                   f"{where}; resuming from {earlier} so that step {step} is re-run and its record rebuilt")
        return earlier

    # ------------------------------------------------------------------------------------------ pieces
    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[oblr] {msg}", flush=True)

    def _warn(self, msg: str) -> None:
        print(f"[oblr] {msg}", file=sys.stderr, flush=True)

    def _prompt_indices(self, step: int) -> list[int]:
        """N training prompts for ``step``: an epoch-wise shuffle that depends only on (seed, step)."""
        n_train, N = len(self.task.train), self.cfg.rollout.prompts_per_step
        out = []
        for pos in range(step * N, (step + 1) * N):
            epoch, i = divmod(pos, n_train)
            g = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + epoch)
            out.append(int(torch.randperm(n_train, generator=g)[i]))
        return out

    def evaluate(self, step: int) -> dict:
        """Held-out accuracy: sampled (rollout temperature, fixed seed) and greedy. Training RNG untouched."""
        if not self.eval_examples:
            return {}
        cfg, t0 = self.cfg, time.perf_counter()
        rng = ckpt.rng_state()
        self.model.eval()
        k, d = cfg.train.eval_samples, self.dist
        exs = self.eval_examples[split_evenly(len(self.eval_examples), d.world_size, d.rank)]  # this rank's share
        with self.parallel.generation(self.model):  # ranks' shares differ in size: no collective inside
            h = heldout_eval(self.engine, exs, self.score, samples=k, max_new_tokens=cfg.rollout.max_new_tokens,
                             temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                             seed=rank_seed(cfg.train.seed + 12345, d.rank), greedy=cfg.train.eval_greedy)
        gathered = all_gather_objects(list(zip(h.scores, h.lengths)))
        out = {"eval/accuracy_sampled": sum(s for s, _ in gathered) / len(gathered),
               "eval/response_length_mean": sum(n for _, n in gathered) / len(gathered)}
        rows = all_gather_objects(sample_rows(h))
        if cfg.train.eval_greedy:
            out["eval/accuracy_greedy"] = sum(r["reward"] for r in rows) / len(rows)
        ckpt.set_rng_state(rng)
        if d.is_main:
            write_samples(self.run_dir, step, rows)
        out["time/eval"] = time.perf_counter() - t0
        return out

    def train_step(self, step: int) -> dict:
        cfg, times = self.cfg, {}
        G, d = cfg.rollout.group_size, self.dist
        block = prompt_slice(cfg.rollout.prompts_per_step, d.world_size, d.rank)  # this rank's whole groups
        N = block.stop - block.start
        t0 = time.perf_counter()
        examples = [self.task.train[i] for i in self._prompt_indices(step)[block]]
        self.model.eval()
        failures_before = self.reward_failures.count
        timed = {}  # generation and scoring timed apart

        def score(responses, rows):
            timed["generated"] = time.perf_counter()
            return self.score(responses, rows)

        with self.parallel.generation(self.model):  # fsdp: the whole model for the decoding loop
            batch, rewards = generate_and_score(self.engine, examples, score, num_samples=G,
                                                max_new_tokens=cfg.rollout.max_new_tokens,
                                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p)
        rewards = rewards.view(N, G)
        times["time/generate"] = timed["generated"] - t0
        times["time/score"] = time.perf_counter() - timed["generated"]

        t2 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        up = data_parallel_gradient(self.model, batch, rewards.to(self.device), self.settings, self.parallel,
                                    ref_model=self.ref_model)
        res = up.update
        metrics = dict(res.metrics)
        if batch.sampler_logprobs is not None:  # on-policy check; the update used the trainer's own log-probs
            metrics.update(logprob_gap(batch.sampler_logprobs.to(self.device), res.old_logprobs,
                                       batch.response_mask.to(self.device)))
        grad_sq = res.grad_sq_norm  # of the gradient about to be applied, over all ranks
        times["time/norms"] = time.perf_counter() - t2

        with sigint_deferred():  # from here the step changes state: it completes, or Ctrl-C waits for it
            return self._finish_step(step, batch, rewards, up, grad_sq, metrics, times, t0, failures_before)

    def _finish_step(self, step, batch, rewards, up, grad_sq, metrics, times, t0, failures_before) -> dict:
        """The update and the step's metrics (runs with Ctrl-C held back); marks the step completed."""
        cfg, res = self.cfg, up.update
        params = trainable_params(self.model)
        t3 = time.perf_counter()
        finite = bool(torch.isfinite(grad_sq)) and bool(torch.isfinite(torch.as_tensor(metrics["optim/loss"])))
        metrics["optim/grad_norm"] = grad_sq.sqrt()
        if finite:
            self.bad_steps = 0
            self.lr_ctrl.step(res.snr)
            if cfg.optim.grad_clip > 0:
                clip_grads_(params, cfg.optim.grad_clip, grad_sq)
            self.optimizer.step()
            for _ in range(cfg.algorithm.epochs - 1):
                self.optimizer.zero_grad(set_to_none=True)
                metrics.update(data_parallel_clipped_gradient(self.model, batch, res, self.settings, self.parallel,
                                                              up.totals))
                if cfg.optim.grad_clip > 0:
                    clip_grads_(params, cfg.optim.grad_clip, grad_sq_norm(params))
                self.optimizer.step()
            t_sync = time.perf_counter()
            self.engine.sync_weights(self.model)  # the next rollouts (and evals) use the updated weights
            times["time/sync"] = time.perf_counter() - t_sync
        else:
            self.bad_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        metrics["optim/skipped"] = 0.0 if finite else 1.0
        if res.snr is not None and not self.lr_ctrl.needs_snr:  # algorithm.track_snr with a fixed schedule
            metrics.update(res.snr.metrics())
        metrics.update(self.lr_ctrl.metrics())
        metrics["optim/lr"] = self.lr_ctrl.get_last_lr()[0]
        times["time/update"] = time.perf_counter() - t3

        # the global batch's rewards and lengths (rank order = prompt order); reward failures summed
        rewards, lens = all_gather_cat(rewards.to(self.device)), all_gather_cat(batch.response_lengths.float())
        finished = all_gather_cat(batch.finished.to(torch.uint8)).bool()
        failures = all_reduce_sum(torch.tensor(float(self.reward_failures.count - failures_before)))
        metrics.update({
            "train/reward_mean": rewards.mean(),
            "train/pass_rate": (rewards >= 1.0 - 1e-6).float().mean(),
            "train/pass_at_g": (rewards >= 1.0 - 1e-6).any(1).float().mean(),
            "train/all_equal_share": (rewards.max(1).values == rewards.min(1).values).float().mean(),
            "train/response_length_mean": lens.mean(), "train/response_length_max": lens.max(),
            "train/truncated_share": (~finished).float().mean(),
            "train/reward_failures": failures,
        })
        times["time/step"] = time.perf_counter() - t0
        metrics.update(times)
        out = {k: _to_float(v) for k, v in metrics.items()}
        self._done = {"step": step + 1, "rng": ckpt.rng_state(), "metrics": out, "logged": False}
        if not finite and self.bad_steps >= cfg.train.max_bad_steps:
            self._commit(step + 1, out)
            raise TrainingError(f"{self.bad_steps} consecutive steps had a non-finite loss or gradient; stopping. "
                                f"The last checkpoint in {self.run_dir / 'checkpoints'} is intact.")
        return out

    def save(self, step: int) -> None:
        """Checkpoint the state after ``step``, the last completed step: every rank's RNG state from the end
        of that step (not of the moment, which a Ctrl-C inside the next step has moved on). ddp: the
        replicated weights and optimizer state from rank 0; fsdp: every rank its shards (the strategy's
        ``save_state``, :mod:`oblr.distributed.parallel`). Every rank calls it."""
        done = self._done["step"] == step and self._done["rng"] is not None
        rng = self._done["rng"] if done else ckpt.rng_state()
        rng_ranks = all_gather_objects([rng])
        state = {"lr_controller": self.lr_ctrl.state_dict(), "history": self.history, "config": self.cfg.to_dict(),
                 "rng_ranks": rng_ranks, "rng": rng, "world_size": self.dist.world_size}
        self.parallel.save_state(self.run_dir, step, self.model, self.tokenizer, self.optimizer, state,
                                 keep=self.cfg.train.keep_checkpoints, final=step == self.cfg.train.steps)
        self._saved_step = step

    def _commit(self, step: int, metrics: dict) -> None:
        """Log a row and, with it, its evaluation into the history the summary is built from."""
        with sigint_deferred():
            self.logger.log(step, metrics)
            evals = {k: v for k, v in metrics.items() if k.startswith("eval/") or k == "time/eval"}
            if evals:
                self.history["eval"].append({"step": step, **evals})
            if self._done["step"] == step:
                self._done["logged"] = True

    def _last_good(self) -> str:
        last = ckpt.latest_checkpoint(self.run_dir)
        return f"the last good checkpoint {last} is intact" if last else "no checkpoint was saved"

    def _on_interrupt(self) -> str:
        """After Ctrl-C: log the completed step if it was not yet, checkpoint it if it was not yet; says what
        happened."""
        done, resume = self._done, f"resume with --resume --output-dir {self.run_dir}"
        if done["metrics"] is not None and not done["logged"]:
            self._commit(done["step"], done["metrics"])
        if done["step"] > max(self._saved_step, 0):
            self.save(done["step"])
            return f"interrupted after step {done['step']}; checkpoint saved; {resume}"
        if self._saved_step >= 0:
            return f"interrupted after step {done['step']}, whose checkpoint was already saved; {resume}"
        return (f"interrupted before the first step completed; no checkpoint was saved "
                f"(--resume-or-start --output-dir {self.run_dir} starts from step 0)")

    # ------------------------------------------------------------------------------------------ loop
    def run(self) -> dict:
        wall0 = time.perf_counter()
        # rank 0 owns the folder: held until the run ends; the kernel frees it if the process dies
        lock = lock_run_dir(self.run_dir) if self.dist.is_main else None
        self._release_hold = None
        try:
            with sigterm_as_interrupt():  # SIGTERM takes Ctrl-C's path: last completed step saved, summary written
                return self._run(wall0)
        finally:
            if self._release_hold is not None:  # Ctrl-C during the wrap-up was held back until here
                self._release_hold()
            if lock is not None:
                lock.close()

    def _model_name(self) -> str:
        """``model.name_or_path``; plain ``builtin`` with a task that has its own built-in model is that model."""
        from oblr.models.task_builtins import builtin_for_task

        return builtin_for_task(self.cfg.model.name_or_path, self.cfg.task.name)

    def _check_model_cache(self) -> None:
        """A built-in model that must be built needs a writable cache: checked before any work starts. Under
        torchrun, local rank 0 builds it and the node's other ranks wait for the finished build (ranks that
        built at once raced in the cache folder: one read it while another replaced it)."""
        from oblr.models import builtin_model_dir, is_builtin, resolve_model_path, task_model_dir
        from oblr.models.builtin import is_current_build
        from oblr.models.task_builtins import is_current, spec_of

        name = self._model_name()
        spec = spec_of(name)
        if spec is not None:
            path = task_model_dir(spec)
            if not is_current(path, spec):
                check_writable(path.parent, "the built-in model must be built, but its cache folder",
                               hint="set OBLR_CACHE_DIR to a writable folder")
                if self.dist.distributed and self.dist.local_rank == 0:
                    resolve_model_path(name)
                deadline = time.monotonic() + self.cfg.distributed.timeout_s
                while self.dist.distributed and not is_current(path, spec):
                    if time.monotonic() > deadline:
                        raise TrainingError(f"rank {self.dist.rank} waited for local rank 0 to build {name}")
                    time.sleep(1.0)
            return
        if not is_builtin(name) or is_current_build(builtin_model_dir()):
            return
        check_writable(builtin_model_dir().parent, "the built-in model must be built, but its cache folder",
                       hint="set OBLR_CACHE_DIR to a writable folder")
        if not self.dist.distributed:
            return  # built when it loads
        if self.dist.local_rank == 0:
            resolve_model_path(self.cfg.model.name_or_path)
            return
        deadline = time.monotonic() + self.cfg.distributed.timeout_s  # torchrun stops this rank if rank 0 fails
        while not is_current_build(builtin_model_dir()):
            if time.monotonic() > deadline:
                raise TrainingError(f"rank {self.dist.rank} waited {self.cfg.distributed.timeout_s:.0f} s "
                                    f"(distributed.timeout_s) for local rank 0 to build the built-in model "
                                    f"into {builtin_model_dir()}")
            time.sleep(1.0)

    def _run(self, wall0: float) -> dict:
        main = self.dist.is_main
        if main and self.cfg.train.output_dir:
            resolve_run_dir(self.cfg, resume=self.resume, or_start=self.or_start)  # again, now that this process holds the folder
        removed = ckpt.remove_orphans(self.run_dir) if main else []
        if removed:
            self._warn(f"removed {len(removed)} unfinished checkpoint folder(s) left by a crash: {', '.join(removed)}")
        self._check_model_cache()
        self._setup()
        cfg, t = self.cfg, self.cfg.train
        step = self.start_step
        self._done = {"step": step, "rng": ckpt.rng_state(), "metrics": None, "logged": True}
        self._log(f"run folder: {self.run_dir}  ({cfg.algorithm.baseline} baseline, {cfg.algorithm.lr_schedule} lr, "
                  f"N={cfg.rollout.prompts_per_step} G={cfg.rollout.group_size}, {t.steps} steps, device {self.device})")
        status = "failed"
        try:
            if step == 0 and not self.history["eval"]:
                self._commit(0, self.evaluate(0))
            while step < t.steps:
                metrics = self.train_step(step)
                step += 1
                if (t.eval_every and step % t.eval_every == 0) or step == t.steps:
                    metrics.update(self.evaluate(step))
                self._commit(step, metrics)
                if self.progress:
                    self.progress.update(step, metrics)
                if (t.save_every and step % t.save_every == 0) or step == t.steps:
                    self.save(step)
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            self._release_hold = hold_interrupts(
                f"[oblr] interrupted again: still saving the last completed step ({self._done['step']}); "
                f"further Ctrl-C is ignored until it is written (kill -9 stops at once, losing it)")
            self._log(self._on_interrupt())
            raise
        except OSError as e:  # a full disk, a folder made read-only under the run
            status = "failed"
            raise TrainingError(f"cannot write in {self.run_dir}: {e.strerror or e}"
                                f"{f' ({e.filename})' if e.filename else ''}; {self._last_good()}") from None
        finally:
            close_error = None
            try:
                if self.progress:
                    self.progress.close()
                self.logger.close()
            except OSError as e:  # the last buffered metrics refused (a full disk)
                close_error = e
            self.engine.close()
            failed_on_close = close_error is not None and status == "completed"
            if failed_on_close:
                status = "failed"
            summary = self._summary(self._done["step"], time.perf_counter() - wall0, status)
            if status != "completed" and main:
                try:  # best effort: the disk may be the reason the run stopped
                    ckpt.write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
                except OSError:
                    pass
            if failed_on_close:  # (if the run was already stopping on an error, that one is reported)
                raise TrainingError(f"cannot write in {self.run_dir}: {close_error.strerror or close_error}; "
                                    f"{self._last_good()}") from None
        shutdown()
        if not main:
            return summary
        if t.plots:
            from oblr.experiments.report import plot_run

            summary["plots"] = [str(p) for p in plot_run(self.run_dir)]
        ckpt.write_text_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        self._print_summary(summary)
        return summary

    def _summary(self, steps: int, wall: float, status: str = "completed") -> dict:
        """The run's summary, from what metrics.jsonl holds: ``steps`` logged, the evaluations logged."""
        evals = self.history["eval"]
        s = {"run_dir": str(self.run_dir), "status": status, "baseline": self.cfg.algorithm.baseline,
             "lr_schedule": self.cfg.algorithm.lr_schedule, "seed": self.cfg.train.seed, "steps": steps,
             "wall_seconds": round(wall, 1), "eval_metric": "accuracy_sampled", "code": code_identity()}
        for kind in ("sampled", "greedy"):
            vals = [e[f"eval/accuracy_{kind}"] for e in evals if f"eval/accuracy_{kind}" in e]
            if vals:
                prefix = "eval_accuracy" if kind == "sampled" else "eval_accuracy_greedy"
                s[f"{prefix}_initial"], s[f"{prefix}_final"], s[f"{prefix}_best"] = vals[0], vals[-1], max(vals)
        return s

    def _print_summary(self, s: dict) -> None:
        if self.quiet:
            return
        lines = [f"done: {s['steps']} steps in {s['wall_seconds']:.0f} s, run folder {s['run_dir']}"]
        for kind, prefix in (("sampled", "eval_accuracy"), ("greedy", "eval_accuracy_greedy")):
            if f"{prefix}_initial" in s:
                lines.append(f"held-out accuracy ({kind}): {100 * s[prefix + '_initial']:.1f}% -> "
                             f"{100 * s[prefix + '_final']:.1f}% (best {100 * s[prefix + '_best']:.1f}%)")
        if s.get("plots"):
            lines.append(f"plots: {Path(s['plots'][0]).parent}")
        print("\n".join("[oblr] " + ln for ln in lines), flush=True)


def train(cfg: Config, *, resume: bool = False, quiet: bool = False, or_start: bool = False) -> dict:
    """Run training from a validated config; returns the summary dict (also in run_dir/summary.json).
    ``resume``: continue the run in the output folder (there must be a checkpoint); ``or_start``: resume if
    there is something to resume, else start from step 0."""
    return Trainer(cfg, resume=resume, quiet=quiet, or_start=or_start).run()

