"""Run folders: create a new one or resume one, and the one config comparison used for resuming.

A run folder holds ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``plots/``, ``samples/`` and
``checkpoints/`` (see README). :func:`resolve_run_dir` picks the folder of a training run, refuses a
non-empty folder that is not a run folder, refuses to overwrite one that already holds a run (``--resume``
continues it instead, and only with a config that differs in :data:`RESUMABLE_CHANGES` at most), and refuses
``--resume`` where there is nothing to resume (``--resume-or-start`` starts from step 0 there). :func:`config_diff` compares a saved ``config.yaml`` with a
config; the experiment grid uses it too (:func:`oblr.experiments.grid.decide`).

A run folder belongs to one process at a time: :func:`lock_run_dir` takes an OS lock (``flock``) on
``.oblr.lock`` inside it for the whole run; the kernel releases it when the process ends, however it ends,
so a killed run never leaves a stale lock (:func:`oblr.checks.check_writable` checks it is writable first).
:func:`prepare_run_dir` is what the process holding the lock does first; :func:`resume_point` picks the
checkpoint a resumed run starts from.
"""

from __future__ import annotations

import errno
import fcntl
import os
from datetime import datetime
from pathlib import Path

from oblr.checks import check_writable
from oblr.config import Config, ConfigError, config_from_dict, read_config_file, save_config
from oblr.train.checkpoint import checkpoint_step, latest_checkpoint, remove_orphans
from oblr.train.errors import TrainingError

LOCK_FILE = ".oblr.lock"

# config keys that may differ between a run and its resumption (everything else must match)
RESUMABLE_CHANGES = frozenset({"train.steps", "train.eval_every", "train.save_every", "train.keep_checkpoints",
                               "train.plots", "train.tensorboard", "train.wandb", "train.threads", "model.device",
                               "train.output_dir"})


def flatten(d: dict, prefix: str = "") -> dict:
    """Nested config dict -> ``{"section.key": value}`` (dict-valued leaves such as options kept whole)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and not prefix:
            out.update(flatten(v, f"{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(saved_yaml: Path, cfg: Config) -> dict[str, tuple] | None:
    """``{key: (saved value, value in cfg)}`` for every key that differs between the config saved in
    ``saved_yaml`` and ``cfg`` (keys a saved config lacks take their defaults); None when the file cannot be
    read as a config."""
    try:
        saved = flatten(config_from_dict(read_config_file(saved_yaml)).to_dict())
    except (ConfigError, OSError):
        return None
    now = flatten(cfg.to_dict())
    return {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}


def default_run_dir(cfg: Config) -> Path:
    """``runs/<time>-<baseline>-<schedule>``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.algorithm.baseline}-{cfg.algorithm.lr_schedule}"


def lock_run_dir(run_dir: Path):
    """Take the run folder's lock (creating the folder); returns the open lock file -- keep it open for the
    run, closing it releases the lock. Raises :class:`ConfigError` naming the folder and the owner's pid
    when another process holds it."""
    check_writable(run_dir, "run folder")
    fh = open(Path(run_dir) / LOCK_FILE, "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        fh.seek(0)
        owner = fh.read().strip() or "unknown"
        fh.close()
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise ConfigError(f"run folder {run_dir} is in use by another oblr process (pid {owner}); "
                              f"wait for it to finish or choose another --output-dir") from None
        raise
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def holds_run(run_dir: Path) -> bool:
    """A checkpoint, or a non-empty metrics file (a run that logged before it could save)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    return latest_checkpoint(run_dir) is not None or (metrics.is_file() and metrics.stat().st_size > 0)


#: what an oblr run writes into its folder (a folder holding only these is a run folder, or the remains of one)
RUN_FILES = frozenset({"config.yaml", "code.json", "metrics.jsonl", "metrics.jsonl.restarted", "metrics.jsonl.damaged",
                       "metrics.jsonl.tmp", "summary.json", "plots", "samples", "checkpoints", "tensorboard", "wandb",
                       "wandb_run_id", "grid_error.txt", LOCK_FILE})


def foreign_files(run_dir: Path) -> list[str]:
    """Names in ``run_dir`` that no oblr run writes (empty for an empty folder or a run folder); a folder with
    a readable run ``config.yaml`` is a run folder whatever else it holds."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    names = sorted(p.name for p in run_dir.iterdir())
    if "config.yaml" in names and config_diff(run_dir / "config.yaml", Config()) is not None:
        return []
    return [n for n in names if n not in RUN_FILES and not n.startswith(".oblr-write-test-")]


def resolve_run_dir(cfg: Config, *, resume: bool, or_start: bool = False) -> Path:
    """The run folder of ``cfg`` (``train.output_dir`` or :func:`default_run_dir`), checked. Nothing is written.

    - a folder that is not empty and not a run folder (:func:`foreign_files`) is never used;
    - without ``resume`` it must not hold a run (:func:`holds_run`);
    - with ``resume`` it must hold a checkpoint, unless ``or_start`` (``--resume-or-start``: with nothing to
      resume the run starts from step 0, for schedulers that requeue a job); with a checkpoint its config may
      differ from ``cfg`` only in :data:`RESUMABLE_CHANGES`.

    Raises :class:`ConfigError` (one line)."""
    run_dir = Path(cfg.train.output_dir) if cfg.train.output_dir else default_run_dir(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} is a file, not a folder")
    foreign = foreign_files(run_dir)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise ConfigError(f"output folder {run_dir} is not empty and is not an oblr run folder (it holds {shown}); "
                          f"oblr writes only into a new or empty folder or a run folder: choose another --output-dir")
    has_ckpt = latest_checkpoint(run_dir) is not None
    if resume and not or_start:
        if not run_dir.is_dir():
            raise ConfigError(f"--resume: run folder {run_dir} does not exist (nothing to resume; leave out --resume "
                              f"to start a run there, or pass --resume-or-start)")
        if not has_ckpt:
            raise ConfigError(f"--resume: run folder {run_dir} holds no checkpoint, so there is nothing to resume; "
                              f"leave out --resume to start a new run (or --resume-or-start to start from step 0 "
                              f"whenever there is nothing to resume)")
    if not resume and holds_run(run_dir):
        what = "a run" if has_ckpt else "the metrics of a run that saved no checkpoint"
        raise ConfigError(f"run folder {run_dir} already holds {what}; pass --resume to continue it "
                          f"or choose another --output-dir (nothing was overwritten)")
    saved = run_dir / "config.yaml"
    if resume and has_ckpt and saved.is_file():
        diff = config_diff(saved, cfg)
        if diff is None:
            raise ConfigError(f"cannot resume: {saved} cannot be read as an oblr config")
        changed = {k: v for k, v in diff.items() if k not in RESUMABLE_CHANGES}
        if changed:
            raise ConfigError("cannot resume with a different configuration; changed keys: "
                              + ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in changed.items()))
    return run_dir


