"""A deterministic reward stub for training tests that need real signal.

The test-sized built-in model (fixture ``small_builtin``) gets all-zero rewards on its own task, so a training
test of it would take no step at all. Importing this module registers the task ``SIGNAL_TASK``: the built-in
arithmetic prompts with the reward "share of the characters '1' in the response", non-zero and different
within every group, and with a direction common to all prompts (S > 0).
"""

from __future__ import annotations

from oblr.tasks import Task, available_tasks, get_task, register_task

SIGNAL_TASK = "_test_signal_stub"


def stub_reward(response: str) -> float:
    """In [0, 1], deterministic; the sampled responses of one prompt differ, so do their rewards."""
    return response.count("1") / max(1, len(response))


class _SignalTask(Task):
    name = SIGNAL_TASK

    def reward(self, response: str, example) -> float:
        return stub_reward(response)


if SIGNAL_TASK not in available_tasks():
    @register_task(SIGNAL_TASK)
    def _signal_task(**options):
        base = get_task("arithmetic", n_train=64, n_eval=8)
        return _SignalTask(base.train, base.eval)
