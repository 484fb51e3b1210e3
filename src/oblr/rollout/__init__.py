"""Rollout engines behind one interface: ``generate(model, tokenizer, prompts, ...) -> RolloutBatch``.

:mod:`oblr.rollout.hf` samples with a Hugging Face causal LM (KV cache, temperature, top-p, stop at EOS).
"""

from oblr.rollout.hf import RolloutBatch, generate, sample_next_token

__all__ = ["RolloutBatch", "generate", "sample_next_token"]
