"""Hostile and wrong input (issue 12, items 8-11): each ends in one line on stderr (exit status 2) before any
model loads, or in the behaviour asked for (``on_error=skip`` skips).

"Before any model loads" is checked, not timed: in-process runs of ``oblr.cli.main`` replace the model
loader with one that raises :class:`ModelReached`, so an error that came after the model would fail the test;
subprocess runs (for what would hang or crash a test process: an alias bomb, a segfault) point the model cache
at an empty folder that must stay empty, and run under a time limit (and a memory limit where no model is
involved) so a regression fails instead of hanging CI.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fault_helpers import DEADLINE, env

from oblr.cli import main
from oblr.config import ConfigError, load_config
from oblr.tasks.loaders import load_file


class ModelReached(Exception):
    """Raised by the patched model loader: the run got past every check up to the model."""


@pytest.fixture
def no_model(monkeypatch):
    """Any model load or build raises :class:`ModelReached`."""
    import oblr.models
    import oblr.models.builtin

    def reached(*a, **k):
        raise ModelReached

    monkeypatch.setattr(oblr.models, "load_model_and_tokenizer", reached)
    monkeypatch.setattr(oblr.models.builtin, "build_builtin_model", reached)


def one_error_line(capsys, argv) -> str:
    """Run the CLI in-process; it must exit 2 with exactly one line ``oblr: error: ...`` on stderr."""
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("oblr: error: "), f"rc {rc}:\n{err[-3000:]}"
    return lines[0]


def train(tmp_path, *overrides) -> list[str]:
    return ["train", "train.threads=1", *overrides, "--output-dir", str(tmp_path / "run"), "--quiet"]


def bomb(levels: int = 9, width: int = 9, indent: str = "    ") -> str:
    """A "billion laughs" YAML block: ``width ** levels`` strings through ``levels`` nested aliases."""
    lines = [f"{indent}- &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"{indent}- &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def limit_memory(gib: int = 3) -> None:
    """In a child before exec: at most ``gib`` GiB of address space (an expanded alias bomb needs tens)."""
    resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))


def write_rows(path: Path, lines: list[bytes | str | dict]) -> Path:
    with open(path, "wb") as f:
        for ln in lines:
            ln = json.dumps(ln) if isinstance(ln, dict) else ln
            f.write((ln.encode() if isinstance(ln, str) else ln) + b"\n")
    return path


# --------------------------------------------------------------------------------------------- item 8
def test_alias_bombs_and_deep_yaml_are_refused_within_a_memory_limit(tmp_path):
    """A 9**9-string alias bomb in a config value, in an override and in a saved run config, a recursive alias
    and 100000-deep nesting: each refused in one line, in a process limited to 2 GiB and 120 s (unprotected,
    expanding the bomb needs tens of GB)."""
    (tmp_path / "bomb.yaml").write_text("model:\n  lora_targets:\n" + bomb(indent="    "))
    (tmp_path / "cycle.yaml").write_text("model:\n  lora_targets: &a [q_proj, *a]\n")
    (tmp_path / "deep.yaml").write_text("task:\n  options:\n    x: " + "[" * 100_000 + "]" * 100_000 + "\n")
    flow_bomb = "[" + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}" if i else "lol"] * 9) + "]"
                                for i in range(9)) + "]"
    code = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from oblr.config import Config, ConfigError, load_config
        from oblr.train.run_dir import config_diff
        d, flow = sys.argv[1], sys.argv[2]
        for name in ("bomb", "cycle", "deep"):
            try:
                load_config(f"{d}/{name}.yaml")
                print(name, "accepted")
            except ConfigError as e:
                print(name, "refused:", e)
        try:
            load_config(None, ["model.lora_targets=" + flow])
            print("override accepted")
        except ConfigError as e:
            print("override refused:", e)
        print("saved config as a run folder's:", config_diff(f"{d}/bomb.yaml", Config()))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path), flow_bomb], capture_output=True, text=True,
                       env=env(), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert out["bomb"].startswith(f"refused: config file {tmp_path}/bomb.yaml: expands to more than 100000 "
                                  f"values through its YAML aliases"), out
    assert "a YAML alias refers to a value that contains it" in out["cycle"], out
    assert f"refused: config file {tmp_path}/deep.yaml:3:" in out["deep"] and "nested deeper than 50" in out["deep"]
    assert out["override"].startswith("refused: override model.lora_targets: expands to more than"), out
    assert out["saved"] == "config as a run folder's: None"  # unreadable as a config: resume refuses it


def test_alias_bomb_config_is_one_line_before_the_model_from_the_command_line(tmp_path):
    (tmp_path / "bomb.yaml").write_text("model:\n  lora_targets:\n" + bomb())
    cache = tmp_path / "cache"
    cache.mkdir()
    r = subprocess.run([sys.executable, "-m", "oblr.cli", "train", "--config", str(tmp_path / "bomb.yaml"),
                        "train.threads=1", "--output-dir", str(tmp_path / "run"), "--quiet"],
                       capture_output=True, text=True, env={**env(), "OBLR_CACHE_DIR": str(cache)}, timeout=DEADLINE,
                       preexec_fn=limit_memory)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-3000:]
    assert "bomb.yaml: expands to more than 100000 values through its YAML aliases" in r.stderr
    assert list(cache.iterdir()) == [] and not (tmp_path / "run").exists()  # no model built, no folder made


def test_grid_file_with_an_alias_bomb_is_refused(tmp_path):
    from oblr.experiments.grid import load_grid

    (tmp_path / "grid.yaml").write_text("base:\n  model:\n    lora_targets:\n" + bomb(indent="      ")
                                        + "runs:\n- name: a\n")
    with pytest.raises(ConfigError, match=r"grid file .*grid\.yaml: expands to more than 100000 values"):
        load_grid(tmp_path / "grid.yaml")


def test_over_deep_json_rows_name_file_and_line_and_are_skippable(tmp_path):
    p = write_rows(tmp_path / "deep.jsonl", [{"question": "1+1?", "answer": "2"},
                                            '{"question": "x", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}",
                                            {"question": "2+2?", "answer": "4"}])
    with pytest.raises(ValueError, match=r"deep\.jsonl:2: JSON nested deeper than 50 levels"):
        load_file(p)
    with pytest.warns(RuntimeWarning, match="skipped 1 malformed"):
        assert [r.answer for r in load_file(p, on_error="skip")] == ["2", "4"]


# --------------------------------------------------------------------------------------------- item 9
@pytest.mark.parametrize("override, needle", [
    ("optim.lr=inf", "config key 'optim.lr': must be in (0, 1e6], got inf"),
    ("optim.lr=1e300", "config key 'optim.lr': must be in (0, 1e6], got 1e+300"),
    ("optim.lr=nan", "config key 'optim.lr': must be in (0, 1e6], got nan"),
    ("rollout.temperature=nan", "config key 'rollout.temperature'"),
    ("train.steps=-1", "config key 'train.steps': must be in [1, 2^31-1], got -1"),
])
def test_out_of_range_numbers_are_one_line_before_the_model(no_model, capsys, tmp_path, override, needle):
    line = one_error_line(capsys, train(tmp_path, override))
    assert needle in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags, needle", [
    (["--temperature", "nan", "--n", "2"], "evaluate: temperature must be in [0, 100], got nan"),
    (["--top-p", "inf"], "evaluate: top_p must be in (0, 1], got inf"),
    (["--timeout", "0"], "evaluate: timeout must be in (0, 3600], got 0.0"),
    (["--max-new-tokens", "0"], "evaluate: max_new_tokens must be in [1, 2^31-1], got 0"),
    (["--seed", "-1"], "evaluate: seed must be in [0, 2^32-1], got -1"),
    (["--engine-options", "{memory_fraction: 0.3}"], "unknown option --engine-options.memory_fraction: "
                                                      "rollout engine 'hf' accepts batch_size"),
])
def test_eval_flags_out_of_range_are_one_line_before_the_model(no_model, capsys, tmp_path, flags, needle):
    line = one_error_line(capsys, ["eval", "--model", "builtin", "--benchmarks", "gsm8k", "--limit", "1",
                                   "--output-dir", str(tmp_path / "e"), *flags])
    assert needle in line, line


def test_train_threads_beyond_the_cap_is_one_line_not_a_segfault(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    r = subprocess.run([sys.executable, "-m", "oblr.cli", *train(tmp_path, "train.threads=100000")],
                       capture_output=True, text=True, env={**env(), "OBLR_CACHE_DIR": str(cache)}, timeout=DEADLINE)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr[-3000:])
    assert "config key 'train.threads': must be in [0, 1024], got 100000" in r.stderr
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------------------------------------- item 10
@pytest.mark.parametrize("override, needle", [
    ("task.options.foo=1", "unknown option task.options.foo: task 'arithmetic' accepts seed, n_train, n_eval, "
                           "difficulty, min_ops, max_ops, max_operand, max_value, ops"),
    ("task.options.n_trian=5", "unknown option task.options.n_trian (did you mean 'n_train'?)"),
    ("task.options.n_train=-5", "config key 'task.options.n_train': must be in [0, 1e7], got -5"),
    ("algorithm.baseline_options.foo=1", "unknown option algorithm.baseline_options.foo: estimator 'oblr' "
                                         "accepts guard_eps"),
    ("rollout.engine_options.memory_fraction=0.3", "unknown option rollout.engine_options.memory_fraction: "
                                                   "rollout engine 'hf' accepts no options"),
    ("rollout.engine_options.batch_size=4", "config key 'rollout.engine_options.batch_size': not an option to "
                                            "set here (set rollout.batch_size instead)"),
])
def test_options_of_dict_valued_keys_are_checked_with_the_config(no_model, capsys, tmp_path, override, needle):
    line = one_error_line(capsys, train(tmp_path, override))
    assert needle in line, line


# --------------------------------------------------------------------------------------------- item 11
def test_a_device_this_machine_lacks_is_one_line_before_the_model(no_model, capsys, tmp_path):
    import torch

    assert "'cuda:x' is not auto, cpu, cuda, cuda:N or mps" in one_error_line(
        capsys, train(tmp_path, "model.device=cuda:x"))
    if not torch.cuda.is_available():
        assert "device 'cuda:0' asked for, but this machine has no CUDA device" in one_error_line(
            capsys, train(tmp_path, "model.device=cuda"))
        assert "this machine has no CUDA device" in one_error_line(
            capsys, ["eval", "--model", "builtin", "--device", "cuda", "--output-dir", str(tmp_path / "e")])
    if not torch.backends.mps.is_available():
        assert "device 'mps' asked for, but this machine has no MPS" in one_error_line(
            capsys, train(tmp_path, "model.device=mps"))


def test_a_data_path_that_does_not_exist_is_refused_at_once_never_tried_on_the_hub(no_model, capsys, tmp_path,
                                                                                 monkeypatch):
    import datasets

    def hub(*a, **k):
        raise AssertionError("a path-looking name was tried as a Hub dataset")

    monkeypatch.setattr(datasets, "load_dataset", hub)
    for path in ("nonexistent/train.jsonl", str(tmp_path / "missing"), "./data/x", "~/no/such/file.parquet"):
        line = one_error_line(capsys, train(tmp_path, "task.name=math_data", f"task.options.train={path}"))
        assert line == f"oblr: error: data file not found: {path}", line


@pytest.fixture
def data(tmp_path):
    good = write_rows(tmp_path / "good.jsonl", [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(4)])
    bad_utf8 = write_rows(tmp_path / "latin1.jsonl", [{"question": "1+1?", "answer": "2"},
                                                     '{"question": "caf\xe9 2+2?", "answer": "4"}'.encode("latin-1"),
                                                     {"question": "3+3?", "answer": "6"},
                                                     {"question": "4+4?", "answer": "8"}])
    obj = write_rows(tmp_path / "obj.jsonl", [{"question": "1+1?", "answer": "2"},
                                             {"question": "2+2?", "answer": {"value": 4}},
                                             {"question": "3+3?", "answer": "6"}])
    return good, bad_utf8, obj


def test_a_non_utf8_line_names_file_and_line(no_model, capsys, tmp_path, data):
    _, bad_utf8, _ = data
    line = one_error_line(capsys, train(tmp_path, "task.name=math_data", f"task.options.train={bad_utf8}"))
    assert line == f"oblr: error: {bad_utf8}:2: not valid UTF-8 (byte 0xe9 at column 18)", line


def test_on_error_skip_skips_counts_and_the_run_goes_on_to_the_model(no_model, capsys, tmp_path, data):
    good, bad_utf8, obj = data
    with pytest.warns(RuntimeWarning, match=rf"{bad_utf8}: skipped 1 malformed row\(s\); first: {bad_utf8}:2: "
                                            r"not valid UTF-8"):
        with pytest.raises(ModelReached):  # past the data: on to the model
            main(train(tmp_path, "task.name=math_data", f"task.options.train={bad_utf8}", f"task.options.eval={good}",
                       "task.options.on_error=skip", "rollout.prompts_per_step=3"))
    from oblr.tasks import get_task

    with pytest.warns(RuntimeWarning, match=r"skipped 1 malformed row"):
        task = get_task("math_data", train=str(obj), on_error="skip")
    assert [e.answer for e in task.train] == ["2", "6"]


def test_a_json_object_as_an_answer_is_refused_with_file_and_line(no_model, capsys, tmp_path, data):
    _, _, obj = data
    line = one_error_line(capsys, train(tmp_path, "task.name=math_data", f"task.options.train={obj}"))
    assert line == (f"oblr: error: {obj}:2: answer is a JSON object ({{'value': 4}}), expected a string or a "
                    f"number"), line
    for value, kind in (([1, [2]], "a JSON array"), (None, "null"), (True, "a boolean")):
        p = write_rows(tmp_path / "x.jsonl", [{"question": "q", "answer": value}])
        with pytest.raises(ValueError, match=rf"x\.jsonl:1: .*{kind}"):
            load_file(p)


def test_grading_timeout_zero_is_refused_not_all_zero_rewards(no_model, capsys, tmp_path, data):
    good, _, _ = data
    line = one_error_line(capsys, train(tmp_path, "task.name=math_data", f"task.options.train={good}",
                                        "task.options.timeout=0", "rollout.prompts_per_step=2"))
    assert "config key 'task.options.timeout': must be in (0, 3600], got 0.0" in line, line


def test_every_override_is_validated_and_reported_even_after_options(no_model, capsys, tmp_path):
    """Overrides on both sides of an option all reach the config; the problems of all of them are reported."""
    line = one_error_line(capsys, ["train", "optim.lr=1e-3", "--quiet", "optim.snr_ema=2", "--output-dir",
                                   str(tmp_path / "run"), "train.steps=0", "task.options.foo=1"])
    for needle in ("config key 'optim.snr_ema': must be in [0, 1), got 2", "config key 'train.steps'",
                   "unknown option task.options.foo"):
        assert needle in line, line
    cfg = load_config(None, ["optim.lr=1e-3", "optim.lr=2e-3"])
    assert cfg.optim.lr == 2e-3  # a later override of the same key wins, as before


# --------------------------------------------------------------------------------------------- issue 24
def test_a_hub_name_without_network_is_one_line_saying_how_to_run_offline(tmp_path):
    """The hub at a closed localhost port (nothing can be downloaded, and the test cannot hang on a network):
    one line naming HF_HUB_OFFLINE, not a minute of retries; the model cache stays empty."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    cache = tmp_path / "cache"
    cache.mkdir()
    hub_env = {k: v for k, v in env().items() if k != "HF_HUB_OFFLINE"}
    hub_env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"), OBLR_CACHE_DIR=str(cache))
    r = subprocess.run([sys.executable, "-m", "oblr", *train(tmp_path, "model.name_or_path=org/doesnotexist")],
                       capture_output=True, text=True, env=hub_env, timeout=DEADLINE)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, (r.returncode, r.stderr[-3000:])
    assert r.stderr.startswith("oblr: error: model 'org/doesnotexist' is not a local directory")
    assert "nothing can be downloaded" in r.stderr and "HF_HUB_OFFLINE=1" in r.stderr
    assert list(cache.iterdir()) == []


def test_a_hub_name_whose_hub_is_unreachable_loads_the_cached_copy(tmp_path, monkeypatch):
    """Unreachable hub, model in the local Hugging Face cache: the cached snapshot, without HF_HUB_OFFLINE."""
    import huggingface_hub

    from oblr.models import resolve_model_path

    snapshot = tmp_path / "snap"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda name, local_files_only: str(snapshot) if local_files_only else pytest.fail("download"))
    assert resolve_model_path("org/cached") == snapshot


def test_sgd_with_the_auto_schedule_warns_before_the_model(no_model, capsys, tmp_path):
    with pytest.raises(ModelReached):
        main(train(tmp_path, "algorithm.lr_schedule=auto", "optim.optimizer=sgd", "optim.lr=0.1"))
    err = capsys.readouterr().err
    assert err.count("algorithm.lr_schedule=auto with optim.optimizer=sgd: measured to fail there") == 1
    assert "docs/algorithm.md" in err
    with pytest.raises(ModelReached):
        main(train(tmp_path / "adamw", "algorithm.lr_schedule=auto"))
    assert "lr_schedule=auto" not in capsys.readouterr().err
