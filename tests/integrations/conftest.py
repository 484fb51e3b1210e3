"""Fixtures of the TRL integration tests: a test model of the built-in shape, and the one 2-process launch that
test_trl_distributed.py and test_trl_example.py both read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def trl_model(tmp_path_factory) -> Path:
    """The built-in model's architecture and tokenizer at its random init (``sft_steps=0``): these tests compare
    exact numbers and check that runs finish and log, none needs a model that can do arithmetic, and the
    warm start of ``small_builtin`` costs ten times more."""
    from oblr.models.builtin import build_builtin_model

    return build_builtin_model(tmp_path_factory.mktemp("trl_model") / "model", sft_steps=0, n_train=64,
                               n_measure=4, progress=None)


@dataclass
class TwoProcessRun:
    returncode: int
    out: Path
    log: Path

    def output(self) -> str:
        from .trl_helpers import log_tail

        return f"accelerate launch exited with {self.returncode}; its output ({self.log}):\n{log_tail(self.log)}"


@pytest.fixture(scope="session")
def two_process_run(trl_model, tmp_path_factory) -> TwoProcessRun:
    """``trl_two_process.py`` under ``accelerate launch`` with 2 CPU processes (gloo): the exactness run, then the
    example. Returns the exit status, the output folder and the log; each test asserts what it reads."""
    pytest.importorskip("trl")
    from .trl_helpers import accelerate_launch_two_cpu_processes

    out = tmp_path_factory.mktemp("two_processes")
    log = out / "launch.log"
    rc = accelerate_launch_two_cpu_processes(HERE / "trl_two_process.py", [str(trl_model), str(out)], log)
    return TwoProcessRun(rc, out, log)
