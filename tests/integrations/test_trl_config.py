"""OBLRGRPOConfig: defaults are compatible; every refused setting is refused with its one-line message."""

from pathlib import Path

import pytest

pytest.importorskip("trl")

from oblr.integrations.trl import RULES, OBLRGRPOConfig, OBLRGRPOTrainer  # noqa: E402

BASE = dict(per_device_train_batch_size=8, num_generations=4, use_cpu=True, bf16=False, report_to=[])

# one incompatible value per rule; per_device_train_batch_size (groups split across processes) needs two
# processes and is checked in test_trl_distributed.py
BAD = {
    "loss_type": dict(loss_type="dapo"),
    "max_completion_length": dict(max_completion_length=None),
    "scale_rewards": dict(scale_rewards="group"),
    "multi_objective_aggregation": dict(multi_objective_aggregation="normalize_then_sum"),
    "beta": dict(beta=-0.04),
    "oblr_logit_chunk_tokens": dict(oblr_logit_chunk_tokens=-1),
    "num_iterations": dict(num_iterations=2),
    "steps_per_generation": dict(steps_per_generation=2),
    "mask_truncated_completions": dict(mask_truncated_completions=True),
    "top_entropy_quantile": dict(top_entropy_quantile=0.2),
    "entropy_coef": dict(entropy_coef=0.01),
    "use_adaptive_entropy": dict(use_adaptive_entropy=True),
    "off_policy_mask_threshold": dict(off_policy_mask_threshold=0.5),
    "delta": dict(delta=0.9),
    "top_p": dict(top_p=0.9, use_vllm=True),  # vLLM's importance ratio ignores the nucleus (on by default)
    "top_k": dict(top_k=20),
    "min_p": dict(min_p=0.05),
    "repetition_penalty": dict(repetition_penalty=1.1),
    "generation_kwargs": dict(generation_kwargs={"top_k": 5}),
    "vllm_importance_sampling_mode": dict(use_vllm=True, vllm_importance_sampling_mode="token_truncate"),
    "activation_checkpointing_kwargs": dict(activation_checkpointing=True,
                                            activation_checkpointing_kwargs={"use_reentrant": True}),
    "fp16": dict(fp16=True),
    "torch_compile": dict(torch_compile=True),
    "router_aux_loss_coef": dict(router_aux_loss_coef=0.01),
    "parallelism_config": "parallelism",
    "fsdp": dict(fsdp=True),
    "lr_scheduler_type": dict(lr_scheduler_type="cosine"),
    "oblr_baseline": dict(oblr_baseline="nope"),
    "oblr_snr_ema": dict(oblr_snr_ema=1.0),
    "oblr_eta_min": dict(oblr_eta_min=-1.0),
    "oblr_lr_schedule": dict(oblr_lr_schedule="cosine"),
    "optim": dict(oblr_lr_schedule="snr_adam", optim="sgd"),
    "oblr_schedule_options": dict(oblr_lr_schedule="auto", oblr_schedule_options={"max_chnage": 2.0}),
    "learning_rate": dict(learning_rate=float("inf")),
    "oblr_checkpointed_engine": dict(activation_checkpointing=True, oblr_checkpointed_engine="one_pass"),
}


def _cfg(tmp_path, **kw):
    return OBLRGRPOConfig(output_dir=str(tmp_path), **{**BASE, **kw})


def test_defaults_are_compatible(tmp_path):
    c = OBLRGRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, num_generations=4, use_cpu=True)
    assert (c.loss_type, c.scale_rewards, c.gradient_checkpointing, c.oblr_baseline, c.oblr_snr_lr) == \
        ("dr_grpo", "none", False, "oblr", True)
    assert c.steps_per_generation == c.gradient_accumulation_steps


@pytest.mark.parametrize("kw", [dict(activation_checkpointing=True), dict(gradient_checkpointing=True),
                                dict(activation_checkpointing=True, activation_checkpointing_kwargs={"debug": False})])
def test_checkpointing_is_accepted_non_reentrant(tmp_path, kw):
    c = _cfg(tmp_path, **kw)
    assert c.activation_checkpointing and c.gradient_checkpointing
    assert c.activation_checkpointing_kwargs["use_reentrant"] is False
    assert c.gradient_checkpointing_kwargs == c.activation_checkpointing_kwargs  # TRL reads the old name
    assert c.activation_checkpointing_kwargs.get("debug", False) is False


