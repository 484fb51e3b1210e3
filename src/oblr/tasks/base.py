"""Task interface, the task registry (:data:`TASKS`) and rewards that never raise.

A task factory's keyword parameters are its options (config key ``task.options``): their names, simple
types, ``Literal`` choices and ``Annotated[..., Range(...)]`` ranges are checked with the config, before
any data or model loads."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oblr.registry import Registry


@dataclass
class Example:
    """One prompt with its reference answer. ``prompt`` is the exact text fed to the model."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class Task:
    """A dataset split plus a reward. Subclasses fill ``train``/``eval`` and implement ``reward``; optionally
    ``extract_answer(response) -> str | None`` (the final answer, for ``oblr eval``'s majority vote maj@n)."""

    name: str = "task"

    def __init__(self, train: list[Example], eval: list[Example]):
        self.train = train
        self.eval = eval

    def reward(self, response: str, example: Example) -> float:  # pragma: no cover - interface
        raise NotImplementedError


# task factories ``f(**options) -> Task``; the built-in ones register when their modules are first needed
TASKS: Registry = Registry("task", modules=("oblr.tasks.arithmetic", "oblr.tasks.countdown", "oblr.tasks.word_problems",
                                     "oblr.tasks.math"))


def register_task(name: str) -> Callable:
    """Decorator: register a factory ``f(**options) -> Task`` under ``name`` (duplicates rejected)."""
    return TASKS.register(name)


def available_tasks() -> list[str]:
    return TASKS.names()


def get_task(name: str, **options) -> Task:
    """The task ``name`` built with ``options``, checked against its factory's signature first (names, types,
    ranges: :func:`oblr.config.check_options`), so a wrong option is one line, never a ``TypeError``."""
    from oblr.checks import check_options

    factory = TASKS.get(name)
    return factory(**check_options(TASKS, name, options, "task.options"))


def task_accepts(name: str, option: str) -> bool:
    """Whether the factory of task ``name`` takes the keyword ``option`` (e.g. ``tokenizer``)."""
    import inspect

    return name in TASKS and option in inspect.signature(TASKS.get(name)).parameters


class RewardFailures:
    """Counts reward-function failures so that the trainer can log them."""

    def __init__(self) -> None:
        self.count = 0


def step_prompt_indices(seed: int, step: int, n_train: int, n: int) -> list[int]:
    """The ``n`` training prompts of ``step`` (indices into a task's ``train``): an epoch-wise shuffle of the
    ``n_train`` prompts that depends only on (seed, step), so a resumed run draws what the straight run drew."""
    import torch

    out = []
    for pos in range(step * n, (step + 1) * n):
        epoch, i = divmod(pos, n_train)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        out.append(int(torch.randperm(n_train, generator=g)[i]))
    return out


def safe_reward(task: Task, response: str, example: Example, failures: RewardFailures | None = None) -> float:
    """``task.reward`` that never raises: an exception or a non-finite value gives 0 and a counted warning."""
    try:
        r = float(task.reward(response, example))
        if r != r or r in (float("inf"), float("-inf")):
            raise ValueError(f"reward is {r}")
        return r
    except Exception as e:  # noqa: BLE001 - a reward function must never crash training
        if failures is not None:
            failures.count += 1
        warnings.warn(f"reward function of task {task.name!r} failed ({type(e).__name__}: {e}); reward 0",
                      RuntimeWarning, stacklevel=2)
        return 0.0


def reward_scorer(task: Task, failures: RewardFailures | None = None) -> Callable[[list[str], list[Example]], Any]:
    """A ``score(responses, examples)`` for :func:`oblr.rollout.generate_and_score`: the task's reward of
    every row through :func:`safe_reward`, as a float32 tensor [B]; failures are counted in ``failures``."""
    import torch

    def score(responses: list[str], examples: list[Example]):
        return torch.tensor([safe_reward(task, r, ex, failures) for r, ex in zip(responses, examples)],
                            dtype=torch.float32)

    return score


def draw_distinct(n: int, exclude: set, sample: Callable[[], Any], key: Callable[[Any], Any], *,
                  too_few: Callable[[int], str]) -> list:
    """``n`` items from ``sample()``, distinct by ``key`` and none of whose keys is in ``exclude``, in the order
    drawn (a generated task's train and eval sets). 5000 duplicates in a row mean the space is exhausted:
    ``ValueError(too_few(number drawn so far))``."""
    out: list = []
    seen = set(exclude)
    misses = 0  # consecutive duplicates
    while len(out) < n:
        if misses > 5000:
            raise ValueError(too_few(len(out)))
        item = sample()
        k = key(item)
        if k in seen:
            misses += 1
            continue
        misses = 0
        seen.add(k)
        out.append(item)
    return out
