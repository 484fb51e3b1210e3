"""The distributed benchmarks cannot rot: the GPU script's CPU path on a tiny model (FSDP2 on one rank,
norms against the loop, both step kinds timed), and the Qwen3 parameter counts behind scaling.py's
communication table (no timing assertions)."""

from __future__ import annotations

import json
import math
import socket
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "gpu"))


@pytest.fixture
def one_rank_env(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(k, v)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_gpu_fsdp_script_cpu_path(one_rank_env, tmp_path):
    import fsdp_step

    out = tmp_path / "fsdp_step.json"
    fsdp_step.main(["--tiny", "--device", "cpu", "--repeats", "1", "--norm-seqs", "3", "--out", str(out)])
    res = json.loads(out.read_text())
    assert res["world_size"] == 1 and res["device"] == "cpu"
    (norms,) = res["norms"]
    assert norms["param_dtype"] == "float32" and len(norms["w"]) == 3
    assert norms["w_rel_err_max"] < 1e-4 and norms["weighted_grad_rel_err_max"] < 1e-4
    step = res["step"]
    assert set(step["median_s"]) == {"grpo", "oblr"} and math.isfinite(step["oblr_over_grpo"])
    assert step["oblr_over_grpo"] > 0 and step["params"] > 0
    assert not torch.distributed.is_initialized()  # the script's process group is gone


def test_qwen3_parameter_counts_for_the_communication_table():
    import scaling

    rows = {r["model"]: r for r in scaling.comm_table(scaling.QWEN3, world=8)}
    # the published sizes: Qwen3-4B 4.0 B (tied embeddings), Qwen3-8B 8.2 B (6.95 B without embeddings)
    assert abs(rows["Qwen3-4B"]["params"] / 1e9 - 4.02) < 0.01
    assert abs(rows["Qwen3-8B"]["params"] / 1e9 - 8.19) < 0.01
    r = rows["Qwen3-8B"]
    assert r["ddp_allreduce_bytes"] == 4 * r["params"] and r["fsdp_allgather_bytes"] == 4 * r["params"]
