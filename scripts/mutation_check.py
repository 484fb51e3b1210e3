"""Plant one realistic bug at a time in a scratch copy of the repository and run the suite on it.

    python scripts/mutation_check.py REPO_DIR PYTHON [NAME ...]     # -> mutation_results.jsonl (appended)
    python scripts/mutation_check.py REPO_DIR PYTHON --match kappa  # the mutations whose name contains a word
    python scripts/mutation_check.py REPO_DIR PYTHON --no-suite ... # likely tests only, never the whole suite
    python scripts/mutation_check.py REPO_DIR PYTHON --own-tests ...# only each mutation's own likely tests
    python scripts/mutation_check.py --list                         # the mutations' names
    python scripts/mutation_check.py --table mutation_results.jsonl # the markdown table of docs/testing.md

Each mutation is an exact text replacement that must match once (a SKIP line says when the code moved).
The mutation's own likely tests run first, then the common likely tests (``-x`` each); the whole suite runs
only when they all pass, so a mutation that survives costs one full suite (``--no-suite`` records it as not
caught by the likely tests instead). A mutation is caught when pytest fails; the first failing test is
recorded. The scratch copy is a fresh temporary folder per mutation; the tests read the benchmark data from
``$OBLR_DATA_DIR`` if set, else from ``shared/data`` beside REPO_DIR (where ``oblr.tasks.loaders`` looks).
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

M = [
    # (name, quantity, file, old, new)
    ("cropped span one token short", "w_i, group norms, gradient (token windows)", "src/oblr/gradnorm/windows.py",
     "a, b = min(first[k] for k in live), max(last[k] for k in live)",
     "a, b = min(first[k] for k in live), max(last[k] for k in live) - 1",
     ["tests/gradnorm/test_gradnorm_windows.py"]),
    ("row windows not shifted into the cropped span", "w_i, group norms, gradient (token windows)",
     "src/oblr/gradnorm/windows.py",
     "f2 = [first[k] - a if last[k] > first[k] else 0 for k in range(len(first))]",
     "f2 = [first[k] if last[k] > first[k] else 0 for k in range(len(first))]",
     ["tests/gradnorm/test_gradnorm_windows.py"]),
    ("span-only crop one token short", "w_i, group norms, gradient (token windows)", "src/oblr/gradnorm/windows.py",
     "a, b = span\n", "a, b = span[0], span[1] - 1\n",
     ["tests/gradnorm/test_gradnorm_windows.py"]),
    ("token span from the probe alone", "w_i, group norms, gradient (token windows)", "src/oblr/gradnorm/windows.py",
     "        unknown = ~seen\n", "        unknown = ~seen & False\n",
     ["tests/gradnorm/test_gradnorm_windows.py"]),
    ("w_i without c_i^2", "w_i", "src/oblr/update.py",
     "book.sq_norms() * c.pow(2)", "book.sq_norms() * c"),
    ("advantage sign flipped in the update", "gradient", "src/oblr/update.py",
     "coeffs = -est.advantages.reshape(-1)", "coeffs = est.advantages.reshape(-1)"),
    ("g_k scaled by N instead of N^2", "S, V", "src/oblr/update.py",
     "* (n_total * n_total))", "* n_total)"),
    ("rows mapped to the wrong prompt in g_k", "per-prompt ||g_k||^2", "src/oblr/update.py",
     "torch.arange(k1 - k0, device=rmf.device).repeat_interleave(G)",
     "torch.arange(k1 - k0, device=rmf.device).repeat(G)"),
    ("KL term without c_i", "KL / loss", "src/oblr/update.py",
     "obj = obj + settings.kl_coef * c_mb * kl", "obj = obj + settings.kl_coef * kl"),
    ("entropy as a sum, not a token mean", "entropy", "src/oblr/update.py",
     'metrics["train/entropy"] = ent_sum / n_tok', 'metrics["train/entropy"] = ent_sum'),
    ("V divides by N instead of N-1", "V", "src/oblr/snr.py",
     "V = (total - n_prompts * mean_sq) / (n_prompts - 1)", "V = (total - n_prompts * mean_sq) / n_prompts"),
    ("signal without the -V/N correction", "S", "src/oblr/snr.py",
     "return _stats(mean_sq - V / n_prompts, V, int(n_prompts))", "return _stats(mean_sq, V, int(n_prompts))"),
    ("factor S/(S+V) instead of S/(S+V/N)", "lr factor", "src/oblr/snr.py",
     "den = S + V / n", "den = S + V"),
    ("EMA without bias correction", "lr factor (EMA)", "src/oblr/snr.py",
     "corr = 1.0 - b**k", "corr = 1.0", ["tests/core/test_snr.py", "tests/core/test_schedules.py"]),
    ("EMA of S not checkpointed", "lr controller state", "src/oblr/snr.py",
     '"_s_avg", "_v_avg",', '"_v_avg",'),
    ("leave-one-out includes the sample itself", "baseline", "src/oblr/estimators.py",
     "off = 1.0 - torch.eye(g, dtype=x.dtype, device=x.device)", "off = torch.ones(g, g, dtype=x.dtype, device=x.device)"),
    ("seq_sum_const factor without 1/B", "c_i", "src/oblr/losses.py",
     "1.0 / (totals.sequences * width)", "1.0 / width"),
    ("padding counted in a sequence's log-prob", "l_i", "src/oblr/logprobs.py",
     "return (token_lp * response_mask.to(token_lp.dtype)).sum(-1)", "return token_lp.sum(-1)"),
    ("lr set after the optimizer step (one step late)", "learning rate applied", "src/oblr/train/trainer.py",
     "            self.lr_ctrl.step(up.snr)\n            if cfg.optim.grad_clip > 0:\n                clip_grads_(params, cfg.optim.grad_clip, grad_sq)\n            self.optimizer.step()\n",
     "            if cfg.optim.grad_clip > 0:\n                clip_grads_(params, cfg.optim.grad_clip, grad_sq)\n            self.optimizer.step()\n            self.lr_ctrl.step(up.snr)\n"),
    ("grad norm logged squared", "gradient norm", "src/oblr/train/trainer.py",
     'metrics["optim/grad_norm"] = grad_sq.sqrt()', 'metrics["optim/grad_norm"] = grad_sq'),
    ("pass rate counts any positive reward", "pass rate", "src/oblr/train/step_metrics.py",
     '"train/pass_rate": (rewards >= 1.0 - 1e-6).float().mean()', '"train/pass_rate": (rewards > 0).float().mean()'),
    ("all-equal share inverted", "share of groups with equal rewards", "src/oblr/train/step_metrics.py",
     '(rewards.max(1).values == rewards.min(1).values).float().mean()',
     '(rewards.max(1).values != rewards.min(1).values).float().mean()'),
    ("micro-batch uses its own c_i", "micro-batch gradient", "src/oblr/update.py",
     "r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], scale[rows]",
     "r_mb, rm_mb, c_mb = rewards[k0:k1], rmf[rows], sequence_scale(rmf[rows], settings.aggregation, max_len=settings.max_len)"),
    ("optimizer state not restored on resume", "checkpointed optimizer state", "src/oblr/distributed/parallel.py",
     '{**state, "optimizer": optimizer.state_dict()}',
     '{**state, "optimizer": type(optimizer)(model.parameters(), lr=1.0).state_dict()}',
     ["tests/train/test_train_signal.py"]),
    # issue 23: the regimes where the number matters (noise on, state that decides the lr, clipping active,
    # three or more checkpoints, values across ranks, N of a generation batch); each with its likely tests
    ("Adam noise gain without its momentum factor (1-b1)/(1-b1^k)", "auto lr: AdamW noise gain (k >= 2)",
     "src/oblr/step_scale.py",
     "return (1 - b1) / (1 - b1**k) * float(total) / g_prev_sq", "return float(total) / g_prev_sq",
     ["tests/core/test_step_scale.py"]),
    ("Adam noise gain with vhat not bias-corrected", "auto lr: AdamW noise gain (k = 1)", "src/oblr/step_scale.py",
     'vhat = st["exp_avg_sq"].double() / (1 - b2**k)', 'vhat = st["exp_avg_sq"].double()',
     ["tests/core/test_step_scale.py"]),
    ("auto schedule state without the d/h averages", "auto lr controller state", "src/oblr/step_scale.py",
     '"max_change", "prev", "avgs", "confidence",', '"max_change", "prev", "confidence",',
     ["tests/core/test_step_scale.py"]),
    ("clip factor from the squared norm in kappa", "auto lr: kappa with clipping", "src/oblr/step_scale.py",
     "clip = min(1.0, self.grad_clip / math.sqrt(g_sq))", "clip = min(1.0, self.grad_clip / g_sq)",
     ["tests/core/test_step_scale.py"]),
    ("checkpoint candidates oldest first after LATEST", "checkpoint fallback order", "src/oblr/train/checkpoint.py",
     'candidates = checkpoint_folders(run_dir)  # newest first',
     'candidates = checkpoint_folders(run_dir)[::-1]  # newest first',
     ["tests/train/test_checkpoint.py", "tests/faults/test_damaged_files.py"]),
    ("distributed SNR stats carry a rank's N", "N of the distributed statistics", "src/oblr/distributed/step.py",
     "stats = SNRStats(*vals[:4].unbind(), n=N)", "stats = SNRStats(*vals[:4].unbind(), n=n_local)",
     ["tests/distributed/test_distributed_step.py"]),
    ("TRL N from the per-device batch, not the generation batch", "TRL lr: N", "src/oblr/integrations/trl/trainer.py",
     "n_prompts = self.args.generation_batch_size // G",
     "n_prompts = self.args.per_device_train_batch_size // G",
     ["tests/integrations/test_trl_schedule.py", "tests/integrations/test_trl_trainer.py"]),
    ("TRL scores without the sampler's nucleus", "TRL w_i, gradient (top_p)", "src/oblr/integrations/trl/trainer.py",
     "top_p=self.top_p,", "top_p=1.0,", ["tests/integrations/test_trl_kl_top_p.py"]),
    ("TRL KL term without its reference", "TRL gradient (beta)", "src/oblr/integrations/trl/trainer.py",
     "return _AdapterOffReference(model, self.accelerator.unwrap_model(self.model))",
     "return model", ["tests/integrations/test_trl_kl_top_p.py"]),
    ("step KL by float32 exp(d) - d - 1", "policy/step_kl of a small step (kl schedule)", "src/oblr/update.py",
     "k3 = k3_sum(old_logprobs[rows], new_lp, rm[rows])",
     "k3 = sequence_kl(old_logprobs[rows].to(new_lp.dtype), new_lp, rm[rows]).sum().double()",
     ["tests/core/test_update.py"]),
    ("TRL kl: the step's KL measured before the optimizer step", "TRL kl schedule (step KL, lr)",
     "src/oblr/integrations/trl/lr.py", "inner.register_step_post_hook(lambda opt, args, kwargs: "
     "self._oblr_observe_step_kl())", "inner.register_step_pre_hook(lambda opt, args, kwargs: "
     "self._oblr_observe_step_kl())", ["tests/integrations/test_trl_schedule.py"]),
    ("TRL kl: the step's KL of rank 0's rows only", "TRL kl schedule (step KL, 2 processes)",
     "src/oblr/distributed/step.py", "kl, tokens = (float(x) for x in sums.sum(0))",
     "kl, tokens = (float(x) for x in sums[0])", ["tests/integrations/test_trl_distributed.py"]),
    ("verl kl: the step's KL measured before verl's update", "verl kl schedule (step KL, lr)",
     "src/oblr/integrations/verl/actor.py", "        out = inner()\n        lr.after_step()\n",
     "        lr.after_step()\n        out = inner()\n", ["tests/integrations/verl/test_verl_actor_step.py"]),
    ("verl kl: the step's KL not gathered over ranks", "verl kl schedule (step KL, 2 ranks)",
     "src/oblr/integrations/verl/actor.py", "gather=self.dp_group is not None)",
     "gather=False)", ["tests/integrations/verl/test_verl_actor_step.py"]),
    ("TRL core runs with checkpointing switched off", "TRL engine with checkpointing",
     "src/oblr/integrations/trl/trainer.py", "        if self.args.activation_checkpointing:\n            yield",
     "        if False:\n            yield", ["tests/integrations/test_trl_checkpointing.py"]),
    ("TRL checkpointing left reentrant by default", "TRL checkpointing kwargs", "src/oblr/integrations/trl/config.py",
     'kw.setdefault("use_reentrant", False)', 'kw.setdefault("use_reentrant", True)',
     ["tests/integrations/test_trl_config.py"]),
    ("trainer does not pass optim.grad_clip to the schedule", "auto lr with clipping (trainer)",
     "src/oblr/train/setup.py", "grad_clip=o.grad_clip, prompts_per_step=cfg.rollout.prompts_per_step,",
     "prompts_per_step=cfg.rollout.prompts_per_step,", ["tests/train/test_training_variants.py"]),
    ("trainer does not pass rollout.prompts_per_step to the schedule (kl's AdamW target left unscaled)",
     "kl default target (trainer)", "src/oblr/train/setup.py",
     "grad_clip=o.grad_clip, prompts_per_step=cfg.rollout.prompts_per_step,", "grad_clip=o.grad_clip,",
     ["tests/train/test_training_variants.py"]),
    ("kl's default target scaled by N for SGD too", "kl default target (SGD)", "src/oblr/kl_rate.py",
     "default_target(prompts_per_step, adaptive=not is_sgd(optimizer))", "default_target(prompts_per_step)",
     ["tests/core/test_kl_rate.py", "tests/train/test_training_variants.py"]),
    # issue 39: the newest modules (engines, planner, memory model); each caught by its module's own tests
    ("a half model's factors left in their dtype by Outer.regroup (f32 casts dropped as no-ops)",
     "w_i, group norms (bf16/fp16 model)", "src/oblr/gradnorm/contrib.py",
     "        left = self.left if self.is_index else f32(self.left)\n        right = f32(self.right)\n",
     "        left, right = self.left, self.right\n",
     ["tests/gradnorm/test_gradnorm_half.py", "tests/gradnorm/test_gradnorm_engine.py"]),
    ("kept-dense per-row gradients materialised in the half dtype (regroup skipped)",
     "w_i, group norms (bf16/fp16 model, one-pass auto)", "src/oblr/gradnorm/stored.py",
     "c = Dense(c.regroup(Grouping.rows(c.K)).materialize(), owned=True)", "c = Dense(c.materialize(), owned=True)",
     ["tests/gradnorm/test_gradnorm_half.py", "tests/gradnorm/test_gradnorm_engine.py"]),
    ("windowed per-row products of the weighted gradient in the half dtype", "gradient, group norms (bf16/fp16)",
     "src/oblr/gradnorm/contrib.py", "out[k].addmm_(left[i, a:b].float().T, right[i, a:b].float(), alpha=s)",
     "out[k].addmm_(left[i, a:b].T, right[i, a:b], alpha=s)",
     ["tests/gradnorm/test_gradnorm_half.py", "tests/gradnorm/test_gradnorm_engine.py"]),
    ("two-pass per-row gradients formed in the half dtype (gram._rows_materialized)",
     "w_i, group norms (two-pass, bf16/fp16)", "src/oblr/gradnorm/gram.py",
     "    left = left.reshape(k * M, c.T) if c.is_index else left.float().reshape(k * M, c.T, c.R)\n"
     "    right = _rows(c.right, index, contiguous, k0, k1).float().reshape(k * M, c.T, c.C)\n",
     "    left = left.reshape(k * M, c.T) if c.is_index else left.reshape(k * M, c.T, c.R)\n"
     "    right = _rows(c.right, index, contiguous, k0, k1).reshape(k * M, c.T, c.C)\n",
     ["tests/gradnorm/test_gradnorm_half.py", "tests/gradnorm/test_gradnorm_twopass.py"]),
    ("two-pass ghost Grams of a group's tokens in the half dtype (gram._gather_outer)",
     "w_i, group norms (two-pass ghost, bf16/fp16)", "src/oblr/gradnorm/gram.py",
     "    left = left.reshape(K, M * c.T) if c.is_index else left.float().reshape(K, M * c.T, c.R)\n"
     "    return Outer(left, _rows(c.right, index, contiguous).float().reshape(K, M * c.T, c.C), c.shape)\n",
     "    left = left.reshape(K, M * c.T) if c.is_index else left.reshape(K, M * c.T, c.R)\n"
     "    return Outer(left, _rows(c.right, index, contiguous).reshape(K, M * c.T, c.C), c.shape)\n",
     ["tests/gradnorm/test_gradnorm_half.py", "tests/gradnorm/test_gradnorm_twopass.py"]),
    ("two-pass reduces a tied embedding's two contributions apart (no cross term)", "w_i, group norms (tied, two-pass)",
     "src/oblr/gradnorm/twopass.py", "self._kept_entries = {id(e) for e in by_id.values() if len(e.owners) > 1}",
     "self._kept_entries = {id(e) for e in by_id.values() if len(e.owners) > 2}",
     ["tests/gradnorm/test_gradnorm_twopass.py", "tests/gradnorm/test_gradnorm_half.py"]),
    ("recompute: a second backward adds to the first one's contributions", "w_i, group norms (KL objective)",
     "src/oblr/gradnorm/recompute.py", "        for e in self._entries:\n            e.contribs = []\n        self._grp = Grouping.rows(B)",
     "        self._grp = Grouping.rows(B)", ["tests/gradnorm/test_gradnorm_recompute.py", "tests/gradnorm/test_gradnorm_half.py"]),
    ("recompute: hooks removed after a retained backward (the next recomputation untapped)",
     "w_i, group norms (KL objective)", "src/oblr/gradnorm/recompute.py",
     "            if not retain_graph:\n                self._remove_hooks()", "            self._remove_hooks()",
     ["tests/gradnorm/test_gradnorm_recompute.py", "tests/gradnorm/test_gradnorm_half.py"]),
    ("planner prices a capped micro-batch as the whole batch (split against the cap)", "planner: capped micro-batch peak",
     "src/oblr/train/plan.py", "split=g < groups, groups=g)", "split=g < top, groups=g)", ["tests/train/test_plan.py"]),
    ("planner takes a cap above the rank's groups as the micro-batch", "planner: micro-batch under a cap",
     "src/oblr/train/plan.py", "top = min(groups, max_groups) if max_groups > 0 else groups",
     "top = max_groups if max_groups > 0 else groups", ["tests/train/test_plan.py"]),
    ("planner reports a capped micro-batch as the whole batch (micro_batch_groups 0)", "planner: micro_batch_groups",
     "src/oblr/train/plan.py", "micro_batch_groups=0 if g == groups else g", "micro_batch_groups=0 if g == top else g",
     ["tests/train/test_plan.py"]),
    ("memory model: o_proj's input width taken as hidden", "memory: o_proj entry and kept bytes",
     "src/oblr/memory_model/shapes.py", '("o_proj", h, q, "o_in")', '("o_proj", h, h, "o_in")', ["tests/core/test_memory_model.py"]),
    ("memory model: q_proj's rows taken as hidden", "memory: q_proj entry and kept bytes",
     "src/oblr/memory_model/shapes.py", '("q_proj", q, h, "attn_in")', '("q_proj", h, h, "attn_in")',
     ["tests/core/test_memory_model.py"]),
    ("memory model: a layer's o_proj counted hidden x hidden", "memory: parameter count",
     "src/oblr/memory_model/shapes.py", "return h * q + 2 * h * kv + q * h + 3 * h * s.intermediate",
     "return h * q + 2 * h * kv + h * h + 3 * h * s.intermediate", ["tests/core/test_memory_model.py"]),
    ("memory model: q/k/v's shared input kept for the last projection only", "memory: recompute kept bytes",
     "src/oblr/memory_model/kept.py", "        per_layer += a\n        inputs[key] = max(inputs.get(key, 0), x)\n",
     "        per_layer += a\n        inputs[key] = x\n", ["tests/core/test_memory_model.py"]),
    # ISSUE39-ENGINES (entries are added above this line)
    # issue 39: schedules, TRL and verl adapters, task checkers
    ("snr lr floored after the warm-up, not before", "snr lr: warm-up with a binding floor", "src/oblr/snr.py",
     "self._apply([warm * max(self.eta_min, e * f) for e, f in zip(self.eta_max, factors)])",
     "self._apply([max(self.eta_min, warm * e * f) for e, f in zip(self.eta_max, factors)])",
     ["tests/core/test_schedules.py", "tests/core/test_snr.py"]),
    ("snr_adam charges one batch's noise (no momentum count)", "snr_adam lr: kappa_k", "src/oblr/snr.py",
     "return [momentum_noise_share(b, k) for b in self.beta1]", "return [1.0 for b in self.beta1]",
     ["tests/core/test_schedules.py", "tests/core/test_snr.py"]),
    ("kappa_k with the wrong sign of beta1^k", "snr_adam lr: kappa_k", "src/oblr/snr.py",
     "return (1.0 - beta1) * (1.0 + bk) / ((1.0 + beta1) * (1.0 - bk))",
     "return (1.0 - beta1) * (1.0 - bk) / ((1.0 + beta1) * (1.0 - bk))",
     ["tests/core/test_snr.py"]),
    ("cosine decays over total_steps, not the steps after the warm-up", "cosine lr with warm-up", "src/oblr/schedules.py",
     "span = max(1, self.total_steps - self.warmup_steps)", "span = max(1, self.total_steps)",
     ["tests/core/test_schedules.py", "tests/core/test_snr.py"]),
    ("snr schedule averages the clamped S, not the signal", "snr lr (EMA)", "src/oblr/schedules.py",
     "self.inner.step(stats.signal, stats.V, stats.n)", "self.inner.step(stats.S, stats.V, stats.n)",
     ["tests/core/test_schedules.py", "tests/core/test_snr.py"]),
    ("auto lr floored after the warm-up, not before", "auto lr: warm-up with a binding floor", "src/oblr/step_scale.py",
     "self._apply(self.warmup() * max(self.eta_min, lr))", "self._apply(max(self.eta_min, self.warmup() * lr))",
     ["tests/core/test_step_scale.py"]),
    ("auto measures the last step at its unwarmed, unfloored lr", "auto lr: d and h under warm-up or floor",
     "src/oblr/step_scale.py", '"lr": self._last[0], "clip": clip', '"lr": self.lr, "clip": clip',
     ["tests/core/test_step_scale.py"]),
    ("auto state without its step count (the warm-up restarts on resume)", "auto lr controller state (warm-up)",
     "src/oblr/lr_control.py", "self.t = state[self.COUNTER_KEY]", "pass",
     ["tests/core/test_step_scale.py", "tests/core/test_lr_control.py"]),
    ("TRL schedule state not restored from a checkpoint", "TRL lr controller state on resume",
     "src/oblr/integrations/trl/lr.py",
     "    def load_state_dict(self, state: dict) -> None:\n        self.controller.load_state_dict(state)",
     "    def load_state_dict(self, state: dict) -> None:\n        return None",
     ["tests/integrations/test_trl_resume.py", "tests/integrations/test_trl_schedule.py"]),
    ("TRL warm-up steps not passed to the schedule", "TRL lr with warm-up", "src/oblr/integrations/trl/lr.py",
     "warmup_steps=a.get_warmup_steps(num_training_steps)", "warmup_steps=0",
     ["tests/integrations/test_trl_resume.py", "tests/integrations/test_trl_schedule.py"]),
    ("TRL EMA factor not passed to the schedule", "TRL lr (EMA)", "src/oblr/integrations/trl/lr.py",
     "eta_min=a.oblr_eta_min, ema=a.oblr_snr_ema,", "eta_min=a.oblr_eta_min, ema=0.0,",
     ["tests/integrations/test_trl_resume.py", "tests/integrations/test_trl_schedule.py"]),
    ("verl norm pass takes the attention mask's tail as the response mask", "verl w_i, gradient (tool output)",
     "src/oblr/integrations/verl/actor.py", 'rm[:, -R:] = b["response_mask"].to(am.dtype)', "rm[:, -R:] = am[:, -R:]",
     ["tests/integrations/verl/test_verl_actor_step.py"]),
    ("verl norm pass assumes equal prompt counts on every rank", "verl N and c_i (unequal ranks)",
     "src/oblr/integrations/verl/actor.py",
     "n_total = int(_all_sum(torch.tensor([n_local], dtype=torch.float64, device=dev), group)[0])",
     "n_total = n_local * (group.size() if group is not None else 1)",
     ["tests/integrations/verl/test_verl_actor_step.py"]),
    ("verl loss factor c_i from the rank's rows, not the global batch", "verl c_i (global batch)",
     "src/oblr/integrations/verl/loss.py",
     "totals = BatchTotals(int(gbs) if gbs is not None else int(mask.shape[0]), mask.sum(), width)",
     "totals = BatchTotals(int(mask.shape[0]), mask.sum(), width)",
     ["tests/integrations/verl/test_verl_actor_step.py", "tests/integrations/verl/test_verl_registered.py"]),
    ("arithmetic answer with a '+' sign refused", "arithmetic reward ('+' sign)", "src/oblr/tasks/arithmetic.py",
     '_FINAL_RE = re.compile(r"####[ \\t]*([+-]?[0-9]{1,30})\\s*\\Z")',
     '_FINAL_RE = re.compile(r"####[ \\t]*(-?[0-9]{1,30})\\s*\\Z")', ["tests/tasks/test_arithmetic.py"]),
    ("arithmetic answer: at most one space after ####", "arithmetic reward (whitespace)", "src/oblr/tasks/arithmetic.py",
     '_FINAL_RE = re.compile(r"####[ \\t]*([+-]?[0-9]{1,30})\\s*\\Z")',
     '_FINAL_RE = re.compile(r"#### ?([+-]?[0-9]{1,30})\\s*\\Z")', ["tests/tasks/test_arithmetic.py"]),
    ("countdown depth not decremented after ')' (sibling groups add up)", "countdown reward (parentheses)",
     "src/oblr/tasks/countdown.py", "            self.take()\n            self.depth -= 1\n", "            self.take()\n",
     ["tests/tasks/test_countdown.py"]),
    ("word problem 'times as many' keyed as a*b + b", "word_problems answer key", "src/oblr/tasks/word_problems.py",
     '[(a, "*", b), (a, "+", a * b)]', '[(a, "*", b), (a * b, "+", b)]', ["tests/tasks/test_word_problems.py"]),
    # ISSUE39-ADAPTERS (entries are added above this line)
    # issue 39: run folders and checkpoints
    ("checkpoint pruning keeps one intact checkpoint too few", "checkpoints kept after a save",
     "src/oblr/train/checkpoint.py", "[: max(keep - 1, 0)]", "[: max(keep - 2, 0)]",
     ["tests/train/test_checkpoint.py"]),
    ("checkpoint pruning counts damaged checkpoints among the kept", "checkpoints kept after a save (damaged)",
     "src/oblr/train/checkpoint.py", "[p for p in earlier if checkpoint_problem(p) is None]",
     "[p for p in earlier]", ["tests/train/test_checkpoint.py"]),
    ("checkpoint folders ordered by name, not by step", "checkpoints kept after a save (step 10^6)",
     "src/oblr/train/checkpoint.py", "return sorted(found, key=checkpoint_step, reverse=True)",
     "return sorted(found, reverse=True)", ["tests/train/test_checkpoint.py"]),
    ("run folder recognised by a config.yaml alone (code.json check skipped)", "run-folder recognition",
     "src/oblr/train/run_dir.py", "if not names or is_run_folder(run_dir):",
     'if not names or "config.yaml" in names:', ["tests/faults/test_run_folder.py"]),
    ("damaged checkpoints not moved aside when a run starts again", "checkpoints of a restarted run",
     "src/oblr/train/run_dir.py", 'aside = set_aside_checkpoints(run_dir, datetime.now().strftime("%Y%m%d-%H%M%S"))',
     "aside = None", ["tests/faults/test_damaged_files.py"]),
    ("run folder's lock holder not asked before its contents are judged", "refusal of a locked run folder",
     "src/oblr/train/run_dir.py", "owner = lock_holder(run_dir) if check_lock else None", "owner = None",
     ["tests/faults/test_run_folder.py"]),
    # ISSUE39-RUNFOLDERS (entries are added above this line)
]

FIRST = ["tests/core", "tests/train/test_train_signal.py", "tests/train/test_training_variants.py", "tests/gradnorm"]


def table(path: str) -> str:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    out = ["| planted bug | quantity | caught by (first failing test) |", "|---|---|---|"]
    for r in rows:
        by = f"`{r['by'][0]}`" if r["by"] else ("caught (no test name)" if r["caught"] else "**NOT caught**")
        if not r["caught"] and r.get("scope"):
            by += f" ({r['scope']})"
        cells = [f"{r['name']} (`{r['file']}`)", r["quantity"], by]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(out)


def _env(work: Path, data_dir: Path, home: Path) -> dict:
    """The tests' environment: this one's PATH and locale, the scratch copy's ``src`` first on the path, a
    scratch HOME, one thread, the data folder."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    env.setdefault("PATH", os.defpath)
    env.update({"PYTHONPATH": str(work / "src"), "HOME": str(home), "OMP_NUM_THREADS": "1",
                "OBLR_DATA_DIR": str(data_dir)})
    return env


