"""Run by test_trl_distributed.py under ``torchrun --nproc_per_node 2`` (gloo, CPU, one thread per process).

Trains an OBLRGRPOTrainer for ``steps`` optimizer steps on the model at argv[1] and writes, per rank, to
``argv[2]/rank{r}.pt``: the local rows of every generation batch, the synchronised gradient before each
optimizer step and TRL's log history (with the ``oblr/`` metrics).
"""

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from oblr.models import load_model_and_tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.integrations.trl_helpers import GradSnapshot, make_trainer  # noqa: E402


class _KeepRounds:
    """Wraps ``_generate_and_score_completions`` to keep every round's local inputs (a copy)."""

    def __init__(self, trainer):
        self.rounds, self._orig = [], trainer._generate_and_score_completions
        trainer._generate_and_score_completions = self
        self.trainer = trainer

    def __call__(self, inputs):
        out = self._orig(inputs)
        b = self.trainer.oblr_last_round[0]
        self.rounds.append({k: getattr(b, k).detach().clone() for k in
                            ("input_ids", "attention_mask", "response_mask", "rewards", "seq_scale")})
        return out


def split_group_refusal(out_dir: str) -> str:
    """The message for a per-process batch (2 rows) that would split a group of 4 across the 2 processes."""
    from oblr.integrations.trl import OBLRGRPOConfig

    try:
        OBLRGRPOConfig(output_dir=out_dir, per_device_train_batch_size=2, num_generations=4, use_cpu=True,
                       ddp_backend="gloo", report_to=[])
    except ValueError as e:
        return str(e)
    return "accepted"


def main(model_dir: str, out_dir: str, steps: int) -> None:
    refused = split_group_refusal(out_dir)
    model, tok = load_model_and_tokenizer(model_dir)
    trainer = make_trainer(model, tok, Path(out_dir) / "trainer", per_device_train_batch_size=8, max_steps=steps,
                           ddp_backend="gloo", temperature=0.9, oblr_snr_ema=0.5)
    keep = _KeepRounds(trainer)
    snap = GradSnapshot(lambda: trainer.model)
    trainer.add_callback(snap)
    trainer.train()
    rank = trainer.accelerator.process_index
    torch.save({"rounds": keep.rounds, "grads": snap.grads, "logs": trainer.state.log_history,
                "world": trainer.accelerator.num_processes,
                "refused": refused}, Path(out_dir) / f"rank{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