def prepare_run_dir(cfg: Config, run_dir: Path, *, resume: bool, or_start: bool, warn) -> None:
    """What the process that holds ``run_dir``'s lock does first: check the folder again (now that no other
    run can take it) and remove unfinished checkpoint folders a crash left (``warn`` says which)."""
    if cfg.train.output_dir:
        resolve_run_dir(cfg, resume=resume, or_start=or_start)
    removed = remove_orphans(run_dir)
    if removed:
        warn(f"removed {len(removed)} unfinished checkpoint folder(s) left by a crash: {', '.join(removed)}")


def record_run(run_dir: Path, cfg: Config, start_step: int, *, config: bool, start_model: dict | None = None) -> None:
    """Write the run's ``config.yaml`` (with ``config``: a run that starts, not one resumed) and which code makes
    this segment of the run (:data:`oblr.provenance.CODE_FILE`, from ``start_step``), with the start model's
    ``{"name_or_path", "fingerprint"}`` when it starts."""
    from oblr.provenance import CODE_FILE, code_record
    from oblr.train.checkpoint import write_text_atomic

    if config:
        save_config(cfg, run_dir / "config.yaml")
    write_text_atomic(run_dir / CODE_FILE, code_record(run_dir, start_step, start_model))


def start_over(run_dir: Path, *, or_start: bool, main: bool) -> None:
    """``--resume`` found no intact checkpoint: refused, or with ``--resume-or-start`` the rows of the attempt
    that saved nothing are kept aside (``metrics.jsonl.restarted``) and the run starts from step 0."""
    if not or_start:
        raise ConfigError(f"--resume: no intact checkpoint in {run_dir} (see the warnings above), so "
                          f"there is nothing to resume; --resume-or-start would start from step 0")
    metrics = run_dir / "metrics.jsonl"
    if main and metrics.is_file():
        metrics.replace(run_dir / "metrics.jsonl.restarted")


def resume_point(run_dir: Path, warn) -> Path | None:
    """The checkpoint to resume from (rank 0). A damaged last record of metrics.jsonl (a crash or a full
    disk mid-write) is kept aside in ``metrics.jsonl.damaged`` and reported; when its step is at or before
    the newest checkpoint, the run resumes from an earlier checkpoint so that the step is re-run and its
    record rebuilt, or, with none, it is refused (the record could not be rebuilt)."""
    from oblr.tracking.metrics import METRICS_FILE, set_aside_damaged_tail

    damaged = set_aside_damaged_tail(run_dir / METRICS_FILE)
    path = latest_checkpoint(run_dir, deep=True, warn=warn)
    if damaged is None:
        return path
    step, text = damaged
    where = run_dir / (METRICS_FILE + ".damaged")
    if path is None or step is None or step > checkpoint_step(path):
        warn(f"warning: the last record of {run_dir / METRICS_FILE} was damaged (step "
             f"{'?' if step is None else step}, {len(text)} bytes); kept aside in {where}; that step is "
             f"re-run from the checkpoint")
        return path
    earlier = latest_checkpoint(run_dir, deep=True, warn=warn, before=step)
    if earlier is None:
        raise TrainingError(f"the record of step {step} in {run_dir / METRICS_FILE} is damaged (kept "
                            f"aside in {where}) and no checkpoint before step {step} exists to re-run it; "
                            f"resuming would leave metrics.jsonl without that step")
    warn(f"warning: the record of step {step} in {run_dir / METRICS_FILE} was damaged; kept aside in "
         f"{where}; resuming from {earlier} so that step {step} is re-run and its record rebuilt")
    return earlier
