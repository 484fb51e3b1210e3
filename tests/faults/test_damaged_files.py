"""Damaged files: a truncated latest checkpoint is detected on load and the run resumes from the previous
intact one with a warning; when every checkpoint is damaged, --resume refuses naming them and
--resume-or-start moves them aside and starts again without losing its own checkpoints; a truncated cached
built-in model is rebuilt instead of ending in a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from fault_helpers import train_args, train_rows

from oblr.cli import main
from oblr.train.checkpoint import checkpoint_problem, latest_checkpoint


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_truncated_latest_checkpoint_falls_back_to_the_previous_one(small_builtin, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["train.save_every=1", "train.eval_every=0", "task.eval_size=0"]
    assert main(train_args(small_builtin, out, 2, *common)) == 0
    first_run = train_rows(out)
    _truncate(out / "checkpoints" / "step_000002" / "model.safetensors")
    assert checkpoint_problem(out / "checkpoints" / "step_000002") is not None
    assert latest_checkpoint(out).name == "step_000001"
    capsys.readouterr()
    assert main(train_args(small_builtin, out, 3, *common) + ["--resume"]) == 0
    err = capsys.readouterr().err
    assert "step_000002 is damaged (model.safetensors has" in err and "falling back" in err, err
    again = train_rows(out)
    assert sorted(again) == [1, 2, 3]
    for key in ("train/reward_mean", "optim/grad_norm", "optim/lr"):  # step 2 replayed from step 1's checkpoint
        assert again[2][key] == pytest.approx(first_run[2][key], rel=1e-6), key
    assert checkpoint_problem(out / "checkpoints" / "step_000002", deep=True) is None  # rewritten whole


def test_checkpoint_changed_in_place_is_caught_by_the_hash(small_builtin, tmp_path):
    out = tmp_path / "run"
    assert main(train_args(small_builtin, out, 1, "train.eval_every=0", "task.eval_size=0")) == 0
    f = out / "checkpoints" / "step_000001" / "trainer_state.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    f.write_bytes(bytes(data))
    assert checkpoint_problem(f.parent) is None  # sizes alone do not see it
    assert "sha256 differs" in checkpoint_problem(f.parent, deep=True)


def test_every_checkpoint_damaged_restarts_without_losing_the_new_run_s_checkpoints(small_builtin, tmp_path,
                                                                                     capsys):
    """A 4-step run keeps step_3 and step_4; both are damaged. --resume and plain train refuse naming
    "2 checkpoints, all damaged" and --resume-or-start (not "holds no checkpoint"); --resume-or-start moves
    them into checkpoints/damaged-*/, says so in one line and runs 2 steps with keep_checkpoints=2. Before:
    pruning kept the highest-numbered folders (the damaged step_3, step_4) and deleted the new step_1 and
    step_2, leaving LATEST naming a missing folder."""
    out = tmp_path / "run"
    common = ["train.save_every=1", "train.eval_every=0", "task.eval_size=0", "train.keep_checkpoints=2"]
    assert main(train_args(small_builtin, out, 4, *common)) == 0
    for step in (3, 4):
        _truncate(out / "checkpoints" / f"step_{step:06d}" / "model.safetensors")
    capsys.readouterr()
    for mode in (["--resume"], []):
        assert main(train_args(small_builtin, out, 2, *common) + mode) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "2 checkpoints, all damaged (step_000004: model.safetensors has" in err, err
        assert "--resume-or-start starts it again from step 0" in err and "holds no checkpoint" not in err, err
    assert main(train_args(small_builtin, out, 2, *common) + ["--resume-or-start"]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "moved aside" in line]
    assert len(said) == 1 and "2 checkpoints, all damaged" in said[0], err
    ckpts = out / "checkpoints"
    aside = [p for p in ckpts.iterdir() if p.name.startswith("damaged-")]
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == ["LATEST", "step_000003", "step_000004"]
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_000001", "step_000002"]
    latest = ckpts / (ckpts / "LATEST").read_text().strip()
    assert latest.name == "step_000002" and checkpoint_problem(latest, deep=True) is None
    assert sorted(train_rows(out)) == [1, 2]
    assert main(train_args(small_builtin, out, 3, *common) + ["--resume"]) == 0  # resumes from the new step_2
    assert sorted(train_rows(out)) == [1, 2, 3] and latest_checkpoint(out).name == "step_000003"


def test_truncated_cached_builtin_model_is_rebuilt(small_builtin, tmp_path, monkeypatch):
    import oblr.models.builtin as builtin
    from oblr.models import builtin_model_dir, resolve_model_path

    monkeypatch.setenv("OBLR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OBLR_BUILTIN", "build")  # a build of this machine in the cache (not the shipped bytes)
    cached = builtin_model_dir()
    shutil.copytree(small_builtin, cached)
    meta = json.loads((cached / builtin.METADATA_FILE).read_text())
    (cached / builtin.METADATA_FILE).write_text(json.dumps({**meta, "recipe": builtin.builtin_recipe(0)}))
    assert builtin.is_current_build(cached)  # stands in for a complete cache of the current recipe
    _truncate(cached / "model.safetensors", 0.9)
    assert not builtin.is_current_build(cached)
    built = []

    def rebuild(path, **kw):  # the real build takes minutes; it is tested in tests/models
        built.append(path)
        return path

    monkeypatch.setattr(builtin, "build_builtin_model", rebuild)
    assert resolve_model_path("builtin") == cached and built == [cached]


def test_fallback_order_is_by_step_number_not_by_name(tmp_path, monkeypatch):
    import oblr.train.checkpoint as ck

    root = tmp_path / "run" / "checkpoints"
    for name in ("step_9", "step_10", "step_000002"):  # unpadded names sort wrongly as text
        (root / name).mkdir(parents=True)
    tried = []
    monkeypatch.setattr(ck, "checkpoint_problem", lambda p, deep=False: tried.append(p.name) or "damaged")
    assert ck.latest_checkpoint(tmp_path / "run") is None
    assert tried == ["step_10", "step_9", "step_000002"]
    tried.clear()
    monkeypatch.setattr(ck, "checkpoint_problem", lambda p, deep=False: None if p.name == "step_9" else "damaged")
    assert ck.latest_checkpoint(tmp_path / "run").name == "step_9"
