"""The RL loop: prompts -> rollouts -> rewards -> gradient, norms, S, V -> learning rate -> optimizer step.

:class:`Trainer` reads top to bottom as the loop (:meth:`Trainer.run`, :meth:`Trainer.train_step`); its
setup, run once before the loop, is its base class :class:`oblr.train.setup.RunSetup`. It only wires pieces
that are plain functions or small objects, each tested on its own: the rollout engine (:mod:`oblr.rollout`),
the task's reward, the update core (:func:`oblr.distributed.data_parallel_gradient`
over :func:`oblr.update.accumulate_policy_gradient`), the schedule, the optimizer, the run folder
(:mod:`oblr.train.run_dir`), checkpoints (:mod:`oblr.train.checkpoint`, the strategy's save/load), the
step's metrics (:mod:`oblr.train.step_metrics`), evaluation (:mod:`oblr.train.evaluation`), the metric sinks
(:mod:`oblr.tracking.sinks`) and the summary (:mod:`oblr.train.summary`); docs/architecture.md follows one
step through it. Under torchrun (:mod:`oblr.train.ranks`) each rank generates its block of the step's
prompts, the update core gives the global gradient and S, V (the same learning rate on every rank),
evaluation is split over ranks and gathered, and rank 0 alone writes metrics, samples, plots and the summary.

A run holds its folder's lock from start to end. The state changes of a step (update, logging) run with
Ctrl-C and SIGTERM held back (:mod:`oblr.train.interrupts`; SIGTERM is an interrupt like Ctrl-C during a
run), and ``self._done`` keeps the last completed step with the RNG state from its end, so the checkpoint
written after Ctrl-C or SIGTERM is the one an uninterrupted run would have written. summary.json is written
on every exit path and describes what metrics.jsonl holds. docs/faults.md lists what happens on each fault.
"""

from __future__ import annotations

import time

import torch

from oblr.config import Config
from oblr.distributed import (
    all_gather_objects,
    clip_grads_,
    data_parallel_clipped_gradient,
    data_parallel_gradient,
    data_parallel_step_kl,
    grad_sq_norm,
    prompt_slice,
    shutdown,
)
from oblr.logprobs import logprob_gap
from oblr.params import trainable_params
from oblr.rollout import generate_and_score
from oblr.tasks.base import step_prompt_indices
from oblr.tracking.sinks import close_sinks
from oblr.train import checkpoint as ckpt
from oblr.train import run_dir as rundir
from oblr.train.errors import TrainingError
from oblr.train.evaluation import evaluate_on_ranks
from oblr.train.interrupts import hold_interrupts, sigint_deferred, sigterm_as_interrupt
from oblr.train.ranks import shared_run_dir, start
from oblr.train.setup import RunSetup
from oblr.train.step_metrics import as_floats, rollout_metrics
from oblr.train.summary import run_summary, summary_lines, write_summary

__all__ = ["Trainer", "TrainingError", "train"]


