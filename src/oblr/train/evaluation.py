"""Held-out evaluation of the policy being trained: sampled and greedy answers, scored by the task's reward.

:func:`heldout_eval` is the one function every trainer uses for it: ``oblr train`` calls it on each rank's
share of the held-out problems and gathers the rows (:func:`evaluate_on_ranks`); the TRL integration's
:func:`oblr.integrations.trl.tasks.heldout_accuracy` calls it in one process. Sampling uses the run's
temperature and top-p with a fixed seed (a private generator: the training RNG is untouched), so two
evaluations of the same weights give the same numbers. Benchmark evaluation of a finished model (pass@k,
maj@k, the math graders) is ``oblr eval``, :mod:`oblr.evaluate`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class HeldOut:
    """Per-row results, prompt-major (``samples`` rows per problem); greedy ones (one per problem) or None."""

    examples: list
    responses: list[str]
    scores: list[float]
    lengths: list[int]
    greedy_responses: list[str] | None = None
    greedy_scores: list[float] | None = None

    def accuracy_sampled(self) -> float:
        return sum(self.scores) / len(self.scores)

    def accuracy_greedy(self) -> float | None:
        return None if self.greedy_scores is None else sum(self.greedy_scores) / len(self.greedy_scores)


def heldout_eval(engine, examples: list, score, *, samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int, greedy: bool = True) -> HeldOut:
    """``samples`` sampled answers per example (``seed``: a private generator) and, with ``greedy``, one greedy
    answer, each scored by ``score(responses, rows)`` (e.g. :func:`oblr.tasks.base.reward_scorer`)."""
    from oblr.rollout import generate_and_score

    if not examples:  # e.g. a rank's share when there are fewer problems than ranks
        return HeldOut([], [], [], [], [] if greedy else None, [] if greedy else None)
    sampled, scores = generate_and_score(engine, examples, score, num_samples=samples, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_p=top_p, seed=seed)
    out = HeldOut(examples=list(examples), responses=list(sampled.responses), scores=_floats(scores),
                  lengths=[int(n) for n in sampled.response_lengths.view(-1).tolist()])
    if greedy:
        g, g_scores = generate_and_score(engine, examples, score, num_samples=1, max_new_tokens=max_new_tokens,
                                         greedy=True)
        out.greedy_responses, out.greedy_scores = list(g.responses), _floats(g_scores)
    return out


def _floats(scores) -> list[float]:
    return [float(s) for s in (scores.view(-1).tolist() if hasattr(scores, "view") else scores)]


def sample_rows(h: HeldOut) -> list[dict]:
    """What ``samples/eval_step_N.jsonl`` holds: the greedy answer and its reward per problem when there is
    one, else every sampled answer."""
    if h.greedy_scores is not None:
        return [{"prompt": ex.prompt, "answer": ex.answer, "greedy": r, "reward": s}
                for ex, r, s in zip(h.examples, h.greedy_responses, h.greedy_scores)]
    k = len(h.responses) // len(h.examples)
    return [{"prompt": ex.prompt, "answer": ex.answer, "response": r}
            for ex, r in zip([ex for ex in h.examples for _ in range(k)], h.responses)]


def write_samples(run_dir: Path, step: int, rows: list[dict]) -> None:
    samples = Path(run_dir) / "samples"
    samples.mkdir(exist_ok=True)
    with open(samples / f"eval_step_{step:06d}.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def evaluate_on_ranks(engine, parallel, model, examples: list, score, cfg, dist, run_dir, step: int) -> dict:
    """``oblr train``'s held-out metrics after ``step``: each rank evaluates its share of ``examples`` (sampled
    at the rollout temperature with a fixed per-rank seed, and greedy), the rows are gathered, rank 0 writes
    ``samples/``. The training RNG is left as it was."""
    from oblr.distributed import all_gather_objects, rank_seed, split_evenly
    from oblr.train.checkpoint import rng_state, set_rng_state

    t0 = time.perf_counter()
    rng = rng_state()
    model.eval()
    exs = examples[split_evenly(len(examples), dist.world_size, dist.rank)]  # this rank's share
    with parallel.generation(model):  # ranks' shares differ in size: no collective inside
        h = heldout_eval(engine, exs, score, samples=cfg.train.eval_samples, max_new_tokens=cfg.rollout.max_new_tokens,
                         temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                         seed=rank_seed(cfg.train.seed + 12345, dist.rank), greedy=cfg.train.eval_greedy)
    gathered = all_gather_objects(list(zip(h.scores, h.lengths)))
    out = {"eval/accuracy_sampled": sum(s for s, _ in gathered) / len(gathered),
           "eval/response_length_mean": sum(n for _, n in gathered) / len(gathered)}
    rows = all_gather_objects(sample_rows(h))
    if cfg.train.eval_greedy:
        out["eval/accuracy_greedy"] = sum(r["reward"] for r in rows) / len(rows)
    set_rng_state(rng)
    if dist.is_main:
        write_samples(run_dir, step, rows)
    out["time/eval"] = time.perf_counter() - t0
    return out
