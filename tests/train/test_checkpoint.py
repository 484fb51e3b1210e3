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

