"""The recipe's settings check on verl 0.9.1's own composed ``ppo_trainer`` config: the documented overrides
pass, and each setting the recipe cannot run stops with one line naming it. (The recipe's Ray trainer and
workers need GPUs and are not run here.)"""

from __future__ import annotations

import copy
import os

import pytest

if not os.environ.get("OBLR_REQUIRE_VERL"):
    pytest.importorskip("verl", reason="verl is not installed here (pip install 'oblr[verl]': docs/verl.md)")

from omegaconf import OmegaConf  # noqa: E402

from oblr.integrations.verl import recipe  # noqa: E402

#: the overrides docs/verl.md gives for an OBLR-PO run (sizes of the benchmark script)
OVERRIDES = [
    "trainer.use_v1=False", "algorithm.adv_estimator=oblr", "actor_rollout_ref.actor.policy_loss.loss_mode=oblr",
    "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    "actor_rollout_ref.actor.loss_scale_factor=512", "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.ppo_epochs=1",
    "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32", "trainer.balance_batch=False",
    "actor_rollout_ref.rollout.n=8", "algorithm.use_kl_in_reward=False",
]


@pytest.fixture(scope="module")
def config():
    from hydra import compose, initialize_config_module

    with initialize_config_module("verl.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=OVERRIDES)


def test_documented_overrides_pass(config):
    recipe.check_run_config(config)
    assert recipe.options(config.actor_rollout_ref) == {"lr_schedule": "snr", "eta_min": 0.0, "ema": 0.9,
                                                        "warmup_steps": 0, "schedule_options": {}}


@pytest.mark.parametrize("path, value", [
    ("trainer.use_v1", True), ("algorithm.adv_estimator", "grpo"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla"), ("actor_rollout_ref.actor.strategy", "fsdp"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size", 16), ("trainer.balance_batch", True),
    ("algorithm.use_kl_in_reward", True), ("algorithm.rollout_correction.bypass_mode", True),
    ("algorithm.rollout_correction.rollout_is", "token"), ("algorithm.rollout_correction.rollout_rs", "token"),
    ("actor_rollout_ref.rollout.n", 1), ("actor_rollout_ref.rollout.top_p", 0.9),
    ("actor_rollout_ref.rollout.top_k", 20), ("actor_rollout_ref.actor.loss_agg_mode", "token-mean"),
    ("actor_rollout_ref.actor.entropy_coeff", 0.01), ("actor_rollout_ref.actor.use_kl_loss", True),
    ("actor_rollout_ref.actor.ppo_epochs", 2), ("actor_rollout_ref.actor.loss_scale_factor", None),
])
def test_each_unsupported_setting_is_refused_with_one_line(config, path, value):
    bad = copy.deepcopy(config)
    OmegaConf.update(bad, path, value, force_add=True)
    with pytest.raises(ValueError) as e:
        recipe.check_run_config(bad)
    msg = str(e.value)
    assert msg.startswith(f"oblr verl recipe: {path}=") and "is not supported" in msg and "\n" not in msg, msg


def test_unknown_recipe_option_is_refused(config):
    bad = copy.deepcopy(config)
    OmegaConf.update(bad, "actor_rollout_ref.oblr", {"lr_schedul": "auto"}, force_add=True)
    with pytest.raises(ValueError, match=r"unknown option\(s\) actor_rollout_ref.oblr.lr_schedul"):
        recipe.options(bad.actor_rollout_ref)


def test_trainer_hook_puts_the_workers_norm_pass_advantages_into_the_batch(monkeypatch):
    """The driver seam of the recipe on one rank: ``OBLRRayPPOTrainer._compute_old_log_prob`` sends the batch's
    fields to the worker's registered ``oblr_norm_pass`` (called here on a stand-in worker holding a tiny
    Qwen3 as the actor's module) and returns its A_i with the old log-probs; after ``fit``'s union,
    ``compute_advantage`` with ``oblr`` gives those A_i, oblr's native advantages, and the worker holds S and
    V's inputs.
    verl's own ``_compute_old_log_prob`` (a Ray call to the actor's forward) is replaced by a stand-in."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    import torch
    import verl_step_helpers as h
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

    from oblr.integrations.verl.actor import ActorLearningRate

    (m1, o1, c1), (m2, _, _) = h.pair("snr")
    ro = h.sample_rollouts(m1, seed=31)
    nat = h.native_step(m1, o1, c1, ro)
    batch = h.data_proto(ro)
    batch.batch["rm_scores"] = batch.batch.pop("token_level_scores")
    batch.meta_info["temperature"] = h.TEMPERATURE
    opt = torch.optim.AdamW(m2.parameters(), lr=h.LR)
    worker = SimpleNamespace(
        actor=SimpleNamespace(engine=SimpleNamespace(module=m2, train_mode=nullcontext,
                                                     get_data_parallel_group=lambda: None)),
        config=OmegaConf.create({"rollout": {"n": h.G, "temperature": h.TEMPERATURE}}),
        _oblr_actor_config=h.actor_config(), _oblr_lr=ActorLearningRate(opt, "snr", lr=h.LR))
    sent = []

    def norm_pass_call(data):
        sent.append((set(data.batch.keys()), list(data.non_tensor_batch), dict(data.meta_info)))
        return recipe.OBLRActorRolloutRefWorker.oblr_norm_pass(worker, data)

    trainer = object.__new__(recipe.OBLRRayPPOTrainer)
    trainer.actor_rollout_wg = SimpleNamespace(oblr_norm_pass=norm_pass_call)
    old = DataProto.from_dict(tensors={"old_log_probs": torch.zeros(batch.batch["responses"].shape)})
    monkeypatch.setattr(RayPPOTrainer, "_compute_old_log_prob", lambda self, b: (old, 0.0))
    out, _ = trainer._compute_old_log_prob(batch)
    assert sent == [(set(recipe.NORM_PASS_KEYS), ["uid"], {"temperature": h.TEMPERATURE})]
    assert "reward_baselines" not in batch.batch.keys()
    batch = batch.union(out)  # fit: batch.union(old_log_prob)
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator="oblr")
    rm = batch.batch["response_mask"].float()
    adv = (batch.batch["advantages"] * rm).sum(-1) / rm.sum(-1)
    assert h.rel(batch.batch["reward_baselines"], nat["adv"]) < 1e-5
    assert torch.equal(batch.batch["advantages"], batch.batch["reward_baselines"][:, None] * rm)
    assert h.rel(adv, nat["adv"]) < 1e-5
    assert worker._oblr_lr.pending[1] == h.N and worker._oblr_lr.pending[0] > 0


def test_task_runner_maps_the_actor_role_to_the_recipes_worker(config):
    """verl's legacy TaskRunner, as the recipe subclasses it, gives the actor/rollout role the recipe's worker
    (verl's Role names print in lower case: the role is matched by its enum name)."""
    from verl.trainer.ppo.utils import Role

    runner = recipe._TaskRunner()
    cls, _ = runner.add_actor_rollout_worker(config)
    assert cls is recipe.OBLRActorRolloutRefWorker
    actors = [r for r in runner.role_worker_mapping if r in (Role.ActorRollout, Role.ActorRolloutRef)]
    assert len(actors) == 1
    assert runner.role_worker_mapping[actors[0]].__ray_actor_class__ is recipe.OBLRActorRolloutRefWorker


def test_install_learning_rate_reads_verls_optim_config_and_sets_the_lr_before_the_step(config):
    """What the worker's ``init_model`` does to the actor engine (here verl's own ``FSDPEngine.optimizer_step``
    on a plain module): eta_max = ``actor.optim.lr``, the recipe's options, and at the next step the lr
    from the pending S and V inputs, before verl's clip and update."""
    import torch
    import verl_step_helpers as h

    from oblr.integrations.verl.actor import norm_pass
    from oblr.snr import snr_factor

    cfg = copy.deepcopy(config.actor_rollout_ref)
    OmegaConf.update(cfg, "actor.optim.lr", 3e-4)
    OmegaConf.update(cfg, "oblr", {"snr_ema": 0.0}, force_add=True)
    model = h.initial_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.0)
    engine = h.verl_engine(model, opt)
    lr = recipe.install_learning_rate(cfg, engine)
    assert lr.controller.inner.eta_max == [3e-4] and lr.controller.inner.ema == 0.0
    data = h.data_proto(h.sample_rollouts(model, seed=41))
    norm_pass(model, data, h.actor_config(), rollout_n=h.G, temperature=h.TEMPERATURE)
    lr.pending_from(data)
    opt.zero_grad()
    gk_sum, n = lr.pending
    numel = sum(p.numel() for p in model.parameters())
    c = (0.9 * gk_sum / n / numel) ** 0.5  # a gradient with ||gbar||^2 = 0.9 mean_k ||g_k||^2: 0 < S, V
    for p in model.parameters():
        p.grad = torch.full_like(p, c)
    before = [p.detach().clone() for p in model.parameters()]
    engine.optimizer_step()
    st = lr.last
    expected = 3e-4 * snr_factor(float(st.S), float(st.V), st.n)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12) and 0 < expected < 3e-4
    # the update used it: AdamW's first step moves every coordinate by lr * g / (|g| + eps), here -lr
    moved = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before)])
    assert torch.allclose(moved, torch.full_like(moved, -expected), rtol=1e-3)


