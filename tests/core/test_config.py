from pathlib import Path

import pytest

from oblr.config import ConfigError, config_help, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_validate():
    cfg = load_config()
    assert cfg.algorithm.baseline == "oblr" and cfg.algorithm.lr_schedule == "kl"
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
    (["rollout.prompts_per_step=1", "algorithm.lr_schedule=snr"], "needs at least 2 prompts"),
    (["algorithm.lr_schedule=snr_adam", "optim.optimizer=sgd"],
     "config key 'algorithm.lr_schedule': 'snr_adam' is derived for optim.optimizer adamw, got 'sgd'; with sgd use "
     "lr_schedule=snr"),
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


# ------------------------------------------------------------------------------- ranges (issue 12, item 9)
def test_every_numeric_key_declares_its_range():
    import dataclasses
    import typing

    from oblr.config import Config, Range

    for sec in dataclasses.fields(Config):
        cls = typing.get_type_hints(Config)[sec.name]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if hints[f.name] in (int, float):
                assert isinstance(f.metadata.get("range"), Range), f"{sec.name}.{f.name} has no range"


@pytest.mark.parametrize("key, bad", [
    ("optim.lr", ["inf", "-inf", "nan", "1e300", "-1", "0", "2e6"]),
    ("optim.eta_min", ["nan", "-1e-9", "inf"]),
    ("optim.snr_ema", ["1", "-0.1", "nan"]),
    ("optim.grad_clip", ["-1", "inf", "nan"]),
    ("optim.weight_decay", ["-0.1", "nan"]),
    ("optim.momentum", ["1", "-0.5"]),
    ("optim.warmup_steps", ["-1"]),
    ("rollout.temperature", ["0", "-1", "nan", "inf", "1e-300"]),
    ("rollout.top_p", ["0", "1.01", "nan"]),
    ("rollout.group_size", ["1", "0", "-3"]),
    ("rollout.prompts_per_step", ["0"]),
    ("rollout.max_new_tokens", ["0", str(2**31)]),
    ("rollout.batch_size", ["0"]),
    ("algorithm.kl_coef", ["-0.1", "nan", "inf"]),
    ("algorithm.clip_eps", ["0", "nan", "2"]),
    ("algorithm.epochs", ["0"]),
    ("algorithm.max_len", ["-1"]),
    ("algorithm.micro_batch_groups", ["-1"]),
    ("algorithm.memory_budget_gb", ["0", "-1", "nan", "inf"]),
    ("model.lora_rank", ["-1"]),
    ("model.lora_alpha", ["0", "nan"]),
    ("train.steps", ["0", "-1", "1" + "0" * 400]),
    ("train.threads", ["-1", "100000"]),
    ("train.seed", ["-1", str(2**32)]),
    ("train.eval_samples", ["0"]),
    ("train.keep_checkpoints", ["0"]),
    ("train.max_bad_steps", ["0"]),
    ("task.eval_size", ["-1"]),
    ("distributed.timeout_s", ["0", "inf", "nan"]),
])
def test_numeric_keys_refuse_values_out_of_range(key, bad):
    for value in bad:
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"{key}={value}"])
        msg = str(e.value)
        assert msg.startswith(f"config key '{key}': must be ") and "\n" not in msg, (value, msg)


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["optim.lr=inf", "train.steps=0", "rollout.top_p=2", "task.options.foo=1"])
    msg = str(e.value)
    for key in ("optim.lr", "train.steps", "rollout.top_p", "task.options.foo"):
        assert key in msg, msg
    with pytest.raises(ConfigError) as e:  # unknown keys and wrong types: all of them too
        load_config(None, ["optim.lrr=1", "train.steps=abc", "nosection.x=1"])
    assert all(k in str(e.value) for k in ("optim.lrr", "train.steps", "nosection")), str(e.value)
    with pytest.raises(ConfigError) as e:  # every kind at once: a malformed override, an unknown key, a wrong
        load_config(None, ["oops", "optim.lrr=1", "train.steps=abc", "optim.lr=inf",  # type, a range, a choice
                           "algorithm.baseline=nope"])
    msg = str(e.value)
    for part in ("'oops' is not of the form", "optim.lrr", "train.steps", "'optim.lr': must be in",
                 "unknown estimator 'nope'"):
        assert part in msg, (part, msg)
    with pytest.raises(ConfigError) as e:  # a key that did not parse keeps its default: no second message for it
        load_config(None, ["optim.lr=abc"])
    assert str(e.value).count("optim.lr") == 1, str(e.value)


def test_cross_key_rules_and_help_show_the_ranges():
    with pytest.raises(ConfigError, match=r"optim.eta_min': must be in \[0, optim.lr = 0.001\], got 0.01"):
        load_config(None, ["optim.eta_min=0.01"])
    assert load_config(None, ["optim.lr=3000", "optim.optimizer=sgd"]).optim.lr == 3000  # large SGD steps stay legal
    text = config_help()
    assert "optim.lr (float, default 0.001): " in text and "[in (0, 1e6]]" in text
    assert ("train.threads (int, default 0): torch CPU threads (0 = the cores other work leaves free at the start: "
            "torch's own count less the busy cores, at least 1; OMP_NUM_THREADS, if set, wins) [in [0, 1024]]") in text


