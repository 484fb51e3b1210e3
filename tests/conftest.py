"""Shared fixtures: tiny random Hugging Face models (Qwen3 with tied embeddings, Llama untied), the built-in
model, one torch thread, a LoRA run folder (``oblr eval`` and ``oblr export`` read it)."""

from __future__ import annotations

import json
import os

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


def tiny_qwen3(vocab_size: int = 61, hidden: int = 32, layers: int = 2, tied: bool = True, seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=128,
        tie_word_embeddings=tied, attn_implementation="eager",
    )
    model = Qwen3ForCausalLM(cfg).float()
    # random init of norms too, so that norm-weight gradients are not degenerate
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def tiny_llama(vocab_size: int = 53, hidden: int = 32, layers: int = 2, seed: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
        attention_bias=True, mlp_bias=True, attn_implementation="eager",
    )
    model = LlamaForCausalLM(cfg).float()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture
def qwen3_model():
    return tiny_qwen3()


@pytest.fixture
def llama_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def small_builtin(tmp_path_factory):
    """The built-in model's architecture and tokenizer with a very short warm start (test-sized, seconds)."""
    from oblr.models.builtin import build_builtin_model

    return build_builtin_model(tmp_path_factory.mktemp("builtin") / "model", sft_steps=40, n_measure=8,
                               progress=None)


@pytest.fixture
def one_thread():
    """One torch thread for the test, as the benchmarks run (steadier on a loaded machine); restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