def _run_steps(engine, lr, model, steps) -> list[float]:
    """Optimizer steps driven as the worker drives them, on gradients and per-prompt sums made from the step
    number (the same step gives the same numbers in every run); 0 < ||gbar||^2 < mean_k ||g_k||^2 varies, so
    S and V vary and the EMA matters. The kl schedule measures each step's KL on the rows of a norm pass, here on
    rollouts sampled from the model with the step's seed. Returns the lr set at each step."""
    import torch
    import verl_step_helpers as h

    from oblr.integrations.verl.actor import norm_pass

    out = []
    for t in steps:
        kl_round = None
        if lr.needs_step_kl:
            data = h.data_proto(h.sample_rollouts(model, seed=2000 + t))
            kl_round = norm_pass(model, data, h.actor_config(), rollout_n=h.G, temperature=h.TEMPERATURE).step_kl
        gen = torch.Generator().manual_seed(1000 + t)
        for p in model.parameters():
            p.grad = 1e-3 * torch.randn(p.shape, generator=gen)
        gbar_sq = float(sum((p.grad.double() ** 2).sum() for p in model.parameters()))
        n = 8
        lr.set_pending(gbar_sq * n / (0.3 + 0.6 * ((7 * t) % 5) / 4), n, kl_round)
        engine.optimizer_step()
        out.append(engine.optimizer.param_groups[0]["lr"])
    return out


