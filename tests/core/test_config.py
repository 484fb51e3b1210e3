from pathlib import Path

import pytest

from oblr.config import ConfigError, config_help, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_validate():
    cfg = load_config()
    assert cfg.algorithm.baseline == "oblr" and cfg.algorithm.lr_schedule == "snr"
    assert cfg.model.name_or_path == "builtin"


def test_dotted_overrides_parse_yaml_scalars():
    cfg = load_config(None, ["optim.lr=3e-4", "algorithm.baseline=rloo", "train.eval_greedy=false",
                             "optim.betas=[0.9, 0.95]", "task.options={difficulty: hard}"])
    assert cfg.optim.lr == 3e-4 and cfg.algorithm.baseline == "rloo"
    assert cfg.train.eval_greedy is False and cfg.optim.betas == [0.9, 0.95]
    assert cfg.task.options == {"difficulty": "hard"}


def test_int_is_accepted_for_float():
    assert load_config(None, ["optim.lr=1"]).optim.lr == 1.0


@pytest.mark.parametrize("override, needle", [
    (["optim.lrr=1e-3"], "unknown config key 'optim.lrr'; did you mean 'optim.lr'"),
    (["rollout.group_size=abc"], "config key 'rollout.group_size': expected int"),
    (["rollout.group_size=1"], "config key 'rollout.group_size': must be in [2, 2^31-1], got 1"),
    (["algorithm.baseline=nope"], "config key 'algorithm.baseline': unknown estimator 'nope'; registered: dr_grpo"),
    (["algorithm.lr_schedule=linear"], "config key 'algorithm.lr_schedule': unknown learning-rate schedule 'linear'"),
    (["rollout.engine=nope"], "config key 'rollout.engine': unknown rollout engine 'nope'; registered: hf"),
    (["algorithm.norms_method=exact"], "config key 'algorithm.norms_method': unknown gradient-norm method 'exact'"),
    (["optim.optimizer=lion"], "config key 'optim.optimizer': unknown optimizer 'lion'; registered: adamw, sgd"),
    (["task.name=nope"], "config key 'task.name': unknown task 'nope'; registered: "),
    (["optim.lr=-1"], "config key 'optim.lr': must be in (0, 1e6], got -1.0"),
    (["model.dtype=fp8"], "config key 'model.dtype'"),
    (["nosection.x=1"], "unknown config key 'nosection'"),
    (["optim.lr"], "is not of the form section.key=value"),
    (["rollout.prompts_per_step=1"], "needs at least 2 prompts"),
])
def test_bad_config_messages_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config(None, override)
    assert needle in str(e.value)


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(p)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if not p.name.startswith("grid")))
def test_shipped_recipes_load_and_validate(name):
    cfg = load_config(ROOT / "configs" / name)
    assert cfg.rollout.group_size >= 2


def test_paper_recipes_match_the_paper_shape():
    for name in ("qwen3-4b-base-gsm8k.yaml", "qwen3-8b-base-gsm8k.yaml"):
        cfg = load_config(ROOT / "configs" / name)
        assert (cfg.rollout.group_size, cfg.rollout.prompts_per_step) == (8, 128)
        assert cfg.task.name == "gsm8k" and cfg.algorithm.baseline == "oblr"


def test_help_lists_every_key():
    text = config_help()
    assert "optim.lr (float, default 0.001)" in text and "algorithm.baseline" in text
