"""Benchmark evaluation: ``evaluate(model, tokenizer, ["gsm8k", "math500"], n=4, ...)`` and ``oblr eval``.

For each benchmark (a registered math task, :mod:`oblr.tasks.math`) every problem gets ``n`` samples from a
rollout engine (:func:`oblr.rollout.generate_and_score`; the ``hf`` engine unless another is given; greedy
when ``temperature == 0``), graded by :mod:`oblr.grading`.
With ``c_i`` correct samples out of ``n`` for problem ``i`` of ``N``:

- ``pass@1 = avg@n = (1/N) sum_i c_i / n`` (mean accuracy over the n samples; the unbiased pass@1 estimate)
- ``pass@n = (1/N) sum_i [c_i > 0]``
- ``maj@n``: share of problems whose majority answer is correct. Votes are the extracted final answers
  (GSM8K: the number; math: the last ``\\boxed{}`` with spaces removed); samples without an answer do not
  vote; a tie goes to the answer seen first. Equivalent forms written differently ("0.5", "\\frac12") are
  separate votes.

Any other registered task (``oblr tasks``, e.g. the built-in ``arithmetic``) can be evaluated too: its
held-out split, a sample being correct when the task's reward is 1; ``maj@n`` is reported only for a task
that can extract a final answer (``task.extract_answer(response)``, as ``arithmetic`` does).

``oblr eval --model`` takes a model folder (``config.json``), ``builtin``, a hub id, or a run folder of ``oblr
train`` (``config.yaml`` + ``checkpoints/step_N``): its newest intact checkpoint is evaluated and, unless
``--benchmarks`` is given, on the task the run trained on (with the run's task options, its ``eval_size``
first held-out problems and its ``rollout.max_new_tokens``, unless ``--limit`` / ``--max-new-tokens`` say
otherwise), so that the greedy ``pass@1`` is the run's greedy held-out accuracy (:func:`resolve_model_arg`).

Every graded sample is written to ``<output_dir>/<benchmark>.jsonl`` and the metrics to
``<output_dir>/results.json``; a table is printed at the end and a progress line while generating.
This module is the metrics and the benchmark runs; the command (flags, ``--model``) is ``oblr.evaluate_cli``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from oblr.checks import COUNT, Range
from oblr.grading import DEFAULT_TIMEOUT, grade_many
from oblr.tasks import TASKS, get_task
from oblr.tasks.base import task_accepts
from oblr.tasks.math import EVAL_BENCHMARKS, MathTask
from oblr.tasks.templates import TEMPLATES

_SPACE = re.compile(r"\s+")


def vote_key(pred: str | None) -> str | None:
    """The majority-vote key of an extracted answer (whitespace removed); None: no vote."""
    if pred is None:
        return None
    key = _SPACE.sub("", pred)
    return key or None


def majority_correct(keys: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Is the most frequent answer (first seen wins a tie) correct? False when no sample has an answer."""
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return False
    top = max(counts.values())
    for k, ok in zip(keys, correct):
        if k is not None and counts[k] == top:
            return bool(ok)
    raise AssertionError("unreachable")


def score(correct: Sequence[Sequence[bool]], keys: Sequence[Sequence[str | None]]) -> dict[str, float]:
    """``pass@1``, ``avg@n``, ``maj@n``, ``pass@n`` from per-problem lists of sample correctness / vote keys."""
    if not correct:
        raise ValueError("score: no problems")
    n = len(correct[0])
    if n == 0 or any(len(c) != n for c in correct) or [len(k) for k in keys] != [n] * len(correct):
        raise ValueError("score: every problem needs the same number (>= 1) of samples and keys")
    num = len(correct)
    acc = sum(sum(map(bool, c)) / n for c in correct) / num
    out = {"pass@1": acc}
    if n > 1:
        out[f"avg@{n}"] = acc
        out[f"maj@{n}"] = sum(majority_correct(k, c) for k, c in zip(keys, correct)) / num
        out[f"pass@{n}"] = sum(any(c) for c in correct) / num
    return out


def _grader(kind: str, timeout: float):
    """``score(responses, rows)`` for :func:`oblr.rollout.generate_and_score`: graded results, one per row."""
    def grade(responses, rows):
        return grade_many(responses, [e.answer for e in rows], kind=kind, units=[e.meta.get("unit") for e in rows],
                          timeout=timeout)

    return grade


# the numeric arguments of evaluate() and `oblr eval` (--n, --temperature, ...): the config's Range rules
# (NaN and inf never pass), checked before a model loads
ARG_RANGES = {"n": COUNT, "temperature": Range(ge=0, le=100), "top_p": Range(gt=0, le=1), "max_new_tokens": COUNT,
              "limit": COUNT, "batch_size": COUNT, "seed": Range(ge=0, le=2**32 - 1), "timeout": Range(gt=0, le=3600)}


