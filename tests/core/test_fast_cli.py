"""`oblr --help`, `oblr train --help`, `oblr tasks` and config refusals answer without importing torch.

Each command runs in a fresh interpreter (a test process has torch imported already); the check is what
``sys.modules`` holds when the command has answered, not how long it took (benchmarks/cli_startup.py
measures that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "numpy", "transformers")
SRC = str(Path(__file__).resolve().parents[2] / "src")

# main(argv) in a fresh interpreter where importing a heavy module fails at once (a regression is then an
# error here, not a training run); prints the exit status, the output and the heavy modules imported
RUNNER = """
import contextlib, io, json, sys
HEAVY = HEAVY_NAMES

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ImportError(f"{name} imported by a command that must answer without it")

sys.meta_path.insert(0, Block())
from oblr.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        rc = main(json.loads(sys.argv[1]))
    except SystemExit as e:  # argparse's --help
        rc = e.code
    except ImportError as e:
        rc, _ = "ImportError", print(e, file=sys.stderr)
print(json.dumps({"rc": rc, "out": out.getvalue(), "err": err.getvalue(),
                  "heavy": [m for m in HEAVY if m in sys.modules]}))
""".replace("HEAVY_NAMES", repr(HEAVY))


def run_cli(argv: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(argv)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv, expect", [
    (["--help"], "COMMAND"),
    (["train", "--help"], "algorithm.norms_method"),
    (["eval", "--help"], "--model"),
    (["compare", "--help"], "usage"),
    (["models", "--help"], "prepare"),
    (["tasks"], "algorithm.baseline"),
])
def test_help_and_tasks_answer_without_torch(argv, expect):
    res = run_cli(argv)
    assert res["rc"] == 0, res["err"]
    assert expect in res["out"]
    assert res["heavy"] == [], f"oblr {' '.join(argv)} imported {res['heavy']}"


def test_train_help_lists_every_registry_without_torch():
    res = run_cli(["train", "--help"])
    # names that live in the registries of modules whose code needs torch (they register without it)
    for name in ("oblr_self", "cosine", "seq_sum_const", "materialize", "adamw", "fsdp", "vllm"):
        assert name in res["out"], name
    assert res["heavy"] == []


@pytest.mark.parametrize("overrides, message", [
    (["optim.lr=inf"], "config key 'optim.lr': must be in (0, 1e6], got inf"),
    (["algorithm.baseline=nope"], "unknown estimator 'nope'"),
    (["algorithm.lr_schedule=auto", "algorithm.schedule_options={bogus: 1}"],
     "unknown option algorithm.schedule_options.bogus"),
    (["algorithm.lr_schedule=auto", "algorithm.schedule_options={max_change: 0}"],
     "algorithm.schedule_options.max_change"),
    (["algorithm.baseline=grpo", "algorithm.baseline_options={scale_sd: 1}"], "did you mean 'scale_std'"),
    (["algorithm.baseline=grpo", "algorithm.baseline_options={scale_std: 3}"],
     "algorithm.baseline_options.scale_std': expected bool"),
    (["rollout.engine_options={batch_size: 3}"], "set rollout.batch_size instead"),
    (["distributed.strategy=ddp", "distributed.options={bucket_mb: 0}"], "distributed.options.bucket_mb"),
    (["optim.optimizer=lion"], "unknown optimizer 'lion'"),
    (["algorithm.norms_method=fast"], "unknown gradient-norm method 'fast'"),
    (["algorithm.aggregation=sum"], "unknown loss aggregation 'sum'"),
    (["algorithm.memory_plan=two-pass"], "unknown memory plan 'two-pass'; registered: auto, none, one_pass, recompute, two_pass"),
    (["algorithm.checkpointed_engine=keep"], "unknown checkpointed exact-norm engine 'keep'; registered: recompute, "
     "two_pass"),
    (["algorithm.checkpointed_engine=recompute"], "config key 'algorithm.checkpointed_engine': 'recompute' is the "
     "engine used with activation checkpointing, but model.activation_checkpointing is false"),
    (["algorithm.memory_plan=two_pass", "algorithm.memory_budget_gb=80", "algorithm.checkpointed_engine=recompute"],
     "'recompute' contradicts algorithm.memory_plan 'two_pass'"),
    (["algorithm.memory_plan=auto", "algorithm.memory_budget_gb=80", "algorithm.checkpointed_engine=recompute"],
     "'recompute' contradicts algorithm.memory_plan 'auto', which sets the engine itself; leave this key at "
     "two_pass (or set memory_plan=recompute to use that engine)"),
    (["model.activation_checkpointing=true", "algorithm.checkpointed_engine=recompute", "algorithm.norms_method=loop"],
     "config key 'algorithm.checkpointed_engine': 'recompute' is not used with algorithm.norms_method=loop"),
    (["algorithm.memory_plan=recompute", "algorithm.memory_budget_gb=80", "algorithm.norms_method=ghost"],
     "'recompute' is priced for algorithm.norms_method=auto"),
    (["algorithm.memory_plan=recompute", "algorithm.baseline=grpo", "algorithm.lr_schedule=constant"],
     "'recompute' chooses an exact-norm engine, but baseline 'grpo'"),
    (["algorithm.memory_plan=auto", "algorithm.memory_budget_gb=0"],
     "config key 'algorithm.memory_budget_gb': must be in (0, 1e6], got 0"),
    (["algorithm.memory_plan=auto", "algorithm.memory_budget_gb=-8"], "'algorithm.memory_budget_gb': must be in (0"),
    (["algorithm.memory_budget_gb=80"], "a budget (80 GB) is set but algorithm.memory_plan is 'none'"),
    (["algorithm.memory_plan=two_pass", "algorithm.baseline=grpo", "algorithm.lr_schedule=constant"],
     "'two_pass' chooses an exact-norm engine, but baseline 'grpo' with lr_schedule 'constant' computes no exact"),
    (["algorithm.memory_plan=one_pass", "model.activation_checkpointing=true"],
     "'one_pass' keeps every layer's activations, but model.activation_checkpointing is true"),
    (["model.logit_chunk_tokens=-1"], "config key 'model.logit_chunk_tokens': must be"),
    (["model.logit_chunk_tokens=512"], "with exact norms chunked logits need a checkpointed engine: set "
     "model.activation_checkpointing=true"),
    (["model.logit_chunk_tokens=512", "algorithm.memory_plan=one_pass", "algorithm.memory_budget_gb=80"],
     "chunked logits need a checkpointed engine (the one-pass engine keeps every chunk's logit gradients"),
    (["model.logit_chunk_tokens=512", "algorithm.baseline=otb_proxy"], "weighs outputs by their whole logits"),
    (["model.logit_chunk_tokens=512", "model.activation_checkpointing=true", "algorithm.norms_method=loop"],
     "the loop reference (algorithm.norms_method=loop) runs on the one-pass engine"),
])
def test_config_refusals_answer_without_torch(overrides, message):
    res = run_cli(["train", *overrides])
    assert res["rc"] == 2
    assert res["err"].startswith("oblr: error: ") and message in res["err"], res["err"]
    assert res["heavy"] == [], f"oblr train {' '.join(overrides)} imported {res['heavy']}"


def test_the_check_sees_a_command_that_imports_torch():
    """The blocked import makes a command that needs torch fail here (``--nproc`` checks the launch with
    torch.distributed), so the checks above can fail."""
    res = run_cli(["train", "--nproc", "1", "train.steps=1"])
    assert res["rc"] == "ImportError" and "imported by a command that must answer without it" in res["err"]


@pytest.mark.parametrize("package", ["oblr.train", "oblr.distributed", "oblr.gradnorm"])
def test_lazy_packages_export_every_name(package):
    """The lazily exported names of a package (oblr._lazy) all resolve, and dir() lists them."""
    import importlib

    mod = importlib.import_module(package)
    for name in mod.__all__:
        assert getattr(mod, name) is not None, name
        assert name in dir(mod)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018
