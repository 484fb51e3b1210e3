"""oblr tasks in TRL's terms: a ``datasets.Dataset`` of prompts, a reward function, held-out accuracy.

Whose code: oblr's -- all of it (a dataset, a reward function and an accuracy over oblr's tasks); TRL's
-- only the reward-function call convention, and ``datasets.Dataset``. No private framework name is touched
here (docs/integrations_private_api.md).

- :func:`task_dataset` -- columns ``prompt`` (the exact text fed to the model) and ``answer``;
- :class:`TaskReward` -- ``reward(prompts, completions, answer, **kwargs) -> list[float]``, the task's
  verifiable reward through :func:`oblr.tasks.safe_reward` (a failing reward gives 0 and a counted warning);
- :func:`heldout_accuracy` -- sampled accuracy on held-out problems with :func:`oblr.train.evaluation.heldout_eval`
  (the function ``oblr train`` evaluates with; a private generator seed, so the training RNG is untouched).
"""

from __future__ import annotations

import torch
from datasets import Dataset

from oblr.tasks import Example, Task, reward_scorer, safe_reward
from oblr.tasks.base import RewardFailures


def task_dataset(examples: list[Example]) -> Dataset:
    """A TRL prompt dataset (standard, non-conversational format) from task examples."""
    return Dataset.from_dict({"prompt": [e.prompt for e in examples], "answer": [e.answer for e in examples]})


class TaskReward:
    """A TRL reward function for ``task``; it needs the ``answer`` column of :func:`task_dataset`."""

    def __init__(self, task: Task):
        self.task = task
        self.failures = RewardFailures()
        self.__name__ = f"{task.name}_reward"  # TRL logs rewards/<name>/mean

    def __call__(self, prompts, completions, answer, **kwargs) -> list[float]:
        return [safe_reward(self.task, c, Example(prompt=p, answer=a), self.failures)
                for p, c, a in zip(prompts, completions, answer)]


def heldout_accuracy(model, tokenizer, task: Task, *, n_problems: int = 100, samples: int = 4,
                     temperature: float = 1.0, max_new_tokens: int = 32, seed: int = 12345,
                     batch_size: int | None = 256) -> float:
    """Share of correct sampled answers over the first ``n_problems`` held-out problems x ``samples``."""
    from oblr.rollout.heldout import heldout_eval
    from oblr.rollout.hf import HFEngine

    examples = task.eval[:n_problems]
    if not examples:
        raise ValueError(f"task {task.name!r} has no held-out problems")
    with torch.no_grad():
        h = heldout_eval(HFEngine(model, tokenizer, batch_size=batch_size), examples, reward_scorer(task),
                         samples=samples, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                         greedy=False)
    return h.accuracy_sampled()