def run_one(repo: Path, py: str, mutation, *, data_dir: Path, suite: bool, common: bool = True) -> dict | None:
    """Plant ``mutation`` in a scratch copy of ``repo`` and run its likely tests, the common ones, and (with
    ``suite``) the whole suite until one fails. Returns the record, or None when the pattern does not match."""
    name, qty, rel, old, new, *likely = mutation
    likely = likely[0] if likely else []
    with tempfile.TemporaryDirectory(prefix="oblr-mutation-") as scratch:
        work = Path(scratch) / "repo"
        shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "__pycache__", "*.whl",
                                                                   "mutation_results.jsonl"))
        f = work / rel
        text = f.read_text()
        if text.count(old) != 1:
            print(f"SKIP {name}: pattern found {text.count(old)} times in {rel}", flush=True)
            return None
        f.write_text(text.replace(old, new))
        home = Path(scratch) / "home"
        home.mkdir()
        env = _env(work, data_dir, home)
        first = [p for p in dict.fromkeys(likely + (FIRST if common else [])) if (work / p).exists()]
        t0 = time.time()
        stages = [[p] for p in first] + ([["tests"]] if suite else [])  # likely tests first, one file at a time
        if not stages:
            raise SystemExit(f"mutation {name!r} names no tests of its own; run it without --own-tests")
        r = None
        for targets in stages:
            r = subprocess.run([py, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-W", "ignore", *targets],
                               cwd=work, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                break
    caught = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    rec = {"name": name, "quantity": qty, "file": rel, "caught": r.returncode != 0,
           "by": caught[:1] if r.returncode != 0 else [], "rc": r.returncode, "seconds": round(time.time() - t0)}
    if not suite and r.returncode == 0:
        rec["scope"] = "likely tests only" if common else "its own likely tests only"
    if r.returncode not in (0, 1):  # not a test failure: collection error, crash, usage error
        rec["tail"] = (r.stdout + r.stderr)[-600:]
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repo", nargs="?", help="the repository to copy (its working tree)")
    ap.add_argument("python", nargs="?", help="the Python that runs pytest (with oblr's dependencies)")
    ap.add_argument("names", nargs="*", help="run only the mutations with these exact names")
    ap.add_argument("--match", action="append", default=[], help="run only mutations whose name contains this")
    ap.add_argument("--no-suite", action="store_true", help="never fall back to the whole suite")
    ap.add_argument("--own-tests", action="store_true",
                    help="run only each mutation's own likely tests (implies --no-suite)")
    ap.add_argument("--out", default="mutation_results.jsonl", help="the jsonl to append to (default ./%(default)s)")
    ap.add_argument("--list", action="store_true", help="print the mutations' names and exit")
    ap.add_argument("--table", metavar="JSONL", help="print the markdown table of a results file and exit")
    a = ap.parse_intermixed_args(argv)
    if a.table:
        print(table(a.table))
        return
    if a.list:
        for m in M:
            print(m[0])
        return
    if not (a.repo and a.python):
        ap.error("REPO_DIR and PYTHON are required")
    repo = Path(a.repo).resolve()
    known = {m[0] for m in M}
    unknown = [n for n in a.names if n not in known]
    if unknown:
        ap.error(f"unknown mutation name(s) {unknown}; see --list")
    chosen = [m for m in M if (not a.names or m[0] in a.names)
              and (not a.match or any(w.lower() in m[0].lower() for w in a.match))]
    if not chosen:
        ap.error("no mutation selected")
    data_dir = Path(os.environ.get("OBLR_DATA_DIR") or repo.parent / "shared" / "data")
    out = Path(a.out)
    # pytest runs in the scratch copy: a relative PYTHON (.venv/bin/python) is made absolute here (not resolved:
    # a venv's python is a symlink whose target is the base interpreter, without the venv's packages)
    py = os.path.abspath(a.python) if os.sep in a.python else a.python
    for m in chosen:
        rec = run_one(repo, py, m, data_dir=data_dir, suite=not (a.no_suite or a.own_tests),
                      common=not a.own_tests)
        if rec is None:
            continue
        print(json.dumps(rec), flush=True)
        with open(out, "a") as fh:
            fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
