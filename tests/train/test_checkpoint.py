import pytest
import torch
from conftest import tiny_qwen3

from oblr.train import checkpoint as ckpt


def _state():
    return {"optimizer": {"x": torch.arange(3)}, "lr_controller": {"t": 1}}


def test_save_load_roundtrip_and_prune(tmp_path):
    model = tiny_qwen3()
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, model, None, _state(), keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_000002", "step_000003"]
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.name == "step_000003"
    other = tiny_qwen3(seed=5)
    ckpt.load_weights_into(other, latest)
    for (n, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), n
    st = ckpt.load_trainer_state(latest)
    assert st["step"] == 3 and torch.equal(st["optimizer"]["x"], torch.arange(3))


def test_crash_during_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny_qwen3()
    ckpt.save_checkpoint(tmp_path, 1, model, None, _state())

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, 2, model, None, _state())
    monkeypatch.undo()
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000001"
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    ckpt.load_trainer_state(ckpt.latest_checkpoint(tmp_path))


def test_rng_state_roundtrip():
    s = ckpt.rng_state()
    a = torch.rand(3)
    ckpt.set_rng_state(s)
    assert torch.equal(a, torch.rand(3))



def _state_only_checkpoints(run, steps, *, keep=None):
    """Checkpoints of ``steps`` holding only a trainer state (enough for the fallback and pruning logic), saved
    in order with ``keep`` (default: all kept)."""
    for step in steps:
        tmp = ckpt.begin_checkpoint(run, step)
        ckpt.write_state(tmp, step, _state())
        ckpt.commit_checkpoint(run, step, tmp, keep=keep or len(steps))


def _truncate(run, step):
    f = run / "checkpoints" / f"step_{step:06d}" / ckpt.STATE_FILE
    f.write_bytes(f.read_bytes()[:10])


def test_fallback_among_four_checkpoints_takes_the_newest_intact_one_in_order(tmp_path):
    """With four checkpoints the order of the candidates matters (with two it never does): the newest
    damaged -> the second newest; the two newest damaged -> the third; never an older intact one first,
    and the damaged ones are reported newest first."""
    _state_only_checkpoints(tmp_path, [1, 2, 3, 4])
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir())
    assert names == ["step_000001", "step_000002", "step_000003", "step_000004"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000004"
    warned = []
    _truncate(tmp_path, 4)
    assert ckpt.latest_checkpoint(tmp_path, warn=warned.append).name == "step_000003"
    assert len(warned) == 1 and "step_000004 is damaged" in warned[0]
    warned.clear()
    _truncate(tmp_path, 3)
    got = ckpt.latest_checkpoint(tmp_path, warn=warned.append)
    assert got.name == "step_000002" and ckpt.load_trainer_state(got)["step"] == 2
    assert ["step_000004" in warned[0], "step_000003" in warned[1]] == [True, True] and len(warned) == 2
    _truncate(tmp_path, 2)
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000001"
    _truncate(tmp_path, 1)
    assert ckpt.latest_checkpoint(tmp_path) is None


def test_fallback_when_latest_names_an_older_checkpoint_goes_on_newest_first(tmp_path):
    """LATEST is tried first even when it is not the newest folder (e.g. a step re-saved); after it, the
    others newest first: here LATEST = step 2 (damaged) -> step 4, not step 1 or 3."""
    _state_only_checkpoints(tmp_path, [1, 2, 3, 4])
    (tmp_path / "checkpoints" / "LATEST").write_text("step_000002\n")
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000002"
    _truncate(tmp_path, 2)
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000004"
    _truncate(tmp_path, 4)
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000003"


def _names(run):
    return sorted(p.name for p in (run / "checkpoints").iterdir())


def test_pruning_keeps_the_new_checkpoint_over_higher_numbered_damaged_ones(tmp_path):
    """Damaged step_3 and step_4 of an earlier attempt (not moved aside): a run that starts again saves step_1
    and step_2 with keep=2 and keeps both (before: the two highest numbers were kept, the damaged ones, and
    step_1, step_2 deleted); the folders of later steps belong to another trajectory and are left alone."""
    _state_only_checkpoints(tmp_path, [3, 4])
    _truncate(tmp_path, 3)
    _truncate(tmp_path, 4)
    _state_only_checkpoints(tmp_path, [1, 2], keep=2)
    assert _names(tmp_path) == ["LATEST", "step_000001", "step_000002", "step_000003", "step_000004"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_000002"
    _state_only_checkpoints(tmp_path, [3], keep=2)  # step 3 again: replaces the damaged one, prunes step 1
    assert _names(tmp_path) == ["LATEST", "step_000002", "step_000003", "step_000004"]


def test_a_damaged_checkpoint_never_counts_as_one_of_the_kept(tmp_path):
    """keep=2 with step_3 damaged: saving step 5 keeps step_5 and step_2 (the newest intact ones) and deletes
    only what is older than step_2; the damaged step_3 stays until two intact ones follow it."""
    _state_only_checkpoints(tmp_path, [1, 2, 3])
    _truncate(tmp_path, 3)
    _state_only_checkpoints(tmp_path, [5], keep=2)
    assert _names(tmp_path) == ["LATEST", "step_000002", "step_000003", "step_000005"]
    _state_only_checkpoints(tmp_path, [6], keep=2)
    assert _names(tmp_path) == ["LATEST", "step_000005", "step_000006"]
    _state_only_checkpoints(tmp_path, [7], keep=1)
    assert _names(tmp_path) == ["LATEST", "step_000007"]


def test_pruning_orders_checkpoints_by_step_not_by_name(tmp_path):
    """step_1000000 has seven digits and sorts before step_999999 as text: after step_1000001, keep=2 keeps
    it and deletes step_999999 (by name: step_1000000 deleted, or with step_999999 taken for the newer of the
    two earlier ones, nothing)."""
    _state_only_checkpoints(tmp_path, [999_999, 1_000_000, 1_000_001], keep=2)
    assert _names(tmp_path) == ["LATEST", "step_1000000", "step_1000001"]


def test_set_aside_moves_every_checkpoint_and_latest_out_of_sight(tmp_path):
    _state_only_checkpoints(tmp_path, [3, 4])
    _truncate(tmp_path, 4)
    problems = ckpt.checkpoint_problems(tmp_path)
    assert [(p.name, why is None) for p, why in problems] == [("step_000004", False), ("step_000003", True)]
    _truncate(tmp_path, 3)
    line = ckpt.all_damaged_line(ckpt.checkpoint_problems(tmp_path))
    assert line.startswith("2 checkpoints, all damaged (step_000004: trainer_state.pt has 10 bytes"), line
    dest = ckpt.set_aside_checkpoints(tmp_path, "20990101-000000")
    assert dest == tmp_path / "checkpoints" / "damaged-20990101-000000"
    assert sorted(p.name for p in dest.iterdir()) == ["LATEST", "step_000003", "step_000004"]
    assert _names(tmp_path) == ["damaged-20990101-000000"]
    assert ckpt.checkpoint_folders(tmp_path) == [] and ckpt.latest_checkpoint(tmp_path) is None
    assert ckpt.set_aside_checkpoints(tmp_path, "20990101-000000") is None  # nothing left to move