def _check(n: int, temperature: float, top_p: float, max_new_tokens: int, limit, batch_size: int, template: str,
           seed: int = 0, timeout: float = DEFAULT_TIMEOUT):
    values = dict(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, limit=limit,
                  batch_size=batch_size, seed=seed, timeout=timeout)
    for name, value in values.items():
        problem = None if value is None and name == "limit" else ARG_RANGES[name].problem(value)
        if problem:
            raise ValueError(f"evaluate: {name} {problem}")
    if 0 < temperature < 1e-3:
        raise ValueError(f"evaluate: temperature {temperature} is greedy in all but name; use 0 for greedy or "
                         f"at least 0.001")
    if temperature == 0 and n > 1:
        raise ValueError("evaluate: n > 1 with temperature 0 gives n identical greedy samples; set --temperature")
    if template not in TEMPLATES:
        raise ValueError(f"evaluate: unknown template {template!r}; known: {', '.join(TEMPLATES)}")


def _parse_benchmarks(benchmarks: str | Sequence[str]) -> list[str]:
    names = [b.strip() for b in benchmarks.split(",")] if isinstance(benchmarks, str) else list(benchmarks)
    names = [b for b in names if b]
    if not names:
        raise ValueError("evaluate: no benchmarks given")
    bad = [b for b in names if b not in EVAL_BENCHMARKS and b not in TASKS]
    if bad:
        others = [t for t in TASKS.names() if t not in EVAL_BENCHMARKS]
        raise ValueError(f"evaluate: unknown benchmark(s) {', '.join(bad)}; known: {', '.join(EVAL_BENCHMARKS)}"
                         f"{'; other registered tasks: ' + ', '.join(others) if others else ''}")
    return names


def _build_task(name: str, options: dict | None, *, template: str, tokenizer, limit: int | None, timeout: float):
    """The task ``name`` with ``options`` (a run's ``task.options``), plus whichever of ``template``,
    ``tokenizer``, ``limit``, ``timeout`` (and ``train_limit=0``) its factory accepts and the options do not set."""
    opts = dict(options or {})
    extra = {"template": template, "tokenizer": tokenizer, "limit": limit, "train_limit": 0, "timeout": timeout}
    for key, value in extra.items():
        if key not in opts and task_accepts(name, key):
            opts[key] = value
    return get_task(name, **opts)


def _task_grader(task):
    """``score(responses, rows)`` for a task without the math grader: its reward per row (a sample is correct
    when the reward is 1), the final answer from ``task.extract_answer`` where the task has one."""
    from oblr.tasks.base import safe_reward

    extract = getattr(task, "extract_answer", None)

    def grade(responses, rows):
        out = []
        for response, row in zip(responses, rows):
            reward = safe_reward(task, response, row)
            pred = extract(response) if extract is not None else None
            out.append(SimpleNamespace(correct=reward == 1.0, pred=pred, reward=reward,
                                       status="ok" if pred is not None or extract is None else "no_answer"))
        return out

    return grade


