"""oblr.distributed in one process: the one-line refusals of bad setups, sharding, seeds, identity collectives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_qwen3

from oblr.distributed import (
    DistributedSetupError,
    Sharded,
    all_gather_cat,
    all_gather_objects,
    check_layout,
    global_totals,
    init_distributed,
    make_parallel,
    prompt_slice,
    rank_seed,
    reduce_metrics,
    resolve_backend,
    row_slice,
    shard_rows,
    split_evenly,
)
from oblr.distributed.fsdp import shard_model
from oblr.losses import BatchTotals

NO_LAUNCH = {"PATH": "/usr/bin"}


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_n_not_divisible_by_world_size_is_refused():
    with pytest.raises(DistributedSetupError) as e:
        check_layout(10, 8, 4)
    assert "N = 10 prompts per step do not split over 4 ranks" in _one_line(e) and "e.g. 12" in str(e.value)
    check_layout(12, 8, 4)


def test_micro_batch_that_splits_a_group_is_refused():
    with pytest.raises(DistributedSetupError) as e:
        check_layout(8, 8, 2, micro_batch_sequences=12)
    assert "12 sequences splits the groups of G = 8" in _one_line(e)
    check_layout(8, 8, 2, micro_batch_sequences=16)
    with pytest.raises(DistributedSetupError, match="micro_batch_groups must be >= 0"):
        check_layout(8, 8, 2, micro_batch_groups=-1)


def test_fsdp_without_a_distributed_launch_is_refused(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DistributedSetupError) as e:
        make_parallel("fsdp").prepare(tiny_qwen3())
    assert "parallel mode 'fsdp' needs a distributed launch (torchrun" in _one_line(e)
    with pytest.raises(DistributedSetupError, match="no process group is initialised"):
        shard_model(tiny_qwen3())
    assert isinstance(make_parallel("fsdp", param_dtype="bfloat16"), Sharded)
    with pytest.raises(ValueError, match="zero3.*ddp, fsdp, none"):
        make_parallel("zero3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_nccl_without_cuda_is_refused():
    with pytest.raises(DistributedSetupError) as e:
        resolve_backend("nccl", "auto")
    assert "backend 'nccl' needs CUDA" in _one_line(e)
    with pytest.raises(DistributedSetupError, match="needs CUDA"):  # also before any launch
        init_distributed("nccl", environ=NO_LAUNCH)
    launch = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    with pytest.raises(DistributedSetupError, match="needs CUDA"):  # refused before init_process_group
        init_distributed("nccl", environ=launch)
    assert resolve_backend("auto", "auto") == "gloo"
    with pytest.raises(DistributedSetupError, match="unknown distributed backend 'mpi'"):
        resolve_backend("mpi")


def test_without_a_launch_the_environment_is_one_process():
    env = init_distributed("auto", "cpu", environ=NO_LAUNCH)
    assert (env.rank, env.world_size, env.distributed, env.is_main, env.device.type) == (0, 1, False, True, "cpu")


def test_prompt_blocks_cover_the_batch_in_order():
    N, G, W = 6, 3, 3
    assert [prompt_slice(N, W, r) for r in range(W)] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    rows = [row_slice(N, G, W, r) for r in range(W)]
    assert rows == [slice(0, 6), slice(6, 12), slice(12, 18)]
    batch = SimpleNamespace(input_ids=torch.arange(18 * 2).view(18, 2), responses=[str(i) for i in range(18)],
                            prompt_length=4)
    parts = [shard_rows(batch, r) for r in rows]
    assert torch.equal(torch.cat([p.input_ids for p in parts]), batch.input_ids)
    assert sum((p.responses for p in parts), []) == batch.responses and parts[1].prompt_length == 4
    with pytest.raises(DistributedSetupError, match="rank 3 is outside a world of 3"):
        prompt_slice(N, W, 3)


def test_even_split_of_evaluation_items():
    for n, w in ((10, 3), (2, 4), (0, 2), (8, 2)):
        shares = [split_evenly(n, w, r) for r in range(w)]
        assert [i for s in shares for i in range(n)[s]] == list(range(n))
        assert max(s.stop - s.start for s in shares) - min(s.stop - s.start for s in shares) <= 1


def test_rank_seeds():
    assert rank_seed(7, 0) == 7  # one process: the run's own seed
    seeds = {rank_seed(s, r) for s in range(4) for r in range(1, 64)}
    assert len(seeds) == 4 * 63 and all(0 <= x < 2**63 for x in seeds) and not seeds & set(range(4))
    assert rank_seed(3, 5) == rank_seed(3, 5)


def test_collectives_are_the_identity_in_one_process():
    t = torch.arange(6.0).view(3, 2)
    assert torch.equal(all_gather_cat(t), t)
    assert all_gather_objects([1, "a"]) == [1, "a"]
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]])
    tot = global_totals(mask)
    assert (tot.sequences, float(tot.tokens), tot.width) == (2, 5.0, 4)
    assert BatchTotals.of(mask).sequences == 2


def test_reduce_metrics_weights():
    m = {"optim/loss": torch.tensor(2.0), "baseline/fallback_count": 3.0, "train/entropy": torch.tensor(0.5),
         "adv/std": torch.tensor(1.5)}
    out = reduce_metrics(m, n_prompts=2, n_prompts_total=4, tokens=10, tokens_total=40)
    # what this rank contributes to the sums over ranks: sums whole, means by its share of prompts or tokens
    assert {k: float(v) for k, v in out.items()} == {"optim/loss": 2.0, "baseline/fallback_count": 3.0,
                                                     "train/entropy": 0.125, "adv/std": 0.75}


def test_data_parallel_step_in_one_process_is_the_one_process_step():
    """Without a process group the data-parallel step is the ordinary step (what the trainer will call)."""
    from distributed_helpers import SCENARIOS, data_parallel_step, one_process_step

    sc = next(s for s in SCENARIOS if s.name == "ddp-oblr-microbatch-kl-2epochs")  # micro-batches, KL, clipping
    ref = one_process_step(tiny_qwen3().train(), tiny_qwen3().requires_grad_(False), sc)
    got = data_parallel_step(tiny_qwen3().train(), tiny_qwen3().requires_grad_(False), sc, make_parallel("ddp"), 0, 1)
    assert all(torch.equal(a, b) for a, b in zip(got["grads"], ref["grads"]))
    assert torch.equal(got["gks"], ref["gks"])
    # S (a difference, ||gbar||^2 - V/N) comes from the update's float32 ||.grad||^2 in one process and from
    # the float64 one in the reference: equal to float32 rounding amplified by the cancellation
    assert got["lr"] == pytest.approx(ref["lr"], rel=1e-4) and float(got["S"]) == pytest.approx(float(ref["S"]), rel=1e-4)
    # after clipping (clip_grads_ with the float64 norm vs torch's clip_grad_norm_): equal to rounding
    for key in ("grads2", "params"):
        assert max(float((a - b).norm() / b.norm()) for a, b in zip(got[key], ref[key])) < 1e-6, key


@pytest.mark.parametrize("overrides, environ, message", [
    (["distributed.strategy=fsdp"], NO_LAUNCH, "distributed.strategy 'fsdp' needs a distributed launch (torchrun"),
    (["distributed.strategy=ddp"], NO_LAUNCH, "distributed.strategy 'ddp' needs a distributed launch"),
    ([], {"WORLD_SIZE": "2", "RANK": "0"}, "torchrun started 2 processes but distributed.strategy is 'none'"),
    (["distributed.strategy=fsdp", "model.lora_rank=4"], {"WORLD_SIZE": "2", "RANK": "0"},
     "'fsdp' with LoRA (model.lora_rank > 0) is not supported"),
    (["distributed.strategy=ddp", "rollout.prompts_per_step=3"], {"WORLD_SIZE": "2", "RANK": "0"},
     "N = 3 prompts per step do not split over 2 ranks"),
])
def test_the_trainer_refuses_a_bad_distributed_setup_in_one_line(overrides, environ, message):
    """What `oblr train` checks before the process group starts or a model loads (oblr.train.ranks)."""
    from oblr.config import load_config
    from oblr.train.ranks import check_distributed

    with pytest.raises(DistributedSetupError) as e:
        check_distributed(load_config(None, overrides), environ)
    assert message in _one_line(e)
    check_distributed(load_config(None, ["distributed.strategy=fsdp"]), {"WORLD_SIZE": "2", "RANK": "0"})
    cfg = load_config(None, ["distributed.strategy=fsdp"])
    cfg.rollout.engine = "vllm"  # (a valid choice where vLLM is installed)
    with pytest.raises(DistributedSetupError, match="in-process engine only .rollout.engine=hf., not 'vllm'"):
        check_distributed(cfg, {"WORLD_SIZE": "2", "RANK": "0"})


_EXIT_SCRIPT = """
import atexit, os, sys, time, torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from oblr.distributed.env import exit_worker, init_distributed, shutdown

