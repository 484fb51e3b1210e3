"""Process-group setup from torchrun's environment, and the rank-aware basics.

``torchrun --nproc_per_node K`` starts K processes and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` in each. :func:`init_distributed` reads them, picks the backend
(gloo for CPU, NCCL for CUDA), gives each rank one device (``cuda:LOCAL_RANK``, or the CPU), initialises
the default process group and returns a :class:`DistEnv`. Without a launch it returns the one-process
environment and initialises nothing, so the same program runs with and without torchrun.

A worker process that initialised a process group ends through :func:`exit_worker` (the CLI does this):
torch's functional collectives (DTensor's ``full_tensor``, FSDP2 gradient norms) keep the gloo backend and its
C++ threads alive after ``destroy_process_group``, and tearing them down at interpreter exit occasionally
aborts the process ("terminate called without an active exception", SIGABRT) although the run finished.

Bad setups are refused with one line (:class:`DistributedSetupError`) before anything expensive starts:
NCCL on a machine without CUDA, more local ranks than GPUs, a mode that needs a launch without one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


_initialised_here = False  # this process initialised a default process group (see exit_worker)


class DistributedSetupError(ValueError):
    """A distributed setup that cannot work, said in one line."""


@dataclass(frozen=True)
class DistEnv:
    """Where this process stands: its rank among ``world_size`` processes, its device and the backend."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None  # None: no process group (one process)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def launched(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process was started by torchrun (or anything that sets ``WORLD_SIZE`` and ``RANK``)."""
    env = os.environ if environ is None else environ
    return "WORLD_SIZE" in env and "RANK" in env


def require_launch(what: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse ``what`` (e.g. "parallel mode 'fsdp'") when this process was not started by torchrun."""
    if not launched(environ):
        raise DistributedSetupError(f"{what} needs a distributed launch (torchrun --nproc_per_node K ...), "
                                    "but WORLD_SIZE/RANK are not set in this process")


def resolve_backend(backend: str, device: str = "auto") -> str:
    """``auto`` -> nccl when the device is (or, for ``auto``, can be) CUDA, else gloo. NCCL without CUDA is refused."""
    if backend not in BACKENDS:
        raise DistributedSetupError(f"unknown distributed backend {backend!r}; known: {', '.join(BACKENDS)}")
    cuda = torch.cuda.is_available()
    if backend == "auto":
        wants_cuda = device.startswith("cuda") or (device == "auto" and cuda)
        return "nccl" if wants_cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise DistributedSetupError("distributed backend 'nccl' needs CUDA, but torch.cuda.is_available() is False "
                                    "on this machine; use backend 'gloo' (CPU) or run on GPUs")
    if backend == "nccl" and device == "cpu":
        raise DistributedSetupError("distributed backend 'nccl' cannot reduce CPU tensors; use backend 'gloo' "
                                    "with device 'cpu'")
    return backend


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """One device per rank: ``auto``/``cuda`` -> ``cuda:LOCAL_RANK`` (``auto`` without CUDA -> cpu). A device
    this machine does not have (CUDA, a CUDA index, MPS) or a malformed name raises
    :class:`DistributedSetupError` (one line) -- before any model loads."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device = f"cuda:{local_rank}"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise DistributedSetupError(f"device {device!r} is not auto, cpu, cuda, cuda:N or mps") from None
    if dev.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DistributedSetupError(f"device {device!r} asked for, but this machine has no MPS (Apple GPU) device")
    if dev.type == "cuda":
        n = torch.cuda.device_count()
        if n == 0:
            raise DistributedSetupError(f"device {device!r} asked for, but this machine has no CUDA device")
        if dev.index is not None and dev.index >= n:
            raise DistributedSetupError(f"local rank {local_rank} needs device cuda:{dev.index}, but this machine "
                                        f"has {n} CUDA device(s); start at most {n} processes per node")
    return dev


def _env_int(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        raise DistributedSetupError(f"environment variable {name}={env.get(name)!r} is not an integer; "
                                    "launch with torchrun") from None


def init_distributed(backend: str = "auto", device: str = "auto", *, timeout_s: float = 600.0,
                     environ: Mapping[str, str] | None = None) -> DistEnv:
    """Initialise the default process group from torchrun's environment; the one-process env without a launch.

    ``timeout_s``: how long a collective may wait for the other ranks before it raises (a rank that died
    makes the others fail after this long instead of hanging forever).
    """
    global _initialised_here
    env = os.environ if environ is None else environ
    if not launched(env):
        if backend == "nccl":
            resolve_backend(backend, device)  # the same refusal with or without a launch
        return DistEnv(device=resolve_device(device, 0))
    rank, world, local = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE"), _env_int(env, "LOCAL_RANK")
    chosen = resolve_backend(backend, device)
    dev = resolve_device("cuda" if chosen == "nccl" and device == "auto" else device, local)
    if chosen == "nccl" and dev.type != "cuda":
        raise DistributedSetupError(f"distributed backend 'nccl' needs a CUDA device, got device {device!r}")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(chosen, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s),
                                device_id=dev if dev.type == "cuda" else None)
        _initialised_here = True
    return DistEnv(rank=rank, world_size=world, local_rank=local, backend=chosen, device=dev)


def shutdown() -> None:
    """Destroy the default process group if there is one."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def initialised_here() -> bool:
    """True once :func:`init_distributed` has initialised a process group in this process."""
    return _initialised_here


def exit_worker(code: int) -> None:
    """End a distributed worker process with ``code`` without interpreter teardown: destroy the process
    group, run the ``atexit`` handlers, flush stdout/stderr, then ``os._exit``. Files are closed by then (the
    trainer closes its own); what is skipped is the destruction of C++ objects whose threads torch leaves
    running (the gloo backend after functional collectives), the source of rare SIGABRTs at exit."""
    import atexit
    import sys

    try:
        shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """True on rank 0 (and in a single process): the process that writes files and prints."""
    return rank() == 0