def evaluate_benchmark(model, tokenizer, name: str, *, n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                       max_new_tokens: int = 1024, limit: int | None = None, batch_size: int = 32,
                       template: str = "auto", seed: int = 0, timeout: float = DEFAULT_TIMEOUT,
                       engine=None, show_progress: bool = True, stream: TextIO | None = None,
                       task_options: dict | None = None) -> tuple[dict[str, Any], list[dict]]:
    """One benchmark (or registered task): ``(metrics, samples)``; samples are the graded rows (problem-major,
    n per problem). ``engine``: a :class:`oblr.rollout.RolloutEngine` (default: the ``hf`` engine over
    ``model``); ``task_options``: options of the task's factory (a run's ``task.options``)."""
    from oblr.rollout import generate_and_score, make_engine
    from oblr.tracking.progress import progress

    task = _build_task(name, task_options, template=template, tokenizer=tokenizer, limit=limit, timeout=timeout)
    examples = task.eval if limit is None else task.eval[:limit]
    if not examples:
        raise ValueError(f"evaluate: task {name!r} has no held-out problems to evaluate")
    engine = engine or make_engine("hf", model, tokenizer, batch_size=batch_size)
    is_math = isinstance(task, MathTask)
    per_call = max(1, batch_size // n)  # problems per generate call
    chunks = [examples[i:i + per_call] for i in range(0, len(examples), per_call)]
    if show_progress:
        chunks = progress(chunks, total=len(chunks), desc=f"eval {name} ({len(examples)} problems x {n})",
                          stream=stream)
    t0 = time.perf_counter()
    samples: list[dict] = []
    grade = _grader(task.kind, timeout) if is_math else _task_grader(task)
    for ci, chunk in enumerate(chunks):
        batch, graded = generate_and_score(engine, chunk, grade, num_samples=n, max_new_tokens=max_new_tokens,
                                           temperature=temperature if temperature > 0 else 1.0, top_p=top_p,
                                           greedy=temperature == 0, seed=seed + ci)
        rows = [(e, j) for e in chunk for j in range(n)]  # prompt-major, as generate returns them
        lengths, finished = batch.response_lengths.tolist(), batch.finished.tolist()
        for r, ((e, j), g) in enumerate(zip(rows, graded)):
            samples.append({"benchmark": name, "problem": len(samples) // n, "sample": j,
                            "line": e.meta.get("line"), "question": e.meta.get("question"), "prompt": e.prompt,
                            "reference": e.answer, "response": batch.responses[r], "extracted": g.pred,
                            "correct": g.correct, "status": g.status, "length": int(lengths[r]),
                            "finished": bool(finished[r]), **({} if is_math else {"reward": g.reward})})
    correct = [[s["correct"] for s in samples[i:i + n]] for i in range(0, len(samples), n)]
    keys = [[vote_key(s["extracted"]) for s in samples[i:i + n]] for i in range(0, len(samples), n)]
    metrics: dict[str, Any] = {"problems": len(correct), "n": n, **score(correct, keys)}
    if not is_math:
        metrics["reward_mean"] = sum(s["reward"] for s in samples) / len(samples)
        if getattr(task, "extract_answer", None) is None:  # no final answers to vote on
            metrics.pop(f"maj@{n}", None)
    metrics["response_length_mean"] = sum(s["length"] for s in samples) / len(samples)
    metrics["truncated_share"] = sum(not s["finished"] for s in samples) / len(samples)
    metrics["grading_timeouts"] = sum(s["status"] == "timeout" for s in samples)
    metrics["seconds"] = time.perf_counter() - t0
    return metrics, samples


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """A plain-text table, one row per benchmark; accuracies in percent."""
    cols = ["problems", "n"] + sorted({k for r in results.values() for k in r if "@" in k},
                                       key=lambda k: (k.split("@")[1] != "1", k))
    cols += ["response_length_mean", "truncated_share", "seconds"]
    heads = {"response_length_mean": "len", "truncated_share": "trunc%", "seconds": "time(s)"}
    w = max([9] + [len(b) for b in results]) + 2
    lines = [f"{'benchmark':<{w}}" + "".join(f"{heads.get(c, c):>9}" for c in cols)]
    for name, r in results.items():
        cells = []
        for c in cols:
            v = r.get(c)
            if v is None:
                cells.append(f"{'-':>9}")
            elif "@" in c or c == "truncated_share":
                cells.append(f"{100 * v:>9.1f}")
            elif isinstance(v, float):
                cells.append(f"{v:>9.1f}")
            else:
                cells.append(f"{v:>9}")
        lines.append(f"{name:<{w}}" + "".join(cells))
    return "\n".join(lines)


def evaluate(model, tokenizer, benchmarks: str | Sequence[str], *, n: int = 1, temperature: float = 0.0,
             top_p: float = 1.0, max_new_tokens: int = 1024, limit: int | None = None, batch_size: int = 32,
             output_dir: str | os.PathLike | None = None, template: str = "auto", seed: int = 0,
             timeout: float = DEFAULT_TIMEOUT, engine=None, show_progress: bool = True,
             stream: TextIO | None = None, task_options: dict[str, dict] | None = None) -> dict[str, dict[str, Any]]:
    """Evaluate on ``benchmarks`` (names or "gsm8k,math500"); returns ``{benchmark: metrics}``.

    ``n`` samples per problem at ``temperature`` (0 = greedy, needs n == 1), ``limit``: first problems of
    each set; ``batch_size``: sequences per generate call; ``template``: see :mod:`oblr.tasks.templates`;
    ``engine``: the :class:`oblr.rollout.RolloutEngine` to sample with (default: ``hf`` over ``model``,
    ``batch_size`` rows at a time); ``task_options``: ``{name: options of its factory}`` (a run's task).
    Writes samples and ``results.json`` under ``output_dir`` when given, and prints the table to ``stream``
    (stdout).
    """
    _check(n, temperature, top_p, max_new_tokens, limit, batch_size, template, seed, timeout)
    names = _parse_benchmarks(benchmarks)
    out_dir = Path(output_dir) if output_dir is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    stream = stream or sys.stdout
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        metrics, samples = evaluate_benchmark(
            model, tokenizer, name, n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
            limit=limit, batch_size=batch_size, template=template, seed=seed, timeout=timeout,
            engine=engine, show_progress=show_progress, stream=sys.stderr,
            task_options=(task_options or {}).get(name))
        results[name] = metrics
        if out_dir is not None:
            _write_jsonl(out_dir / f"{name}.jsonl", samples)
    print(format_table(results), file=stream)
    if out_dir is not None:
        config = {"n": n, "temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                  "limit": limit, "batch_size": batch_size, "template": template, "seed": seed, "timeout": timeout,
                  **({"task_options": task_options} if task_options else {})}
        _write_json(out_dir / "results.json", {"config": config, "results": results})
        print(f"samples and results written to {out_dir}", file=stream)
    return results


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    os.replace(tmp, path)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)