@pytest.mark.parametrize("schedule", ["snr", "snr_adam", "auto", "kl"])
def test_the_schedules_state_travels_with_the_engines_checkpoint(config, tmp_path, schedule):
    """A run saved after 4 steps and resumed from verl's checkpoint folder sets the same lrs (and weights) as
    the run that went on, with the EMA on; resumed without the oblr state file it does not (and says so)."""
    import torch
    import verl_step_helpers as h

    from oblr.integrations.verl import STATE_FILE

    cfg = copy.deepcopy(config.actor_rollout_ref)
    OmegaConf.update(cfg, "actor.optim.lr", 3e-3)
    OmegaConf.update(cfg, "oblr", {"snr_ema": 0.9, "lr_schedule": schedule}, force_add=True)

    def fresh():
        model = h.initial_model()
        opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.0)
        engine = h.verl_engine(model, opt)
        return model, engine, recipe.install_learning_rate(cfg, engine)

    model, engine, lr = fresh()
    _run_steps(engine, lr, model, range(4))
    ckpt = tmp_path / "global_step_4" / "actor"
    engine.save_checkpoint(str(ckpt), None, 4, None)
    assert (ckpt / STATE_FILE.format(world=1, rank=0)).is_file()
    went_on = _run_steps(engine, lr, model, range(4, 9))

    model2, engine2, lr2 = fresh()
    engine2.load_checkpoint(str(ckpt), None, False)
    resumed = _run_steps(engine2, lr2, model2, range(4, 9))
    assert resumed == pytest.approx(went_on, rel=1e-12)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)

    (ckpt / STATE_FILE.format(world=1, rank=0)).unlink()
    model3, engine3, lr3 = fresh()
    with pytest.warns(UserWarning, match="no oblr_lr_world_size_1_rank_0.pt"):
        engine3.load_checkpoint(str(ckpt), None, False)
    restarted = _run_steps(engine3, lr3, model3, range(4, 9))
    assert max(abs(a / b - 1) for a, b in zip(restarted, went_on)) > 1e-3