rank, marker = int(os.environ["RANK"]), os.environ["DONE_MARKER"]
if rank == 1:  # registered first, so it runs last: rank 1's handlers have all run
    atexit.register(lambda: open(marker, "w").close())
init_distributed("gloo")
atexit.register(lambda: print(f"atexit ran on rank {dist.get_rank() if dist.is_initialized() else '-'}", flush=True))
y = funcol.wait_tensor(funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD))
assert y.tolist() == [2.0, 2.0]
shutdown()
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(f"rank {os.environ['RANK']} gloo threads after destroy: {sum(t.startswith(('pt_gloo', 'gloo')) for t in threads)}")
sys.stdout.write("unflushed tail")
fail = bool(os.environ.get("FAIL")) and rank == 0
if fail:  # torchrun stops the other ranks at the first failure: fail once rank 1 has finished its exit
    deadline = time.monotonic() + 60
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
exit_worker(3 if fail else 0)
"""


@pytest.mark.parametrize("fail", [False, True])
def test_a_worker_ends_through_exit_worker_with_its_code_its_atexit_handlers_and_its_output(tmp_path, fail):
    """torch's functional collectives keep the gloo backend's threads alive after destroy_process_group (the
    source of the rare SIGABRT at exit); exit_worker ends the process without tearing them down, after the
    atexit handlers and with the output flushed, and keeps the exit status."""
    import subprocess
    import sys

    script = tmp_path / "w.py"
    script.write_text(_EXIT_SCRIPT)
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "DONE_MARKER": str(tmp_path / "rank1-done"),
           **({"FAIL": "1"} if fail else {})}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "--tee", "3", "--log-dir", str(tmp_path / "logs"), str(script)],
                          capture_output=True, text=True, env=env, timeout=120)
    out = proc.stdout
    assert "terminate called" not in proc.stderr
    if fail:
        assert proc.returncode != 0 and "exitcode  : 3" in proc.stderr, proc.stderr[-3000:]  # rank 0's own code
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
    for r in (0, 1):
        assert "atexit ran on rank -" in out and f"rank {r} gloo threads after destroy:" in out
    assert out.count("unflushed tail") == 2
