"""A run's setup, the part of :class:`oblr.train.trainer.Trainer` that runs once before the loop: threads,
the task (data checked before a model loads), the memory plan (:mod:`oblr.train.plan`, from the model's config
and tokenizer, no weights), the model and its placement, the optimizer and learning-rate schedule, the resume
from the newest intact checkpoint, the run's record, the rollout engine and the metric sinks.

:class:`RunSetup` is the trainer's base class: :meth:`RunSetup._setup` sets the attributes the loop reads
(``task``, ``plan``, ``model``, ``tokenizer``, ``ref_model``, ``optimizer``, ``lr_ctrl``, ``settings``,
``start_step``, ``history``, ``engine``, ``logger``, ``progress``, ``score``, ...) on the trainer that
:meth:`Trainer.__init__` made (``cfg``, ``dist``, ``parallel``, ``run_dir``, ``resume``, ``or_start``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from oblr.config import ConfigError
from oblr.distributed import broadcast_object, rank_seed
from oblr.models.task_builtins import builtin_for_task
from oblr.params import trainable_params
from oblr.rollout import make_engine
from oblr.schedules import make_lr_controller
from oblr.tasks import get_task, reward_scorer
from oblr.tasks.base import RewardFailures, task_accepts
from oblr.tasks.templates import no_fallback_warning
from oblr.tracking.sinks import open_sinks
from oblr.train import checkpoint as ckpt
from oblr.train import run_dir as rundir
from oblr.train.advice import settings_warnings
from oblr.train.optimizers import make_optimizer
from oblr.train.plan import apply_plan, check_checkpointing, plan_run, prompt_tokens
from oblr.train.threads import choose_threads, remember, torch_default
from oblr.update import UpdateSettings


class RunSetup:
    """The setup of a run and its output lines; :class:`oblr.train.trainer.Trainer` adds the loop."""

    def _setup(self) -> None:
        # oblr.models looked up when the run starts (tests replace its loader)
        from oblr.models import load_model_and_tokenizer, place_for_training, quiet_hf_progress

        cfg, main = self.cfg, self.dist.is_main
        quiet_hf_progress()
        for warning in settings_warnings(cfg):
            self._warn(warning)
        default = torch_default(torch.get_num_threads())
        threads, said = choose_threads(cfg.train.threads, default)  # 0: the cores other work leaves free
        if threads is not None:
            torch.set_num_threads(threads)
            remember(default, threads)
        if said and main:
            self._log(said)
        # data first: a malformed data file fails before a model loads
        needs_tokenizer = task_accepts(cfg.task.name, "tokenizer") and "tokenizer" not in cfg.task.options
        with no_fallback_warning() if needs_tokenizer else contextlib.nullcontext():
            # prompts built here are rebuilt with the model's tokenizer below: no "no chat template" warning
            self.task = get_task(cfg.task.name, **cfg.task.options)
        if len(self.task.train) < cfg.rollout.prompts_per_step:
            raise ConfigError(f"config key 'rollout.prompts_per_step': {cfg.rollout.prompts_per_step} exceeds the "
                              f"{len(self.task.train)} training prompts of task {cfg.task.name!r}")
        self.device = self.dist.device
        self.plan = self._memory_plan()  # before the weights load: refusals of a plan or checkpointing here
        run_cfg = apply_plan(cfg, self.plan)  # the plan's checkpointing and micro-batch (cfg as the user wrote it)
        torch.manual_seed(cfg.train.seed)
        # fsdp's meta_init: parameters on the meta device, each rank's shards filled when the model is sharded
        empty = bool(getattr(self.parallel, "meta_init", False))
        self.model, self.tokenizer = load_model_and_tokenizer(self._model_name(), dtype=cfg.model.dtype,
                                                              device=str(self.device),
                                                              trust_remote_code=cfg.model.trust_remote_code,
                                                              **({"empty": True} if empty else {}))
        if empty and main and not any(p.device.type == "meta" for p in self.model.parameters()):
            self._log("distributed.options.meta_init: the model has no safetensors weights to read on rank 0; "
                      "every rank loaded it in full before sharding")
        if needs_tokenizer:
            # prompts rendered with the model's chat template when the task's template asks for it ("auto"),
            # exactly as `oblr eval` renders them; the data was already validated above
            self.task = get_task(cfg.task.name, **cfg.task.options, tokenizer=self.tokenizer)
        self.eval_examples = self.task.eval[: cfg.task.eval_size]
        self.model, self.ref_model = place_for_training(self.model, run_cfg, self.parallel)  # LoRA, ddp/fsdp, KL ref
        o = cfg.optim
        torch.manual_seed(rank_seed(cfg.train.seed, self.dist.rank))  # sampling differs per rank
        self.optimizer = make_optimizer(o.optimizer, trainable_params(self.model), o)
        self.lr_ctrl = make_lr_controller(cfg.algorithm.lr_schedule, self.optimizer, lr=o.lr, eta_min=o.eta_min,
                                          warmup_steps=o.warmup_steps, total_steps=cfg.train.steps, ema=o.snr_ema,
                                          grad_clip=o.grad_clip, prompts_per_step=cfg.rollout.prompts_per_step,
                                          **cfg.algorithm.schedule_options)
        self.settings = UpdateSettings.from_config(run_cfg, schedule_needs_snr=self.lr_ctrl.needs_snr)
        self.measure_step_kl = cfg.algorithm.track_step_kl or getattr(self.lr_ctrl, "needs_step_kl", False)
        self.start_step, self.history = 0, {"eval": []}
        if main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        restored = self.resume and self._restore()
        if main:
            rundir.record_run(self.run_dir, cfg, self.start_step, config=not restored,
                              start_model=self._start_model() if self.start_step == 0 else None)
        # built with the restored weights; sync_weights after every optimizer step keeps it on-policy
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, batch_size=cfg.rollout.batch_size,
                                  **cfg.rollout.engine_options)
        self.logger, self.progress = open_sinks(self.run_dir, cfg, main=main, quiet=self.quiet,
                                                resume_step=self.start_step if self._saved_step >= 0 else None)
        self.reward_failures = RewardFailures()
        self.score = reward_scorer(self.task, self.reward_failures)
        self.bad_steps = 0

    def _memory_plan(self):
        """The memory plan (:mod:`oblr.train.plan`; None for ``algorithm.memory_plan: none``) from the model's
        config and tokenizer, no weights; also refuses checkpointing on a model that cannot checkpoint."""
        cfg = self.cfg
        if (cfg.algorithm.memory_plan == "none" and not cfg.model.activation_checkpointing
                and not cfg.model.logit_chunk_tokens):
            return None
        from transformers import AutoConfig, AutoTokenizer

        from oblr.models import resolve_model_path

        path = resolve_model_path(self._model_name())
        hf_config = AutoConfig.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
        if cfg.model.activation_checkpointing:
            check_checkpointing(hf_config)
        if cfg.model.logit_chunk_tokens:
            from oblr.logprobs import check_chunkable

            try:
                check_chunkable(getattr(hf_config, "model_type", None), "config key 'model.logit_chunk_tokens'")
            except ValueError as e:
                raise ConfigError(str(e)) from None
        if cfg.algorithm.memory_plan == "none":
            return None
        task = self.task
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
        if task_accepts(cfg.task.name, "tokenizer") and "tokenizer" not in cfg.task.options:
            task = get_task(cfg.task.name, **cfg.task.options, tokenizer=tokenizer)  # prompts as the run renders them
        return plan_run(cfg, hf_config, prompt_len=prompt_tokens(tokenizer, [ex.prompt for ex in task.train]),
                        world=self.dist.world_size,
                        device=self.device)

    def _restore(self) -> bool:
        """Load the newest intact checkpoint (rank 0 chooses it, every rank loads it); False (and the run
        restarts from step 0) when there is none."""
        main = self.dist.is_main
        path = rundir.resume_point(self.run_dir, self._warn) if main else None
        path = broadcast_object(None if path is None else str(path))
        if path is None:
            said = rundir.start_over(self.run_dir, or_start=self.or_start, main=main)  # damaged ones moved aside
            (self._warn if said.startswith("warning:") else self._log)(said)
            return False
        state = ckpt.restore_state(Path(path), self.parallel, self.model, self.optimizer, self.lr_ctrl, self.dist,
                                   self._warn)
        self.start_step, self.history = state["step"], state.get("history", self.history)
        self._saved_step = self.start_step
        self._log(f"resumed from {path} at step {self.start_step}")
        return True

    def _start_model(self) -> dict:
        """``{"name_or_path", "fingerprint"}`` of the weights this run starts from (code.json): the folder the
        tokenizer and weights were loaded from (None for a hub id)."""
        from oblr.provenance import model_fingerprint

        return {"name_or_path": self._model_name(),
                "fingerprint": model_fingerprint(src) if (src := getattr(self.tokenizer, "name_or_path", "")) else None}

    def _model_name(self) -> str:
        """``model.name_or_path``; plain ``builtin`` with a task that has its own built-in model is that model."""
        return builtin_for_task(self.cfg.model.name_or_path, self.cfg.task.name)

    # ------------------------------------------------------------------------------------ output
    def _log(self, msg: str) -> None:
        if not self.quiet:
            print(f"[oblr] {msg}", flush=True)

    def _warn(self, msg: str) -> None:
        print(f"[oblr] {msg}", file=sys.stderr, flush=True)
