"""Math tasks on real data: GSM8K and MATH-style benchmarks, plus user data, with rewards on the grader.

Registered names (``oblr.tasks.get_task(name, **options)``):

=================  ===========================  =====================  =======
name               train                        eval                   grading
=================  ===========================  =====================  =======
``gsm8k``          gsm8k/train.jsonl (7473)     gsm8k/test.jsonl       gsm8k
``math500``        --                           math500 (500)          math
``aime24``         --                           aime24 (30)            math
``aime25``         --                           aime25 (30)            math
``amc23``          --                           amc23 (40)             math
``olympiadbench``  --                           olympiadbench (675)    math
``minerva_math``   --                           minerva_math (272)     math
``math_data``      ``train=`` file / dataset    ``eval=`` (optional)   ``kind=``
=================  ===========================  =====================  =======

Common options: ``template`` ("auto" | "base" | "chat" | "raw", see :mod:`oblr.tasks.templates`),
``tokenizer`` (for chat templates), ``limit`` (first rows of eval), ``train_limit``, ``timeout`` (seconds
per symbolic check). Each :class:`Example` has ``prompt`` (rendered), ``answer`` (reference, one string)
and ``meta`` with ``benchmark``, ``kind``, ``question``, ``solution``, ``line``, ``unit`` and the set's
own fields. The reward is 1.0 when :func:`oblr.grading.grade` says correct, else 0.0.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from oblr.checks import INT_MAX, Range
from oblr.grading import DEFAULT_TIMEOUT, grade, grade_many, normalize_reference
from oblr.tasks.base import Example, Task, register_task
from oblr.tasks.loaders import BENCHMARKS, MathRecord, load_benchmark, load_file, load_hf_dataset
from oblr.tasks.templates import render_prompt

EVAL_BENCHMARKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "olympiadbench", "minerva_math")


def to_examples(records: Sequence[MathRecord], *, kind: str, template: str = "auto", tokenizer: Any = None,
                benchmark: str | None = None) -> list[Example]:
    """Render records into :class:`Example` objects (prompt from the template, answer as one string)."""
    out = []
    for r in records:
        answer = normalize_reference(r.answer) if kind == "math" else str(r.answer)
        meta = {**r.meta, "question": r.question, "solution": r.solution, "kind": kind}
        meta.setdefault("benchmark", benchmark)
        meta.setdefault("unit", None)
        prompt = render_prompt(r.question, kind=kind, template=template, tokenizer=tokenizer)
        out.append(Example(prompt=prompt, answer=answer, meta=meta))
    return out


def reward_for(response: str, example: Example, *, kind: str | None = None,
               timeout: float = DEFAULT_TIMEOUT) -> float:
    """1.0 if ``response``'s final answer matches ``example.answer`` (kind from ``example.meta``), else 0.0."""
    k = kind or example.meta.get("kind", "math")
    return 1.0 if grade(response, example.answer, kind=k, unit=example.meta.get("unit"), timeout=timeout) else 0.0


def gsm8k_reward(response: str, example: Example) -> float:
    """GSM8K reward: exact numeric match of the final number."""
    return reward_for(response, example, kind="gsm8k")


def math_reward(response: str, example: Example) -> float:
    """MATH-style reward: symbolic match of the last ``\\boxed{}`` (5 s limit per check)."""
    return reward_for(response, example, kind="math")


class MathTask(Task):
    """A math dataset with a grader-backed reward; ``kind`` is the default grading kind."""

    def __init__(self, name: str, train: list[Example], eval: list[Example], *, kind: str,
                 timeout: float = DEFAULT_TIMEOUT):
        super().__init__(train, eval)
        self.name, self.kind, self.timeout = name, kind, timeout

    def reward(self, response: str, example: Example) -> float:
        return reward_for(response, example, kind=example.meta.get("kind", self.kind), timeout=self.timeout)

    def rewards(self, responses: Sequence[str], examples: Sequence[Example]) -> list[float]:
        """Batch form of :meth:`reward` (uses every grading worker); ``len(responses) == len(examples)``."""
        if len(responses) != len(examples):
            raise ValueError(f"{len(responses)} responses for {len(examples)} examples")
        out = [0.0] * len(responses)
        for kind in ("gsm8k", "math"):
            idx = [i for i, e in enumerate(examples) if e.meta.get("kind", self.kind) == kind]
            res = grade_many([responses[i] for i in idx], [examples[i].answer for i in idx], kind=kind,
                             units=[examples[i].meta.get("unit") for i in idx], timeout=self.timeout)
            for i, r in zip(idx, res):
                out[i] = 1.0 if r.correct else 0.0
        return out


