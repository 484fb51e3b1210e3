"""Run folders: create a new one or resume one, and the one config comparison used for resuming.

A run folder holds ``config.yaml``, ``code.json``, ``metrics.jsonl``, ``summary.json``, ``plots/``,
``samples/`` and ``checkpoints/`` (see README). It is recognised by what only oblr writes
(:func:`is_run_folder`: its ``code.json`` record), never by names other programs use too (``config.yaml``,
``metrics.jsonl``, ``checkpoints/``). :func:`resolve_run_dir` picks the folder of a training run, refuses a
folder another process holds, a non-empty folder that is not a run folder, a folder that already holds a
run without ``--resume`` (``--resume`` continues it, and only with a config that differs in
:data:`RESUMABLE_CHANGES` at most), and ``--resume`` where there is nothing to resume (``--resume-or-start``
starts from step 0 there); each refusal is one line that says what to do next and never sends the user to
an option that refuses too. :func:`config_diff` compares a saved ``config.yaml`` with a config; the
experiment grid uses it too (:func:`oblr.experiments.grid.decide`).

A run folder belongs to one process at a time: :func:`lock_run_dir` takes an OS lock
(:func:`oblr.file_lock.try_lock`) on ``.oblr.lock`` inside it for the whole run; the kernel releases it when
the process ends, however it ends, so a killed run never leaves a stale lock (:func:`oblr.checks.check_writable`
checks it is writable first).
:func:`prepare_run_dir` is what the process holding the lock does first; :func:`resume_point` picks the
checkpoint a resumed run starts from; :func:`start_over` starts a run again from step 0 when there is none
(every damaged checkpoint moved aside first, so the new run's own checkpoints are never pruned in their
favour).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from oblr.checks import check_writable
from oblr.config import Config, ConfigError, config_from_dict, read_config_file, save_config
from oblr.file_lock import holder, try_lock
from oblr.train.checkpoint import (
    STATE_FILE,
    all_damaged_line,
    checkpoint_folders,
    checkpoint_problems,
    checkpoint_step,
    latest_checkpoint,
    remove_orphans,
    set_aside_checkpoints,
)
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


def in_use_error(run_dir: Path, owner: str, *, resume: bool) -> ConfigError:
    """The refusal of a folder whose lock process ``owner`` holds: names the pid and the next step (a new
    run: another folder; a resumption: the same command once that process has ended)."""
    then = (f"wait for pid {owner} to end, then run this command again" if resume else
            f"choose another --output-dir for a new run (this folder belongs to pid {owner}'s run)")
    return ConfigError(f"run folder {run_dir} is in use by another oblr process (pid {owner}); {then}")


def lock_holder(run_dir: Path) -> str | None:
    """The pid (as written in ``.oblr.lock``; "unknown" before it is written) of another process holding
    ``run_dir``'s lock, or None when none does. Creates nothing; a lock held by this process through
    another open file counts as held (so the process holding it does not ask)."""
    return holder(Path(run_dir) / LOCK_FILE)


def lock_run_dir(run_dir: Path, *, resume: bool = False):
    """Take the run folder's lock (creating the folder); returns the open lock file -- keep it open for the
    run, closing it releases the lock. Raises :class:`ConfigError` naming the folder, the owner's pid and
    what to do (:func:`in_use_error`; ``resume``: the run resumes) when another process holds it."""
    check_writable(run_dir, "run folder")
    fh = try_lock(Path(run_dir) / LOCK_FILE)
    if fh is None:
        raise in_use_error(run_dir, lock_holder(run_dir) or "unknown", resume=resume) from None
    return fh


def holds_run(run_dir: Path) -> bool:
    """A checkpoint folder (intact or not), or a non-empty metrics file (a run that logged before it could
    save)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    return bool(checkpoint_folders(run_dir)) or (metrics.is_file() and metrics.stat().st_size > 0)


#: what oblr writes into a run folder before its ``code.json`` (a folder holding only these is the remains of a
#: run that stopped while starting, e.g. a model that failed to load, and is used as an empty folder)
STARTING_FILES = frozenset({LOCK_FILE, "grid_error.txt"})


def is_run_folder(run_dir: Path) -> bool:
    """Whether an oblr run made ``run_dir``: its ``code.json`` is an oblr code record (every run writes one
    beside its ``config.yaml`` when it starts, :func:`record_run`), or, for a folder made before runs
    recorded their code, its ``config.yaml`` reads as an oblr config and ``checkpoints/LATEST`` names a
    checkpoint holding oblr's trainer state. A ``config.yaml``, ``metrics.jsonl`` or ``checkpoints/`` alone
    is not enough: other programs write those names too."""
    from oblr.provenance import read_code_file

    run_dir = Path(run_dir)
    if read_code_file(run_dir) is not None:
        return True
    latest = run_dir / "checkpoints" / "LATEST"
    try:
        named = latest.read_text().strip() if latest.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return False
    return (checkpoint_step(Path(named)) >= 0 and (run_dir / "checkpoints" / named / STATE_FILE).is_file()
            and config_diff(run_dir / "config.yaml", Config()) is not None)


