"""Tasks: prompts, reference answers and verifiable rewards, in a registry by name.

A task gives the trainer and the evaluator lists of :class:`Example` and a reward function; the registry
:data:`TASKS` holds their factories (``register_task``, ``get_task``). Built-in names: ``arithmetic``, ``countdown``, ``word_problems`` (generated, see
:mod:`oblr.tasks.arithmetic`, :mod:`oblr.tasks.countdown`, :mod:`oblr.tasks.word_problems`), and the math sets under
``../shared/data`` (see :mod:`oblr.tasks.math`).
"""

from oblr.tasks.base import (
    TASKS,
    Example,
    Task,
    available_tasks,
    get_task,
    register_task,
    reward_scorer,
    safe_reward,
)

__all__ = ["TASKS", "Example", "Task", "get_task", "register_task", "available_tasks", "reward_scorer",
           "safe_reward"]
