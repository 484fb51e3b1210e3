"""The proxy study's step-0 model of a run: the run's model, where plain ``builtin`` means the task's own
built-in model for ``countdown`` and ``word_problems`` (as in the trainer)."""

import pytest

from oblr.experiments.proxy_study import study_points


@pytest.mark.parametrize("task,want", [("countdown", "builtin:tiny-countdown"), ("word_problems", "builtin:tiny-words"),
                                       ("arithmetic", "builtin")])
def test_step_zero_is_the_tasks_builtin_model(tmp_path, task, want):
    (tmp_path / "config.yaml").write_text(f"model:\n  name_or_path: builtin\ntask:\n  name: {task}\n")
    ck = tmp_path / "checkpoints" / "step_10"
    ck.mkdir(parents=True)
    (ck / "config.json").write_text("{}")
    assert study_points(tmp_path, None) == [(0, want), (10, str(ck))]
    assert study_points(tmp_path, "some/model")[0] == (0, "some/model")
