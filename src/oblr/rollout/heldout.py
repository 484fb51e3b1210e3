"""The held-out evaluation of a policy: sampled and greedy answers to held-out problems, scored row by row.

:func:`heldout_eval` is the one function that measures a policy's accuracy on held-out problems: ``oblr
train`` calls it on each rank's share (:func:`oblr.train.evaluation.evaluate_on_ranks`), the TRL integration's
:func:`oblr.integrations.trl.tasks.heldout_accuracy` in one process, and the built-in models' start accuracy
(:func:`oblr.models.builtin.measure_accuracy`) through it. Sampling uses the given temperature and top-p
with a fixed seed (a private generator: the training RNG is untouched), so two evaluations of the same
weights give the same numbers; greedy answers need no seed. Benchmark evaluation of a finished model
(pass@k, maj@k, the math graders) is ``oblr eval``, :mod:`oblr.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class HeldOut:
    """Per-row results, prompt-major (``samples`` rows per problem); greedy ones (one per problem) or None."""

    examples: list
    responses: list[str]
    scores: list[float]
    lengths: list[int]
    greedy_responses: list[str] | None = None
    greedy_scores: list[float] | None = None

    def accuracy_sampled(self) -> float | None:
        """Mean score of the sampled answers; None when none were drawn (``samples = 0``)."""
        return sum(self.scores) / len(self.scores) if self.scores else None

    def accuracy_greedy(self) -> float | None:
        return None if self.greedy_scores is None else sum(self.greedy_scores) / len(self.greedy_scores)


def heldout_eval(engine, examples: list, score, *, samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int, greedy: bool = True) -> HeldOut:
    """``samples`` sampled answers per example (``seed``: a private generator; 0: none) and, with ``greedy``,
    one greedy answer, each scored by ``score(responses, rows)`` (e.g. :func:`oblr.tasks.base.reward_scorer`)."""
    from oblr.rollout.base import generate_and_score

    if int(samples) != samples or samples < 0:
        raise ValueError(f"heldout_eval: samples must be a non-negative integer, got {samples}")
    out = HeldOut([], [], [], [], [] if greedy else None, [] if greedy else None)
    if not examples:  # e.g. a rank's share when there are fewer problems than ranks
        return out
    out.examples = list(examples)
    if samples:
        sampled, scores = generate_and_score(engine, examples, score, num_samples=samples,
                                             max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                             seed=seed)
        out.responses, out.scores = list(sampled.responses), _floats(scores)
        out.lengths = [int(n) for n in sampled.response_lengths.view(-1).tolist()]
    if greedy:
        g, g_scores = generate_and_score(engine, examples, score, num_samples=1, max_new_tokens=max_new_tokens,
                                         greedy=True)
        out.greedy_responses, out.greedy_scores = list(g.responses), _floats(g_scores)
    return out


def _floats(scores) -> list[float]:
    return [float(s) for s in (scores.view(-1).tolist() if hasattr(scores, "view") else scores)]
