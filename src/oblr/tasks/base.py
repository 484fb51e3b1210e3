"""Task interface and registry."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# modules that register tasks when imported; imported lazily by get_task/available_tasks
_TASK_MODULES = ("oblr.tasks.arithmetic", "oblr.tasks.math")


@dataclass
class Example:
    """One prompt with its reference answer. ``prompt`` is the exact text fed to the model."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class Task:
    """A dataset split plus a reward. Subclasses fill ``train``/``eval`` and implement ``reward``."""

    name: str = "task"

    def __init__(self, train: list[Example], eval: list[Example]):
        self.train = train
        self.eval = eval

    def reward(self, response: str, example: Example) -> float:  # pragma: no cover - interface
        raise NotImplementedError


_REGISTRY: dict[str, Callable[..., Task]] = {}


def register_task(name: str):
    """Decorator: register a factory ``f(**options) -> Task`` under ``name`` (duplicates rejected)."""

    def deco(factory):
        if name in _REGISTRY:
            raise ValueError(f"task {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def _load_builtin_modules() -> None:
    for mod in _TASK_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # a module not written yet, or an optional dependency missing
            if e.name != mod:
                raise


def available_tasks() -> list[str]:
    _load_builtin_modules()
    return sorted(_REGISTRY)


def get_task(name: str, **options) -> Task:
    _load_builtin_modules()
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](**options)


def task_accepts(name: str, option: str) -> bool:
    """Whether the factory of task ``name`` takes the keyword ``option`` (e.g. ``tokenizer``)."""
    import inspect

    _load_builtin_modules()
    factory = _REGISTRY.get(name)
    return factory is not None and option in inspect.signature(factory).parameters


class RewardFailures:
    """Counts reward-function failures so that the trainer can log them."""

    def __init__(self) -> None:
        self.count = 0


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
