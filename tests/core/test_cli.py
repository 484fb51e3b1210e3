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


@pytest.mark.parametrize("key, package", [("train.tensorboard", "tensorboard"), ("train.wandb", "wandb")])
def test_a_sink_without_its_package_is_one_line_before_the_run_folder(no_model, capsys, monkeypatch, tmp_path,
                                                                      key, package):
    """train.tensorboard / train.wandb whose package cannot be found: exit 2, one line naming the key and the
    install command, no run folder; with the package findable the same command gets past validation."""
    import importlib.util

    import oblr.train

    real = importlib.util.find_spec
    installed = {"yes": False}

    def find_spec(name, *a, **k):
        if name == package:
            return object() if installed["yes"] else None
        return real(name, *a, **k)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    out = tmp_path / "r"
    assert main(["train", f"{key}=true", "--output-dir", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"oblr: error: config key '{key}': ")
    assert f"pip install 'oblr[{package}]'" in err
    assert not out.exists()
    installed["yes"] = True
    seen = []
    monkeypatch.setattr(oblr.train, "train", lambda cfg, **kw: seen.append(getattr(cfg.train, package)))
    assert main(["train", f"{key}=true", "--output-dir", str(out), "--quiet"]) == 0 and seen == [True]


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


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "0"], "--nproc must be in [1, 1024]"),
    (["--nproc", "100000"], "--nproc must be in [1, 1024]"),
    (["--nproc", "2", "rollout.prompts_per_step=3"], "N = 3 prompts per step do not split over 2 ranks"),
    (["--nproc", "2", "distributed.backend=nccl", "model.device=cpu"], "backend 'nccl'"),
])
def test_nproc_refuses_a_bad_setup_in_one_line_before_torchrun_starts(no_model, capsys, monkeypatch, argv, message):
    monkeypatch.setattr("os.execve", lambda *a: pytest.fail("torchrun must not start"))
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err, err


def test_nproc_inside_a_torchrun_launch_is_refused(no_model, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("os.execve", lambda *a: pytest.fail("torchrun must not start"))
    assert main(["train", "--nproc", "2"]) == 2
    assert "leave --nproc out under torchrun" in capsys.readouterr().err


def test_nproc_runs_torchrun_with_the_same_arguments(monkeypatch, tmp_path):
    """The command that replaces the process (what the 2-process run of tests/distributed executes)."""
    from oblr.cli import build_parser
    from oblr.launch import torchrun_command

    calls = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.execve", lambda exe, cmd, env: calls.append((exe, cmd, env)))
    main(["train", "--nproc", "2", "train.steps=3", "--output-dir", str(tmp_path), "--resume", "--quiet"])
    (exe, cmd, env), = calls
    assert exe == sys.executable and env["OMP_NUM_THREADS"] == "1"
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
                   "oblr.cli", "train", "train.steps=3", f"train.output_dir={tmp_path}", "distributed.strategy=ddp",
                   "--resume", "--quiet"]
    # one process keeps strategy none; plugins are passed on
    args = build_parser().parse_args(["train", "--nproc", "1", "--plugin", PLUGIN])
    cmd, overrides = torchrun_command(args, [])
    assert cmd[5:] == ["1", "-m", "oblr.cli", "train", "--plugin", PLUGIN] and overrides == []


def test_an_os_error_is_one_line_naming_the_file(monkeypatch, capsys):
    """A fault of the machine (a full disk while the built-in model is written, a vanished folder) ends in
    one line with exit status 1, not a traceback; OBLR_DEBUG=1 gives the traceback."""
    import errno

    import oblr.cli as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/cache/model.safetensors")

    monkeypatch.setattr(cli, "_cmd_tasks", full)
    assert cli.main(["tasks"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["oblr: error: [Errno 28] No space left on device: '/cache/model.safetensors' "
                   "(OBLR_DEBUG=1 shows the traceback)"]
    monkeypatch.setenv("OBLR_DEBUG", "1")
    with pytest.raises(OSError):
        cli.main(["tasks"])


@pytest.mark.parametrize("cores, warned", [(1, True), (2, False), (64, False)])
def test_nproc_beyond_the_cores_warns_like_train_threads(monkeypatch, capsys, tmp_path, cores, warned):
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    monkeypatch.setattr("os.execve", lambda *a: None)
    main(["train", "--nproc", "2", "--output-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    line = f"[oblr] --nproc 2 exceeds this machine's {cores} CPU cores; processes will compete for them\n"
    assert (err == line) if warned else (err == "")


def test_under_torchrun_the_default_strategy_becomes_ddp_and_is_logged(monkeypatch, capsys, tmp_path):
    """WORLD_SIZE > 1 with distributed.strategy none (the default): ddp, said once by rank 0; one process
    and an explicit strategy are left as they are."""
    import oblr.train

    seen = []
    monkeypatch.setattr(oblr.train, "train", lambda cfg, **k: seen.append(cfg.distributed.strategy))
    for world, rank, extra, strategy, said in [("2", "0", [], "ddp", True), ("2", "1", [], "ddp", False),
                                               ("1", "0", [], "none", False),
                                               ("2", "0", ["distributed.strategy=fsdp"], "fsdp", False)]:
        monkeypatch.setenv("WORLD_SIZE", world)
        monkeypatch.setenv("RANK", rank)
        assert main(["train", *extra, "--output-dir", str(tmp_path), "--quiet"]) == 0
        assert seen.pop() == strategy
        err = capsys.readouterr().err
        assert err == ("[oblr] torchrun started 2 processes: distributed.strategy none becomes ddp\n" if said else "")


def test_python_m_oblr_is_the_cli(tmp_path):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "oblr", "train", "optim.lr=inf"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr == "oblr: error: config key 'optim.lr': must be in (0, 1e6], got inf\n"


def _commands(parser, prefix=()):
    """Every command line ``[cmd, subcmd, ...]`` of ``parser``'s subcommands, nested ones included."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield [*prefix, name]
                yield from _commands(sub, (*prefix, name))


def test_no_help_text_shows_rest_markup(capsys):
    """`oblr <cmd> --help` for every subcommand (and `oblr --help`): plain text, no reST roles or literals."""
    from oblr.cli import build_parser

    commands = list(_commands(build_parser()))
    assert {"train", "eval", "compare", "report", "proxy-study", "models", "tasks"} <= {c[0] for c in commands}
    for argv in [[], *commands]:
        with pytest.raises(SystemExit) as e:
            main([*argv, "--help"])
        text = capsys.readouterr().out
        assert e.value.code == 0 and text.startswith("usage: oblr"), argv
        for markup in ("``", ":func:", ":mod:", ":class:", ":meth:", ":data:"):
            assert markup not in text, (argv, markup)


def test_plain_text_of_rest():
    from oblr.cli import plain_text

    assert plain_text("see :func:`oblr.rollout.generate` and :class:`~oblr.train.Trainer`, ``n`` samples "
                      "(:mod:`oblr.grading`, :py:meth:`a.b`, :ref:`the guide <guide>`)") == (
        "see oblr.rollout.generate and Trainer, n samples (oblr.grading, a.b, the guide)")
    assert plain_text(None) is None and plain_text("no markup: `oblr tasks`") == "no markup: `oblr tasks`"