Limit = Annotated[int | None, Range(ge=0, le=INT_MAX)]  # first rows (None = all, 0 = none)
Timeout = Annotated[float, Range(gt=0, le=3600)]  # seconds per symbolic check (0 would grade every answer wrong)


def benchmark_task(name: str, *, template: str = "auto", tokenizer: Any = None, limit: Limit = None,
                   train_limit: Limit = None, timeout: Timeout = DEFAULT_TIMEOUT, root=None) -> MathTask:
    """The task of a built-in set; eval is its test split, train its train split where it has one."""
    spec = BENCHMARKS[name]
    kw = dict(kind=spec.kind, template=template, tokenizer=tokenizer, benchmark=name)
    ev = to_examples(load_benchmark(name, "test", limit=limit, root=root), **kw)
    tr = (to_examples(load_benchmark(name, "train", limit=train_limit, root=root), **kw)
          if "train" in spec.splits else [])
    return MathTask(name, tr, ev, kind=spec.kind, timeout=timeout)


def _make_factory(name: str):
    def factory(**options) -> MathTask:
        return benchmark_task(name, **options)

    factory.__doc__ = f"Task {name!r}: see :func:`benchmark_task`."
    sig = inspect.signature(benchmark_task, eval_str=True)  # its options are benchmark_task's (name aside)
    factory.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])
    return factory


for _name in EVAL_BENCHMARKS:
    register_task(_name)(_make_factory(_name))


DATA_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".txt", ".arrow")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a local path (never a ``datasets`` Hub name ``[org/]name``): absolute,
    relative to ``.``/``..``/``~``, more than one ``/``, or a data-file suffix."""
    return (name.startswith(("/", "./", "../", "~", "\\")) or name in (".", "..") or name.count("/") > 1
            or "\\" in name or name.lower().endswith(DATA_SUFFIXES))


def _load_source(source: Any, split: str, **fields) -> list[MathRecord]:
    if isinstance(source, (str, Path)):
        p = Path(source).expanduser()
        if p.is_file():
            return load_file(p, **fields)
        if not p.is_dir() and (isinstance(source, Path) or looks_like_path(str(source))):
            # a path that does not exist: refused at once, never tried as a Hub dataset name
            raise FileNotFoundError(f"data file not found: {source}")
    return load_hf_dataset(source, split=split, **fields)


@register_task("math_data")
def math_data_task(*, train: Any = None, eval: Any = None, kind: Literal["gsm8k", "math"] = "math",
                   question: str = "question", answer: str = "answer", solution: str | None = None,
                   answer_format: Literal["plain", "gsm8k", "boxed"] = "plain", train_split: str = "train",
                   eval_split: str = "test", on_error: Literal["raise", "skip"] = "raise", template: str = "auto",
                   tokenizer: Any = None, limit: Limit = None, train_limit: Limit = None,
                   timeout: Timeout = DEFAULT_TIMEOUT) -> MathTask:
    """User data: ``train``/``eval`` are a local ``.jsonl``/``.json``/``.parquet`` file, a ``save_to_disk``
    folder, a ``datasets`` name, or a ``datasets.Dataset``; ``question``/``answer``/``solution`` name the
    fields; ``answer_format`` is "plain", "gsm8k" (after ``####``) or "boxed"; ``kind`` the grading kind."""
    if train is None and eval is None:
        raise ValueError("math_data needs train= and/or eval= (a file path or a datasets dataset)")
    if kind not in ("gsm8k", "math"):
        raise ValueError(f"math_data: kind must be 'gsm8k' or 'math', got {kind!r}")
    fields = dict(question=question, answer=answer, solution=solution, answer_format=answer_format,
                  on_error=on_error)
    kw = dict(kind=kind, template=template, tokenizer=tokenizer, benchmark="math_data")
    tr = to_examples(_load_source(train, train_split, limit=train_limit, **fields), **kw) if train is not None else []
    ev = to_examples(_load_source(eval, eval_split, limit=limit, **fields), **kw) if eval is not None else []
    return MathTask("math_data", tr, ev, kind=kind, timeout=timeout)
