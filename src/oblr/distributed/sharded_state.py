"""The training state of an FSDP2 model on disk: torch.distributed.checkpoint (DCP), and the consolidated weights.

:func:`save_sharded` (every rank): the model's and the optimizer's state as the ranks hold them -- each rank
writes its own shards into one folder, rank 0 the metadata -- with no rank ever holding the full state.
:func:`load_sharded` (every rank) reads it back into a sharded model and its optimizer, resharded for the
current layout if it differs. :func:`full_model_state` gathers the full parameters to rank 0's CPU for the
Hugging Face checkpoint written at the end of a run; :func:`load_sharded_weights` reads the model part of
a sharded folder into an ordinary (unsharded) model in one process, without a process group.

The run folder's atomic write, manifest and pruning stay in :mod:`oblr.train.checkpoint`; this module only
fills a folder it is given.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from .env import rank

SHARDED_DIR = "sharded"  # the DCP folder inside a checkpoint


def save_sharded(folder: str | Path, model: nn.Module, optimizer) -> None:
    """Every rank: write this rank's shards of the model and optimizer state into ``folder`` (collective)."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(folder))


def load_sharded(folder: str | Path, model: nn.Module, optimizer) -> None:
    """Every rank: load the state :func:`save_sharded` wrote into the (sharded) model and its optimizer."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def full_model_state(model: nn.Module) -> dict | None:
    """Every rank (collective): the full model state dict, on rank 0's CPU; None on the other ranks."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return state if rank() == 0 else None


def load_sharded_weights(folder: str | Path, model: nn.Module) -> None:
    """One process, no process group: the model weights of a sharded folder into an ordinary ``model``."""
    state = model.state_dict()
    with warnings.catch_warnings():  # "torch.distributed is ... uninitialized, assuming ... a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": state}, checkpoint_id=str(folder), no_dist=True)
    model.load_state_dict(state)
