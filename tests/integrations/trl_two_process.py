"""Run by ``tests/integrations/conftest.py::two_process_run`` as 2 processes under ``accelerate launch`` (CPU,
gloo, one thread each). argv: MODEL_DIR OUT_DIR.

1. The exactness run: an OBLRGRPOTrainer (varied reward, 1 optimizer step) on the model at MODEL_DIR; each rank
   writes ``OUT_DIR/rank{r}.pt``: its local rows of every generation batch, the synchronised gradient before each
   optimizer step, TRL's log history (with the ``oblr/`` metrics), the world size, and the message for a
   per-process batch that would split a group across the 2 processes.
2. The kl schedule's run: 2 optimizer steps with ``oblr_lr_schedule='kl'``; each rank writes
   ``OUT_DIR/kl_rank{r}.pt``: its local rows of step 1, TRL's log history and the weights after step 1.
3. The example, ``examples/trl_grpo_oblr.py``, called through its ``main`` with ``EXAMPLE_SHORT_ARGS`` in the
   same 2 processes; rank 0 writes ``OUT_DIR/example/summary.json``.

One launch for all three, because starting 2 processes that import torch, transformers and TRL costs more than either
run. The checks are in test_trl_distributed.py and test_trl_example.py.
"""

import importlib.util
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

torch.set_num_threads(1)

from oblr.models import load_model_and_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.integrations.trl_helpers import EXAMPLE_SHORT_ARGS, GradSnapshot, KeepRounds, make_trainer  # noqa: E402

ROUND_FIELDS = ("input_ids", "attention_mask", "response_mask", "rewards", "seq_scale")


# The first config of the process creates the process group: a collective that waits 5 minutes then fails with
# its traceback, before the test's launch timeout.
DDP_TIMEOUT = 300


def split_group_refusal(out_dir: str) -> str:
    """The message for a per-process batch (2 rows) that would split a group of 4 across the 2 processes."""
    from oblr.integrations.trl import OBLRGRPOConfig

    try:
        OBLRGRPOConfig(output_dir=out_dir, per_device_train_batch_size=2, num_generations=4, use_cpu=True,
                       ddp_backend="gloo", ddp_timeout=DDP_TIMEOUT, report_to=[])
    except ValueError as e:
        return str(e)
    return "accepted"


def exactness_run(model_dir: str, out_dir: str) -> None:
    refused = split_group_refusal(out_dir)
    model, tok = load_model_and_tokenizer(model_dir)
    trainer = make_trainer(model, tok, Path(out_dir) / "trainer", per_device_train_batch_size=8, max_steps=1,
                           ddp_backend="gloo", ddp_timeout=DDP_TIMEOUT, temperature=0.9, oblr_snr_ema=0.5)
    keep = KeepRounds(trainer)
    snap = GradSnapshot(lambda: trainer.model)
    trainer.add_callback(snap)
    trainer.train()
    rounds = [{k: getattr(batch, k).detach().clone() for k in ROUND_FIELDS} for batch, _ in keep.rounds]
    rank = trainer.accelerator.process_index
    torch.save({"rounds": rounds, "grads": snap.grads, "logs": trainer.state.log_history,
                "world": trainer.accelerator.num_processes, "refused": refused}, Path(out_dir) / f"rank{rank}.pt")


class _AfterFirstStep(TrainerCallback):
    """A copy of the weights after the first optimizer step."""

    def __init__(self, model_fn):
        self.model_fn, self.weights = model_fn, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.weights = {k: v.detach().clone() for k, v in self.model_fn().state_dict().items()}


def kl_run(model_dir: str, out_dir: str) -> None:
    model, tok = load_model_and_tokenizer(model_dir)
    trainer = make_trainer(model, tok, Path(out_dir) / "kl_trainer", per_device_train_batch_size=8, max_steps=2,
                           ddp_backend="gloo", ddp_timeout=DDP_TIMEOUT, learning_rate=0.05, oblr_lr_schedule="kl")
    keep = KeepRounds(trainer)
    after = _AfterFirstStep(lambda: trainer.model)
    trainer.add_callback(after)
    trainer.train()
    batch = keep.rounds[0][0]
    torch.save({"round": {k: getattr(batch, k).detach().clone() for k in ROUND_FIELDS}, "after": after.weights,
                "logs": trainer.state.log_history, "target": trainer.lr_scheduler.controller.target},
               Path(out_dir) / f"kl_rank{trainer.accelerator.process_index}.pt")


def example_run(model_dir: str, out_dir: str) -> None:
    spec = importlib.util.spec_from_file_location("trl_grpo_oblr", ROOT / "examples" / "trl_grpo_oblr.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(["--model", model_dir, "--output-dir", str(Path(out_dir) / "example"), *EXAMPLE_SHORT_ARGS])


if __name__ == "__main__":
    exactness_run(sys.argv[1], sys.argv[2])
    kl_run(sys.argv[1], sys.argv[2])
    example_run(sys.argv[1], sys.argv[2])