def foreign_files(run_dir: Path) -> list[str]:
    """The names in ``run_dir`` that make it a folder oblr must not write into: empty for a missing or empty
    folder, a run folder (:func:`is_run_folder`) whatever else it holds, or a folder holding only
    :data:`STARTING_FILES`; otherwise every name in it but those."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    names = sorted(p.name for p in run_dir.iterdir()
                   if p.name not in STARTING_FILES and not p.name.startswith(".oblr-write-test-"))
    if not names or is_run_folder(run_dir):
        return []
    return names


def _checkpoints_line(run_dir: Path) -> tuple[Path | None, str]:
    """The newest intact checkpoint (sizes checked) and a phrase for the refusals: "checkpoint step_N" or
    "N checkpoints, all damaged (...)" or "no checkpoint"."""
    problems = checkpoint_problems(run_dir)
    good = latest_checkpoint(run_dir)
    if good is not None:
        return good, f"checkpoint {good.name}"
    return None, (all_damaged_line(problems) if problems else "no checkpoint")


def resolve_run_dir(cfg: Config, *, resume: bool, or_start: bool = False, check_lock: bool = True) -> Path:
    """The run folder of ``cfg`` (``train.output_dir`` or :func:`default_run_dir`), checked. Nothing is written.

    - a folder another process holds (:func:`lock_holder`; ``check_lock=False`` for the process holding it)
      is refused naming that process's pid, whatever the mode;
    - a folder that is not empty and not a run folder (:func:`foreign_files`) is never used;
    - without ``resume`` it must not hold a run (:func:`holds_run`);
    - with ``resume`` it must hold an intact checkpoint, unless ``or_start`` (``--resume-or-start``: with
      nothing to resume the run starts from step 0, for schedulers that requeue a job); with a checkpoint its
      config may differ from ``cfg`` only in :data:`RESUMABLE_CHANGES`.

    Each refusal names the one thing to do next, and that thing is never refused in turn: a folder that
    holds rows or checkpoints but nothing to resume is sent to ``--resume-or-start``, not to ``--resume``.
    Raises :class:`ConfigError` (one line)."""
    run_dir = Path(cfg.train.output_dir) if cfg.train.output_dir else default_run_dir(cfg)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run folder {run_dir} is a file, not a folder; choose another --output-dir")
    owner = lock_holder(run_dir) if check_lock else None
    if owner is not None:
        raise in_use_error(run_dir, owner, resume=resume)
    foreign = foreign_files(run_dir)
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise ConfigError(f"output folder {run_dir} is not empty and is not an oblr run folder (it holds {shown}, "
                          f"not written by an oblr run: an oblr run folder has its code.json); oblr never writes "
                          f"into it: choose another --output-dir")
    good, ckpts = _checkpoints_line(run_dir)
    restart = "--resume-or-start starts it again from step 0"
    if good is None and checkpoint_folders(run_dir):
        restart += " (the damaged checkpoints are moved aside)"
    elif good is None:
        restart += " (its rows are kept in metrics.jsonl.restarted)"
    if resume and not or_start:
        if not run_dir.is_dir():
            raise ConfigError(f"--resume: run folder {run_dir} does not exist, so there is nothing to resume; leave "
                              f"out --resume (or pass --resume-or-start) to start a run there")
        if good is None and holds_run(run_dir):
            has = "holds no checkpoint" if ckpts == "no checkpoint" else f"has {ckpts}"
            raise ConfigError(f"--resume: run folder {run_dir} {has}, so there is nothing to resume; {restart}")
        if good is None:
            raise ConfigError(f"--resume: run folder {run_dir} holds no checkpoint, so there is nothing to resume; "
                              f"leave out --resume (or pass --resume-or-start) to start a run there")
    if not resume and holds_run(run_dir):
        if good is not None:
            raise ConfigError(f"run folder {run_dir} already holds a run; pass --resume to continue it (from "
                              f"{ckpts}), or choose another --output-dir for a new run (nothing was overwritten)")
        what = ("the metrics of a run that saved no checkpoint" if ckpts == "no checkpoint"
                else f"a run with {ckpts}")
        raise ConfigError(f"run folder {run_dir} already holds {what}, so there is nothing to resume; {restart}, "
                          f"or choose another --output-dir for a new run (nothing was overwritten)")
    has_ckpt = good is not None
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
        resolve_run_dir(cfg, resume=resume, or_start=or_start, check_lock=False)
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


def start_over(run_dir: Path, *, or_start: bool, main: bool) -> str:
    """``--resume`` found no intact checkpoint (hashes checked): refused, or with ``--resume-or-start`` the run
    starts from step 0: the rows of the attempt are kept aside (``metrics.jsonl.restarted``) and every
    (damaged) checkpoint folder is moved into ``checkpoints/damaged-<time>/``, so that the new run's
    checkpoints are the only ones pruning and resuming see. Returns the line that says what happened."""
    problems = checkpoint_problems(run_dir, deep=True) if main else []  # rank 0 alone reads the folder
    found = all_damaged_line(problems) if problems else "no checkpoint"
    if not or_start:
        raise ConfigError(f"--resume: run folder {run_dir} has {found}, so there is nothing to resume; "
                          f"--resume-or-start starts it again from step 0"
                          + (" (the damaged checkpoints are moved aside)" if problems else ""))
    if not main:
        return ""
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        metrics.replace(run_dir / "metrics.jsonl.restarted")
    aside = set_aside_checkpoints(run_dir, datetime.now().strftime("%Y%m%d-%H%M%S"))
    if aside is not None:
        return f"warning: {run_dir} has {found}: moved aside into {aside}; starting from step 0 (--resume-or-start)"
    return f"no checkpoint in {run_dir}; starting from step 0 (--resume-or-start)"


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