class Trainer(RunSetup):
    """The RL loop of a run (:meth:`run`, :meth:`train_step`); its setup is :class:`oblr.train.setup.RunSetup`."""

    def __init__(self, cfg: Config, *, resume: bool = False, quiet: bool = False, or_start: bool = False):
        self.cfg, self.resume, self.or_start = cfg, resume or or_start, or_start
        self.dist, self.parallel = start(cfg)  # one-line refusals of a bad setup, before anything loads
        self.quiet = quiet or not self.dist.is_main
        self.run_dir = shared_run_dir(lambda: rundir.resolve_run_dir(cfg, resume=self.resume, or_start=or_start),
                                      self.dist)
        self._saved_step = -1  # step of the newest checkpoint of this run (-1: none)
        self.plan = None  # the memory plan (oblr.train.plan), chosen in _setup before the weights load
        self._done = {"step": 0, "rng": None, "metrics": None, "logged": True}  # the last completed step

    # ---------------------------------------------------------------------------------- the loop
    def run(self) -> dict:
        wall0 = time.perf_counter()
        # rank 0 owns the folder: held until the run ends; the kernel frees it if the process dies
        lock = rundir.lock_run_dir(self.run_dir, resume=self.resume) if self.dist.is_main else None
        self._release_hold = None
        try:
            with sigterm_as_interrupt():  # SIGTERM takes Ctrl-C's path: last completed step saved, summary written
                return self._run(wall0)
        finally:
            if self._release_hold is not None:  # Ctrl-C during the wrap-up was held back until here
                self._release_hold()
            if lock is not None:
                lock.close()

    def _run(self, wall0: float) -> dict:
        main = self.dist.is_main
        if main:  # again, now that this process holds the folder
            rundir.prepare_run_dir(self.cfg, self.run_dir, resume=self.resume, or_start=self.or_start,
                                   warn=self._warn)
        from oblr.models import ensure_builtin_built

        try:
            ensure_builtin_built(self._model_name(), distributed=self.dist.distributed,
                                 local_rank=self.dist.local_rank, rank=self.dist.rank,
                                 timeout_s=self.cfg.distributed.timeout_s)
        except TimeoutError as e:
            raise TrainingError(str(e)) from None
        self._setup()
        cfg, t = self.cfg, self.cfg.train
        step = self.start_step
        self._done = {"step": step, "rng": ckpt.rng_state(), "metrics": None, "logged": True}
        self._log(f"run folder: {self.run_dir}  ({cfg.algorithm.baseline} baseline, {cfg.algorithm.lr_schedule} lr, "
                  f"N={cfg.rollout.prompts_per_step} G={cfg.rollout.group_size}, {t.steps} steps, device {self.device})")
        if self.plan is not None:
            self._log(self.plan.line())
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
            close_error = close_sinks(self.logger, self.progress)  # the last buffered metrics refused: a full disk
            self.engine.close()
            failed_on_close = close_error is not None and status == "completed"
            if failed_on_close:
                status = "failed"
            summary = run_summary(self.run_dir, cfg, self.history["eval"], self._done["step"],
                                  time.perf_counter() - wall0, status)
            if self.plan is not None:
                summary["memory_plan"] = self.plan.as_dict()
            if status != "completed" and main:  # best effort: the disk may be the reason the run stopped
                write_summary(self.run_dir, summary, best_effort=True)
            if failed_on_close:  # (if the run was already stopping on an error, that one is reported)
                raise TrainingError(f"cannot write in {self.run_dir}: {close_error.strerror or close_error}; "
                                    f"{self._last_good()}") from None
        shutdown()
        if not main:
            return summary
        if t.plots:
            from oblr.tracking.plots import plot_run

            summary["plots"] = [str(p) for p in plot_run(self.run_dir)]
        write_summary(self.run_dir, summary)
        if not self.quiet:
            print("\n".join("[oblr] " + ln for ln in summary_lines(summary)), flush=True)
        return summary

    def train_step(self, step: int) -> dict:
        cfg, times = self.cfg, {}
        G, d = cfg.rollout.group_size, self.dist
        block = prompt_slice(cfg.rollout.prompts_per_step, d.world_size, d.rank)  # this rank's whole groups
        N = block.stop - block.start
        t0 = time.perf_counter()
        order = step_prompt_indices(cfg.train.seed, step, len(self.task.train), cfg.rollout.prompts_per_step)
        examples = [self.task.train[i] for i in order[block]]
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
        times["time/norms"] = time.perf_counter() - t2

        with sigint_deferred():  # from here the step changes state: it completes, or Ctrl-C waits for it
            return self._finish_step(step, batch, rewards, up, metrics, times, t0, failures_before)

    def _finish_step(self, step, batch, rewards, up, metrics, times, t0, failures_before) -> dict:
        """The update and the step's metrics (runs with Ctrl-C held back); marks the step completed.
        ``up.grad_sq`` is the ``||gbar||^2`` of the gradient about to be applied (over all ranks), ``up.snr``
        its S, V: the finite check, the schedule and clipping all read these."""
        cfg, res, grad_sq = self.cfg, up.update, up.grad_sq
        params = trainable_params(self.model)
        t3 = time.perf_counter()
        finite = bool(torch.isfinite(grad_sq)) and bool(torch.isfinite(torch.as_tensor(metrics["optim/loss"])))
        metrics["optim/grad_norm"] = grad_sq.sqrt()
        if finite:
            self.bad_steps = 0
            self.lr_ctrl.step(up.snr)
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
            if self.measure_step_kl:  # the policy's change over this update, on its own rows
                t_kl = time.perf_counter()
                kl = data_parallel_step_kl(self.model, batch, res.old_logprobs, self.settings, cfg.rollout.group_size)
                metrics["policy/step_kl"] = kl
                if getattr(self.lr_ctrl, "needs_step_kl", False):
                    self.lr_ctrl.observe_step_kl(kl)
                times["time/step_kl"] = time.perf_counter() - t_kl
            t_sync = time.perf_counter()
            self.engine.sync_weights(self.model)  # the next rollouts (and evals) use the updated weights
            times["time/sync"] = time.perf_counter() - t_sync
        else:
            self.bad_steps += 1
            self.optimizer.zero_grad(set_to_none=True)
        metrics["optim/skipped"] = 0.0 if finite else 1.0
        if up.snr is not None and not self.lr_ctrl.needs_snr:  # algorithm.track_snr with a fixed schedule
            metrics.update(up.snr.metrics())
        metrics.update(self.lr_ctrl.metrics())
        metrics["optim/lr"] = self.lr_ctrl.get_last_lr()[0]
        times["time/update"] = time.perf_counter() - t3

        failures = self.reward_failures.count - failures_before
        metrics.update(rollout_metrics(rewards, batch, failures, self.device))  # of the global batch
        times["time/step"] = time.perf_counter() - t0
        metrics.update(times)
        out = as_floats(metrics)
        self._done = {"step": step + 1, "rng": ckpt.rng_state(), "metrics": out, "logged": False}
        if not finite and self.bad_steps >= cfg.train.max_bad_steps:
            self._commit(step + 1, out)
            raise TrainingError(f"{self.bad_steps} consecutive steps had a non-finite loss or gradient; stopping. "
                                f"The last checkpoint in {self.run_dir / 'checkpoints'} is intact.")
        return out

    def evaluate(self, step: int) -> dict:
        """Held-out accuracy: sampled (rollout temperature, fixed seed) and greedy. Training RNG untouched."""
        if not self.eval_examples:
            return {}
        return evaluate_on_ranks(self.engine, self.parallel, self.model, self.eval_examples, self.score, self.cfg,
                                 self.dist, self.run_dir, step)

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
                                 keep=self.cfg.train.keep_checkpoints, final=step == self.cfg.train.steps, store=ckpt)
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

    def _last_good(self) -> str:
        last = ckpt.latest_checkpoint(self.run_dir)
        return f"the last good checkpoint {last} is intact" if last else "no checkpoint was saved"


def train(cfg: Config, *, resume: bool = False, quiet: bool = False, or_start: bool = False) -> dict:
    """Run training from a validated config; returns the summary dict (also in run_dir/summary.json).
    ``resume``: continue the run in the output folder (there must be a checkpoint); ``or_start``: resume if
    there is something to resume, else start from step 0."""
    return Trainer(cfg, resume=resume, quiet=quiet, or_start=or_start).run()
