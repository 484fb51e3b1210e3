"""Launching ``oblr train``: one process, or K processes on this machine under torchrun (``--nproc K``).

The one home of launching. ``oblr train --nproc K`` checks the config and the layout here
(:func:`torchrun_command`), then replaces itself by ``python -m torch.distributed.run --standalone
--nproc_per_node K -m oblr.cli train ...`` (:func:`exec_torchrun`); a process started by any launcher that
sets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: torchrun
itself, multi-node torchrun with a c10d rendezvous, or a Slurm or Ray job that sets them) runs ``oblr train``
as one rank; :func:`strategy_under_torchrun` makes ``ddp`` the default when there are several, and
:mod:`oblr.train.ranks` initialises the process group. A Slurm or Ray launcher sits beside
:func:`torchrun_command`: it starts the processes with those variables set. No torch import here.
"""

from __future__ import annotations

import os
import sys

# the most processes --nproc starts on one machine (torchrun --standalone is single-node)
MAX_NPROC = 1024


def saved_config(args) -> str | None:
    """With ``--resume`` and no ``--config``: the run folder's own config.yaml (overrides apply on top)."""
    from pathlib import Path

    if not (args.resume or args.resume_or_start) or args.config:
        return None
    out = args.output_dir
    for o in args.overrides:
        if o.startswith("train.output_dir="):
            out = o.split("=", 1)[1]
    saved = Path(out) / "config.yaml" if out else None
    return str(saved) if saved is not None and saved.is_file() else None


def torchrun_world_size() -> int:
    """WORLD_SIZE of a torchrun launch (1 without one); the launch's own variables, no torch import."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return 1
    try:
        return int(os.environ["WORLD_SIZE"])
    except ValueError:
        return 1  # check_distributed reports a malformed launch


def nproc_warning(k: int, cores: int | None = None) -> str | None:
    """The warning of ``--nproc K`` with more processes than this machine has CPU cores (like
    ``train.threads``): they compete for the cores, so the run is slower than with fewer."""
    cores = (os.cpu_count() or 1) if cores is None else cores
    if k <= cores:
        return None
    return f"[oblr] --nproc {k} exceeds this machine's {cores} CPU cores; processes will compete for them"


def torchrun_command(args, overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(command, overrides)`` of ``oblr train --nproc K``: torchrun on this machine running ``oblr.cli train``
    with the same arguments (``distributed.strategy=ddp`` added when the config says none and K > 1). The
    config and the layout are checked here first, so a bad setup fails before any process starts."""
    from oblr.config import ConfigError, load_config
    from oblr.distributed import launched
    from oblr.train.ranks import check_distributed

    k = args.nproc
    if not 1 <= k <= MAX_NPROC:
        raise ConfigError(f"--nproc must be in [1, {MAX_NPROC}] (processes on this machine, one per device), got {k}")
    if launched():
        raise ConfigError("--nproc starts torchrun itself, but this process was already started by a distributed "
                          "launch (RANK/WORLD_SIZE are set); leave --nproc out under torchrun")
    config = args.config or saved_config(args)
    if k > 1 and load_config(config, overrides).distributed.strategy == "none":
        overrides = [*overrides, "distributed.strategy=ddp"]
    cfg = load_config(config, overrides)
    check_distributed(cfg, {"WORLD_SIZE": str(k), "RANK": "0"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(k),
           "-m", "oblr.cli", "train", *overrides]
    if args.config:
        cmd += ["--config", args.config]
    for module in args.plugin:
        cmd += ["--plugin", module]
    cmd += [flag for flag, on in (("--resume", args.resume), ("--resume-or-start", args.resume_or_start),
                                  ("--quiet", args.quiet)) if on]
    return cmd, overrides


def exec_torchrun(args, overrides: list[str]) -> int:
    """Replace this process by torchrun (signals and the exit status are torchrun's own)."""
    cmd, _ = torchrun_command(args, overrides)
    warning = nproc_warning(args.nproc)
    if warning:
        print(warning, file=sys.stderr)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per process (torchrun's own default, said quietly)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, cmd, env)
    return 1  # pragma: no cover -- execve does not return


def strategy_under_torchrun(cfg, reload):
    """``cfg``, or under a torchrun launch of more than one process with ``distributed.strategy`` none,
    ``reload(["distributed.strategy=ddp"])`` (said once, on rank 0)."""
    k = torchrun_world_size()
    if k <= 1 or cfg.distributed.strategy != "none":
        return cfg
    if os.environ.get("RANK") == "0":
        print(f"[oblr] torchrun started {k} processes: distributed.strategy none becomes ddp", file=sys.stderr,
              flush=True)
    return reload(["distributed.strategy=ddp"])
