"""One gloo rank of the verl two-rank tests: ``python verl_dp_worker.py RANK WORLD PORT OUT ROLLOUTS NATIVE [SPLIT]
[SCHEDULE]``.

Loads the rollouts the test sampled and the native gradient, takes this rank's whole groups (a contiguous
block of prompts, as verl's dispatch chunks the batch: equal blocks, or SPLIT = the prompts of each rank,
e.g. ``1,3``; ``-`` for equal blocks), runs the verl step of tests/verl_step_helpers.py with the data-parallel
group and the global batch's rows and oblr's SCHEDULE (default ``snr``), and writes w_i, advantages, S, V, the
lr, the gradient's relative difference to the native one, and the step's KL and the schedule's next lr
(``kl``) as JSON."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
import verl_step_helpers as h


def main(rank: int, world: int, port: int, out: str, rollouts: str, native: str,
         split: list[int] | None = None, schedule: str = "snr") -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        ro = SimpleNamespace(**torch.load(rollouts))
        native_grads = torch.load(native)
        _, (model, engine, lr) = h.pair(schedule)
        total = ro.prompts.shape[0]
        split = split or [total // h.G // world] * world  # prompts per rank
        start = sum(split[:rank]) * h.G
        data = h.data_proto(ro, torch.arange(start, start + split[rank] * h.G))
        res = h.verl_step(model, engine, lr, data, dp_group=dist.group.WORLD, world=world, total_rows=total)
        result = {"w": res["w"].tolist(), "adv": res["adv"].tolist(), "S": res["S"], "V": res["V"], "n": res["n"],
                  "lr": res["lr"], "grad_rel_to_native": h.rel(res["grads"], native_grads),
                  "step_kl": res["step_kl"], "next_lr": getattr(lr.controller, "lr", None)}
        with open(out, "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    r, w, p, o, ro_path, nat_path = sys.argv[1:7]
    split = [int(x) for x in sys.argv[7].split(",")] if len(sys.argv) > 7 and sys.argv[7] != "-" else None
    main(int(r), int(w), int(p), o, ro_path, nat_path, split, *(sys.argv[8:9]))
