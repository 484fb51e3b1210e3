"""The rollout contract's code: :class:`RolloutBatch`, the :class:`RolloutEngine` protocol, the registry
:data:`ENGINES` (:func:`register_engine`, :func:`make_engine`, :func:`check_engine`) and
:func:`generate_and_score`. The package docstring (:mod:`oblr.rollout`) states the contract; the engine
modules (:mod:`oblr.rollout.hf`, :mod:`oblr.rollout.vllm`) register here, and :mod:`oblr.rollout` exports
these names together with the ``hf`` shortcut :func:`oblr.rollout.generate`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from oblr.registry import Registry

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch


@dataclass
class RolloutBatch:
    """Generated sequences of one ``generate`` call. ``B = len(prompts) * num_samples``."""

    input_ids: torch.LongTensor  # [B, T] prompt left-padded + response right-padded
    attention_mask: torch.LongTensor  # [B, T] 1 on prompt and response tokens (EOS included)
    response_mask: torch.LongTensor  # [B, T] 1 on response tokens (EOS included), 0 after EOS
    group_ids: torch.LongTensor  # [B] index of the prompt; row k*n + j
    responses: list[str]  # decoded response text (no special tokens)
    response_lengths: torch.LongTensor  # [B] response tokens, EOS included
    finished: torch.BoolTensor  # [B] True if the response ended with EOS
    prompt_length: int = 0  # P: responses start at column P; T - P = longest response of the call
    sampler_logprobs: torch.Tensor | None = None  # [B, T] float32 log-prob of each sampled token; 0 elsewhere


@runtime_checkable
class RolloutEngine(Protocol):
    """What the trainer and the evaluators need from an engine (see the module docstring)."""

    def generate(self, prompts: list[str], *, num_samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, greedy: bool = False, seed: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> RolloutBatch: ...

    def sync_weights(self, model) -> None: ...

    def close(self) -> None: ...


# a factory's first two parameters (model, tokenizer) are oblr's; the rest are rollout.engine_options
ENGINES = Registry("rollout engine", modules=("oblr.rollout.hf", "oblr.rollout.vllm"), leading=2)


def register_engine(name: str) -> Callable:
    """Decorator: register an engine factory ``f(model, tokenizer, **options) -> RolloutEngine``."""
    return ENGINES.register(name)


def make_engine(name: str, model, tokenizer, **options) -> RolloutEngine:
    """The engine registered as ``name``, built for ``model`` and ``tokenizer`` with ``options`` (their names,
    types and ranges checked against the factory's signature first: :func:`oblr.config.check_options`)."""
    from oblr.checks import check_options

    factory = ENGINES.get(name)
    return factory(model, tokenizer, **check_options(ENGINES, name, options, "rollout.engine_options"))


def check_engine(name: str) -> None:
    """Raise ``ValueError`` (one line) when engine ``name`` is unknown or cannot run here -- cheaply, before a
    model loads. A factory may carry ``unavailable() -> str | None`` saying why it cannot run (a missing
    package)."""
    why = getattr(ENGINES.get(name), "unavailable", lambda: None)()
    if why:
        raise ValueError(why)


def generate_and_score(engine: RolloutEngine, examples: Sequence[Any], score: Callable[[list[str], list], Any], *,
                       num_samples: int, **sampling) -> tuple[RolloutBatch, Any]:
    """Generate ``num_samples`` responses for each example (``example.prompt``) and score every row.

    ``score(responses, rows)`` gets the decoded responses and the examples repeated row by row
    (prompt-major, ``rows[k * num_samples + j] = examples[k]``) and returns one score per row (e.g.
    :func:`oblr.tasks.base.reward_scorer` for task rewards as a float32 tensor [B], or graded results).
    ``sampling`` goes to ``engine.generate`` (``max_new_tokens``, ``temperature``, ``top_p``, ``greedy``,
    ``seed``, ``progress``). Returns ``(batch, scores)``.
    """
    batch = engine.generate([ex.prompt for ex in examples], num_samples=num_samples, **sampling)
    rows = [ex for ex in examples for _ in range(num_samples)]
    if len(batch.responses) != len(rows):
        raise RuntimeError(f"rollout engine returned {len(batch.responses)} responses for "
                           f"{len(examples)} prompts x {num_samples} samples")
    return batch, score(batch.responses, rows)
