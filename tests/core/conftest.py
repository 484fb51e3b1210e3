"""Fixtures of tests/core shared by more than one module: a LoRA run folder (``oblr eval`` and ``oblr export``
read it)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def lora_run(tmp_path_factory):
    """A 2-step LoRA run of the built-in task from the shipped model (which gets rewards to learn from, so the
    adapters move: a constant lr of 1e-2) and its summary; its checkpoints hold adapters only."""
    from oblr.cli import main

    run = tmp_path_factory.mktemp("lora") / "run"
    assert main(["train", "model.lora_rank=4", "train.steps=2", "algorithm.lr_schedule=constant", "optim.lr=1e-2",
                 "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=24",
                 "task.eval_size=8", "train.eval_samples=2", "train.threads=1",
                 "task.options={n_train: 200, n_eval: 20}", "--output-dir", str(run), "--quiet"]) == 0
    ckpt = run / "checkpoints" / "step_000002"
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "config.json").is_file()
    return run, json.loads((run / "summary.json").read_text())
