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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
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


# ------------------------------------------------------------------------------------------------- CLI
def resolve_model_arg(model: str) -> tuple[str, dict | None]:
    """``(what to load, the run's config or None)`` for ``oblr eval --model``.

    A folder holding ``config.json`` is a saved model (a checkpoint folder is one) and is loaded as it is. A
    run folder of ``oblr train`` (``config.yaml`` + ``checkpoints/``) gives its newest intact checkpoint
    (:func:`oblr.train.checkpoint.latest_checkpoint`, damaged ones passed over with a warning) and its config
    (a dict, read as saved). Any other folder, or a run folder without a complete checkpoint, is refused with
    one line (``FileNotFoundError``) before any model loads. Anything that is not a folder (``builtin``, a
    hub id, a missing path) is passed on to :func:`oblr.models.load_model_and_tokenizer`, which reports it.
    """
    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return model, None
    is_run = (path / "config.yaml").is_file()
    if not is_run or not (path / "checkpoints").is_dir():
        what = "an oblr run folder without checkpoints/ (it saved no checkpoint)" if is_run else \
            "neither a saved model (no config.json) nor an oblr run folder (config.yaml + checkpoints/step_N)"
        raise FileNotFoundError(f"--model {model}: {what}; pass a run folder, one of its checkpoints/step_N, "
                                f"a model folder saved with save_pretrained, 'builtin' or a hub id")
    from oblr.config import read_config_file
    from oblr.train.checkpoint import latest_checkpoint

    run = read_config_file(path / "config.yaml")
    ckpt = latest_checkpoint(path, warn=lambda msg: print(msg, file=sys.stderr))
    if ckpt is None:
        raise FileNotFoundError(f"--model {model}: run folder with no complete checkpoint under "
                                f"{path / 'checkpoints'} (checkpoints/step_N with trainer_state.pt)")
    if not (ckpt / "config.json").is_file():
        lora = (ckpt / "adapter_config.json").is_file()
        raise FileNotFoundError(f"--model {model}: its last checkpoint {ckpt} holds "
                                f"{'LoRA adapters only' if lora else 'no config.json'}; oblr eval loads full models")
    print(f"[eval] run folder {path}: evaluating its checkpoint {ckpt.name}", file=sys.stderr)
    return str(ckpt), run


def _run_task(run: dict) -> tuple[str, dict, int | None, int | None]:
    """``(task name, task options, eval_size, max_new_tokens)`` of a run's config dict (defaults where the
    saved config lacks a key, as :class:`oblr.config.Config` has them)."""
    from oblr.config import RolloutConfig, TaskConfig

    task = run.get("task") or {}
    rollout = run.get("rollout") or {}
    return (task.get("name", TaskConfig.name), dict(task.get("options") or {}),
            task.get("eval_size", TaskConfig.eval_size), rollout.get("max_new_tokens", RolloutConfig.max_new_tokens))


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``oblr eval`` to an argparse sub-parser set; the handler is ``args.func``."""
    p = subparsers.add_parser("eval", help="evaluate a model on math benchmarks (pass@1, avg@k, maj@k)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="run folder of oblr train (its newest checkpoint), checkpoint or model directory, hub id, "
                        "or 'builtin'")
    p.add_argument("--benchmarks", default=None,
                   help=f"comma-separated, from: {','.join(EVAL_BENCHMARKS)} or any registered task (`oblr tasks`); "
                        f"default: the task a run folder trained on, else gsm8k,math500")
    p.add_argument("--n", type=int, default=1, help="samples per problem (k of avg@k / maj@k); default 1")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 = sampling")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: a run folder's rollout.max_new_tokens on its task, else 1024")
    p.add_argument("--limit", type=int, default=None,
                   help="first L problems of each benchmark (default: all; a run folder's task: its task.eval_size)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate call")
    p.add_argument("--output-dir", default=None, help="default: eval_out/<model>-<time>")
    p.add_argument("--template", default="auto", choices=TEMPLATES,
                   help="prompt style: chat if the tokenizer has a chat template (auto), base, chat, raw")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16; auto: bfloat16 on GPU")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ...; auto: cuda when available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per symbolic check")
    p.add_argument("--engine", default="hf", help="rollout engine (see `oblr tasks`; default hf)")
    p.add_argument("--engine-options", default="{}", metavar="YAML",
                   help="options of the engine's factory, e.g. '{memory_fraction: 0.3}' (see docs/rollout.md)")
    p.set_defaults(func=run_cli)
    return p


def run_cli(args: argparse.Namespace) -> int:
    from oblr.checks import check_options
    from oblr.distributed.env import resolve_device
    from oblr.models import load_model_and_tokenizer
    from oblr.rollout import ENGINES, check_engine, make_engine
    from oblr.safe_load import load_yaml

    # every flag is checked before the model loads: numbers, device, dtype, benchmarks, engine and its options
    _check(args.n, args.temperature, args.top_p, 1024 if args.max_new_tokens is None else args.max_new_tokens,
           args.limit, args.batch_size, args.template, args.seed, args.timeout)
    if not re.fullmatch(r"auto|(cpu|cuda|mps)(:\d+)?", args.device):
        raise ValueError(f"--device {args.device!r} is not auto, cpu, cuda, cuda:N or mps")
    device = str(resolve_device(args.device))  # e.g. cuda on a machine without CUDA: one line, here
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    model_path, run = resolve_model_arg(args.model)
    limit, max_new_tokens, task_options = args.limit, args.max_new_tokens or 1024, None
    if args.benchmarks is None and run is not None:  # the task the run trained on, as its evaluation saw it
        name, options, eval_size, run_tokens = _run_task(run)
        names, task_options = _parse_benchmarks([name]), {name: options}
        limit = eval_size if limit is None and eval_size else limit
        max_new_tokens = args.max_new_tokens or run_tokens
        print(f"[eval] task {name} of the run (options {options or '{}'}), first {limit} held-out problems, "
              f"max_new_tokens {max_new_tokens}", file=sys.stderr)
    else:
        names = _parse_benchmarks(args.benchmarks or "gsm8k,math500")
    check_engine(args.engine)  # unknown, or missing its package: fails here with one line, before the model loads
    options = load_yaml(args.engine_options, "--engine-options")
    if not isinstance(options, dict):
        raise ValueError(f"--engine-options: expected a mapping like '{{memory_fraction: 0.3}}', got "
                         f"{args.engine_options!r}")
    options = check_options(ENGINES, args.engine, options, "--engine-options")
    out = args.output_dir
    if out is None:
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(args.model).rstrip("/").split("/")[-1]) or "model"
        out = Path("eval_out") / f"{tag}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    model, tokenizer = load_model_and_tokenizer(model_path, dtype=dtype, device=device)
    engine = make_engine(args.engine, model, tokenizer, **{"batch_size": args.batch_size, **options})
    try:
        evaluate(model, tokenizer, names, n=args.n, temperature=args.temperature, top_p=args.top_p,
                 max_new_tokens=max_new_tokens, limit=limit, batch_size=args.batch_size, output_dir=out,
                 template=args.template, seed=args.seed, timeout=args.timeout, engine=engine,
                 task_options=task_options)
    finally:
        engine.close()
    return 0