# ------------------------------------------------------------------- options of dict-valued keys (item 10)
def test_task_options_are_checked_against_the_factory_signature():
    cfg = load_config(None, ["task.name=gsm8k", "task.options={limit: 5, timeout: 2}"])
    assert cfg.task.options == {"limit": 5, "timeout": 2.0}  # coerced as annotated (timeout: float)
    for ov, needle in [
        ("task.options={limitt: 5}", "unknown option task.options.limitt (did you mean 'limit'?): task 'gsm8k' "
                                     "accepts template, limit, train_limit, timeout, root"),
        ("task.options.timeout=nan", "config key 'task.options.timeout': must be in (0, 3600], got nan"),
        ("task.options.limit=abc", "config key 'task.options.limit': expected int | None, got 'abc'"),
        ("task.options.tokenizer=x", "config key 'task.options.tokenizer': not an option to set here"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_config(None, ["task.name=gsm8k", ov])
        assert needle in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="config key 'task.options.on_error': must be one of raise, skip, got 'ignore'"):
        load_config(None, ["task.name=math_data", "task.options={train: x.jsonl, on_error: ignore}"])


def test_plugin_entries_are_checked_by_their_own_signatures():
    from typing import Annotated

    from oblr.config import Range
    from oblr.estimators import ESTIMATORS, register_estimator
    from oblr.tasks import TASKS, register_task

    @register_task("_test_opts")
    def _task(*, size: Annotated[int, Range(ge=1, le=10)] = 3, mode: str = "a", path: str):
        raise AssertionError("not built by validation")

    @register_estimator("_test_opts_est")
    def _est(rewards, weights=None, *, scale: Annotated[float, Range(gt=0)] = 1.0):
        return rewards * 0

    try:
        ok = load_config(None, ["task.name=_test_opts", "task.options={path: p, size: 10}",
                                "algorithm.baseline=_test_opts_est", "algorithm.baseline_options.scale=2"])
        assert ok.task.options == {"path": "p", "size": 10} and ok.algorithm.baseline_options == {"scale": 2.0}
        with pytest.raises(ConfigError) as e:
            load_config(None, ["task.name=_test_opts", "task.options={size: 11, mode: 3}",
                               "algorithm.baseline=_test_opts_est", "algorithm.baseline_options.scale=0"])
        msg = str(e.value)
        for needle in ("config key 'task.options.size': must be in [1, 10], got 11",
                       "config key 'task.options.mode': expected str, got int 3",
                       "config key 'task.options': task '_test_opts' needs the option(s) path",
                       "config key 'algorithm.baseline_options.scale': must be > 0, got 0.0"):
            assert needle in msg, msg
    finally:
        TASKS.unregister("_test_opts")
        ESTIMATORS.unregister("_test_opts_est")


def test_vllm_engine_options_are_checked_without_importing_vllm():
    import subprocess
    import sys

    code = """
import sys
from oblr.config import ConfigError, check_options
from oblr.rollout import ENGINES
print(check_options(ENGINES, "vllm", {"memory_fraction": 0.3, "max_model_len": 512, "enforce_eager": True,
                                      "llm_kwargs": {"tensor_parallel_size": 1}}, "rollout.engine_options"))
try:
    check_options(ENGINES, "vllm", {"memory_fraction": 1.5, "max_model_len": 0, "gpu_util": 1},
                  "rollout.engine_options")
except ConfigError as e:
    print(e)
print("vllm imported:", "vllm" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    accepted, refused, imported = r.stdout.strip().splitlines()
    assert accepted == ("{'memory_fraction': 0.3, 'max_model_len': 512, 'enforce_eager': True, "
                        "'llm_kwargs': {'tensor_parallel_size': 1}}")
    assert refused == ("unknown option rollout.engine_options.gpu_util: rollout engine 'vllm' accepts model_path, "
                       "memory_fraction, max_model_len, batch_size, enforce_eager, seed, llm_kwargs; "
                       "config key 'rollout.engine_options.memory_fraction': must be in (0, 1), got 1.5; "
                       "config key 'rollout.engine_options.max_model_len': must be in [1, 2^31-1], got 0")
    assert imported == "vllm imported: False"
    with pytest.raises(ConfigError) as e:  # in the config, next to the engine's own check
        load_config(None, ["rollout.engine=vllm", "rollout.engine_options={memory_fraction: 2}"])
    assert "config key 'rollout.engine_options.memory_fraction': must be in (0, 1), got 2.0" in str(e.value)


def test_quickstart_config_is_the_defaults():
    """configs/quickstart.yaml says `oblr train` with no arguments uses exactly its values."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    written = yaml.safe_load(path.read_text())
    defaults = load_config()
    for section, values in written.items():
        for key, value in values.items():
            assert getattr(getattr(defaults, section), key) == value, f"{section}.{key}"
    assert load_config(str(path)) == defaults
