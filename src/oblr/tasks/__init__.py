"""Tasks: prompts, reference answers and verifiable rewards, in a registry by name.

A task gives the trainer and the evaluator lists of :class:`Example` and a reward function. Built-in
names: ``arithmetic`` (generated, see :mod:`oblr.tasks.arithmetic`), and the math sets under
``../shared/data`` (see :mod:`oblr.tasks.math`).
"""

from oblr.tasks.base import Example, Task, available_tasks, get_task, register_task, safe_reward

__all__ = ["Example", "Task", "get_task", "register_task", "available_tasks", "safe_reward"]
