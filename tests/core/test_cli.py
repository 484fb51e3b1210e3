"""The command line: one-line validation errors before any model loads, plugins (--plugin and the
oblr.plugins entry points) whose registrations the config accepts, `oblr tasks` and `--help`."""

from __future__ import annotations

import sys

import pytest

import oblr.plugins
from oblr.cli import main
from oblr.estimators import ESTIMATORS

PLUGIN = "oblr_test_plugin"


@pytest.fixture
def no_model(monkeypatch):
    import oblr.models

    def fail(*a, **k):
        raise AssertionError("a model must not load before the config is validated")

    monkeypatch.setattr(oblr.models, "load_model_and_tokenizer", fail)


@pytest.fixture
def plugin_cleanup():
    yield
    if "test_plugin_zero" in ESTIMATORS:
        ESTIMATORS.unregister("test_plugin_zero")
    sys.modules.pop(PLUGIN, None)
    oblr.plugins._loaded.discard(PLUGIN)


@pytest.mark.parametrize("override, key, names", [
    ("rollout.engine=nope", "rollout.engine", "registered: hf"),
    ("algorithm.baseline=nope", "algorithm.baseline", "registered: dr_grpo, grpo, oblr, oblr_self, opo, otb_proxy"),
])
def test_unknown_choice_is_one_line_before_any_model_loads(no_model, capsys, tmp_path, override, key, names):
    assert main(["train", override, "--output-dir", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config key '{key}'" in err and names in err and "'nope'" in err
    assert not (tmp_path / "r").exists()


def test_plugin_registration_is_accepted_without_editing_the_config(no_model, monkeypatch, capsys, plugin_cleanup):
    import oblr.train

    assert main(["train", "algorithm.baseline=test_plugin_zero", "--quiet"]) == 2  # unknown without the plugin
    assert "unknown estimator 'test_plugin_zero'" in capsys.readouterr().err
    seen = {}
    monkeypatch.setattr(oblr.train, "train", lambda cfg, **kw: seen.setdefault("cfg", cfg))
    assert main(["train", "--plugin", PLUGIN, "algorithm.baseline=test_plugin_zero", "--quiet"]) == 0
    assert seen["cfg"].algorithm.baseline == "test_plugin_zero"
    assert main(["tasks", "--plugin", PLUGIN]) == 0
    assert "test_plugin_zero" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["train", "--plugin", PLUGIN, "--help"])
    assert "test_plugin_zero" in capsys.readouterr().out


def test_a_plugin_that_cannot_be_imported_is_one_line(capsys):
    assert main(["train", "--plugin", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--plugin no_such_module_xyz: cannot import it" in err


def test_entry_point_plugins_are_loaded(monkeypatch, plugin_cleanup):
    calls = []

    class EP:
        name, value = "demo", "oblr_test_plugin:register"

        def load(self):
            def register():
                calls.append(1)
                import oblr_test_plugin  # noqa: F401
            return register

    monkeypatch.setattr(oblr.plugins, "entry_points", lambda group: [EP()] if group == "oblr.plugins" else [])
    monkeypatch.setattr(oblr.plugins, "_loaded", set())
    assert oblr.plugins.load_plugins() == ["oblr.plugins:demo"]
    assert calls == [1] and "test_plugin_zero" in ESTIMATORS
    assert oblr.plugins.load_plugins() == []  # once per process


def test_tasks_lists_every_registry(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for key in ("task.name", "rollout.engine", "algorithm.baseline", "algorithm.lr_schedule",
                "algorithm.norms_method", "optim.optimizer"):
        assert key in out
    assert "arithmetic" in out and "oblr" in out and "loop" in out