def test_a_checkpoint_of_another_schedule_or_world_size_is_refused(config, tmp_path):
    import torch
    import verl_step_helpers as h

    from oblr.integrations.verl import ActorLearningRate, load_lr_state, save_lr_state

    model = h.initial_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    save_lr_state(ActorLearningRate(opt, "snr", lr=1e-3, ema=0.9), tmp_path)
    with pytest.raises(ValueError, match="schedule 'snr', this run uses 'auto'"):
        load_lr_state(ActorLearningRate(opt, "auto", lr=1e-3), tmp_path)
    (tmp_path / "oblr_lr_world_size_1_rank_0.pt").rename(tmp_path / "oblr_lr_world_size_2_rank_0.pt")
    with pytest.raises(ValueError, match="another world size .*same number of ranks"):
        load_lr_state(ActorLearningRate(opt, "snr", lr=1e-3), tmp_path)


@pytest.mark.parametrize("schedule", ["snr", "kl"])
def test_update_actor_adds_the_learning_rates_metrics_to_verls(config, monkeypatch, schedule):
    """The worker's ``update_actor`` returns verl's update result (verl's own ``update_actor`` replaced by a
    stand-in that runs two optimizer steps through verl's ``FSDPEngine.optimizer_step``, as two mini-batches
    do) with ``oblr/*`` appended to its metrics: the last step's lr as set, S and V, and with ``kl`` that step's
    KL as measured; each key once, and nothing left over for the next update."""
    import torch
    import verl_step_helpers as h
    from verl.utils import tensordict_utils as tu

    cfg = copy.deepcopy(config.actor_rollout_ref)
    OmegaConf.update(cfg, "actor.optim.lr", 3e-3)
    OmegaConf.update(cfg, "oblr", {"snr_ema": 0.0, "lr_schedule": schedule}, force_add=True)
    model = h.initial_model()
    engine = h.verl_engine(model, torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.0))
    lr = recipe.install_learning_rate(cfg, engine)

    def verls_update_actor(self, data):
        lrs = _run_steps(engine, lr, model, range(2))
        self.lrs = lrs
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"actor/pg_loss": [0.5, 0.4]}})

    monkeypatch.setattr(recipe.ActorRolloutRefWorker, "update_actor", verls_update_actor)
    worker = object.__new__(recipe.OBLRActorRolloutRefWorker)
    worker._oblr_lr = lr
    metrics = tu.get(recipe.OBLRActorRolloutRefWorker.update_actor(worker, None), "metrics")
    assert metrics["actor/pg_loss"] == [0.5, 0.4]
    oblr = {k: v for k, v in metrics.items() if k.startswith("oblr/")}
    assert all(len(v) == 1 for v in oblr.values())
    assert oblr["oblr/S"] == [float(lr.last.S)] and oblr["oblr/V"] == [float(lr.last.V)]
    assert oblr["oblr/n"] == [8]
    if schedule == "kl":
        assert oblr["oblr/step_kl"] == [lr.last_step_kl] and lr.last_step_kl > 0
        assert oblr["oblr/kl/target"] == [lr.controller.target]
        assert {"oblr/kl/stiffness", "oblr/kl/stiffness_avg", "oblr/kl/skipped"} <= set(oblr)
        assert oblr["oblr/lr"] == [worker.lrs[1]]  # the lr the second step ran with (set by the first's KL)
    else:
        assert "oblr/step_kl" not in oblr
        assert oblr["oblr/lr"] == [worker.lrs[1]]
    assert lr.pop_metrics() == {}
    assert recipe.with_oblr_metrics(None, lr) is None  # a rank that returns nothing
