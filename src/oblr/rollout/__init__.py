"""Rollout engines: the seam between oblr and whatever generates the samples.

The contract every engine keeps (the trainer, evaluation, the proxy study and the built-in model's
measurement use nothing else; a vLLM engine and a TRL adapter plug in here):

- :class:`RolloutBatch` -- what ``generate`` returns. Layout ``[pad pad prompt | response pad]``: prompts
  left-padded to a common length ``P``, responses right-padded to the longest response ``L`` of the call,
  ``T = P + L``. Rows are prompt-major: row ``k * num_samples + j`` is sample ``j`` of prompt ``k``.
  ``attention_mask`` is 1 on prompt and response tokens (EOS included), ``response_mask`` on response
  tokens (EOS included). ``sampler_logprobs`` [B, T] float32 is the log-probability of each sampled
  response token under the distribution that sampled it (after temperature and top-p renormalisation),
  0 outside the response, or None when the engine does not know it (greedy decoding).
- :class:`RolloutEngine` -- ``generate(prompts, *, num_samples, max_new_tokens, temperature=1.0,
  top_p=1.0, greedy=False, seed=None, progress=None) -> RolloutBatch``. ``seed=None`` samples from torch's
  global RNG (training: reproducible through the checkpointed RNG state); an int uses a private generator
  seeded with it and leaves the global RNG untouched (evaluation). ``progress(rows_done, rows_total)`` is
  called as rows finish. ``sync_weights(model)`` is called by the trainer after the optimizer step(s) of
  every training step, before the next rollouts (the HF engine samples with the live policy module, so it is a no-op there; an engine holding its own
  copy of the weights pushes them). ``close()`` frees the engine's resources.
- :data:`ENGINES` -- the registry of engine factories ``f(model, tokenizer, **options) -> RolloutEngine``
  (``@register_engine("name")``; the factory's keyword parameters after ``model, tokenizer`` are its
  options, checked by name, type and ``Annotated[..., Range(...)]`` before a model loads);
  :func:`make_engine` builds one by name (config key ``rollout.engine``, options from
  ``rollout.engine_options``); :func:`check_engine` says before a model loads whether it can run. Registered here: ``hf`` (:mod:`oblr.rollout.hf`, our KV-cache
  decoding loop over a Hugging Face causal LM) and ``vllm`` (:mod:`oblr.rollout.vllm`, vLLM's offline
  ``LLM`` colocated in this process; needs the ``vllm`` package, see ``make setup-vllm``).
  Code outside this package never imports an engine module.
- :func:`generate_and_score` -- generate for a list of examples and score every row: the one
  "generate, then score" helper of oblr; :func:`oblr.rollout.heldout.heldout_eval` on it is the one
  held-out evaluation (sampled and greedy accuracy on held-out problems).
"""

from __future__ import annotations

from oblr.rollout.base import (
    ENGINES,
    RolloutBatch,
    RolloutEngine,
    check_engine,
    generate_and_score,
    make_engine,
    register_engine,
)


def generate(model, tokenizer, prompts: list[str], **kwargs) -> RolloutBatch:
    """Sample with the ``hf`` engine directly (``batch_size`` and ``generator_seed`` accepted as in
    :func:`oblr.rollout.hf.generate`); the library shortcut for a model in this process."""
    from oblr.rollout.hf import generate as hf_generate

    return hf_generate(model, tokenizer, prompts, **kwargs)


__all__ = ["ENGINES", "RolloutBatch", "RolloutEngine", "check_engine", "generate", "generate_and_score", "make_engine",
           "register_engine"]
