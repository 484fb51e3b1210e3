"""Held-out evaluation of the policy being trained in ``oblr train``: each rank's share, gathered, samples written.

The evaluation itself is :func:`oblr.rollout.heldout.heldout_eval` (re-exported here with :class:`HeldOut`),
the one held-out evaluation every trainer and the built-in models' measurement use: ``oblr train`` calls it on
each rank's share of the held-out problems and gathers the rows (:func:`evaluate_on_ranks`), with the run's
temperature and top-p and a fixed per-rank seed. Benchmark evaluation of a finished model (pass@k, maj@k, the
math graders) is ``oblr eval``, :mod:`oblr.evaluate`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from oblr.rollout.heldout import HeldOut, heldout_eval

__all__ = ["HeldOut", "evaluate_on_ranks", "heldout_eval", "sample_rows", "write_samples"]


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