def test_reentrant_checkpointing_is_refused_under_the_old_name_too(tmp_path):
    with pytest.raises(ValueError, match=r"^OBLRGRPOConfig: activation_checkpointing_kwargs=.*use_reentrant=False"):
        _cfg(tmp_path, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})
    assert _cfg(tmp_path, activation_checkpointing_kwargs={"use_reentrant": True}).activation_checkpointing is False


def test_every_rule_has_a_case():
    assert {r.setting for r in RULES} == set(BAD) | {"per_device_train_batch_size"}


@pytest.mark.parametrize("setting", sorted(BAD))
def test_refused_with_its_message(tmp_path, setting):
    kw = BAD[setting]
    if kw == "parallelism":
        from accelerate.parallelism_config import ParallelismConfig

        kw = dict(parallelism_config=ParallelismConfig(tp_size=1))
    rule = next(r for r in RULES if r.setting == setting)
    with pytest.raises(ValueError) as e:
        _cfg(tmp_path, **kw)
    msg = str(e.value)
    assert msg.startswith(f"OBLRGRPOConfig: {setting}=") and "\n" not in msg
    assert msg.endswith(f"use {rule.use}")


def test_compatible_explicit_values_pass(tmp_path):
    _cfg(tmp_path, temperature=0.7, oblr_baseline="rloo", oblr_snr_lr=False, lr_scheduler_type="cosine",
         delta=1.5, importance_sampling_level="sequence", generation_kwargs={"use_cache": True},
         gradient_accumulation_steps=2)


def test_kl_and_nucleus_are_accepted(tmp_path):
    """beta > 0 (oblr's sequence KL) and top_p < 1 (scored under the nucleus) pass; top_p is still refused out
    of (0, 1] and with vLLM's importance-sampling correction, top_k and min_p whatever the rest."""
    c = _cfg(tmp_path, beta=0.04, top_p=0.9)
    assert (c.beta, c.top_p) == (0.04, 0.9)
    _cfg(tmp_path, top_p=0.9, use_vllm=True, vllm_importance_sampling_correction=False)
    for kw in (dict(top_p=0.0), dict(top_p=1.5), dict(top_p=0.9, top_k=20), dict(top_p=0.9, min_p=0.05)):
        with pytest.raises(ValueError, match=r"^OBLRGRPOConfig: (top_p|top_k|min_p)=.*; use ") as e:
            _cfg(tmp_path, **kw)
        assert "\n" not in str(e.value)


def test_learning_rate_auto_selects_the_auto_schedule_with_its_initial_guess(tmp_path):
    from oblr.integrations.trl.config import AUTO_GUESS

    cfg = _cfg(tmp_path, learning_rate="auto")
    assert (cfg.oblr_lr_schedule, cfg.learning_rate) == ("auto", AUTO_GUESS)
    ok = _cfg(tmp_path, oblr_lr_schedule="auto", oblr_schedule_options={"max_change": 1.5, "probe": 0.1})
    assert ok.oblr_schedule_options == {"max_change": 1.5, "probe": 0.1}


def test_an_unknown_schedule_option_names_the_accepted_ones(tmp_path):
    with pytest.raises(ValueError, match="max_change") as e:
        _cfg(tmp_path, oblr_schedule_options={"max_change": 2.0})  # snr has no options
    assert "\n" not in str(e.value)


def test_trl_default_learning_rate_as_eta_max_warns(tmp_path):
    with pytest.warns(UserWarning, match="eta_max"):
        _cfg(tmp_path)  # learning_rate unset: TRL's 1e-6
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _cfg(tmp_path, learning_rate=1e-4)
        _cfg(tmp_path, learning_rate="auto")


def test_docs_list_every_refused_setting():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "trl.md").read_text()
    missing = [r.setting for r in RULES if f"`{r.setting}`" not in doc]
    assert not missing, f"docs/trl.md does not list {missing}"


def test_trainer_needs_the_oblr_config(tmp_path):
    from trl import GRPOConfig

    with pytest.raises(TypeError, match="OBLRGRPOConfig"):
        OBLRGRPOTrainer(model="unused", reward_funcs=[], args=GRPOConfig(output_dir=str(tmp_path), **BASE))


def test_trainer_refuses_rollout_func(tmp_path):
    with pytest.raises(ValueError, match="rollout_func"):
        OBLRGRPOTrainer(model="unused", reward_funcs=[], args=_cfg(tmp_path), rollout_func=lambda *a: {})
