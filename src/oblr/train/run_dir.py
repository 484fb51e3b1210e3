"""Run folders: create a new one or resume one, and the one config comparison used for resuming.

A run folder holds ``config.yaml``, ``metrics.jsonl``, ``summary.json``, ``plots/``, ``samples/`` and
``checkpoints/`` (see README). :func:`resolve_run_dir` picks the folder of a training run and refuses to
overwrite one that already holds a run (``--resume`` continues it instead, and only with a config that
differs in :data:`RESUMABLE_CHANGES` at most). :func:`config_diff` compares a saved ``config.yaml`` with a
config; the experiment grid uses it too (:func:`oblr.experiments.grid.decide`).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import yaml

from oblr.config import Config, ConfigError, config_from_dict
from oblr.train.checkpoint import latest_checkpoint

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
        saved = flatten(config_from_dict(yaml.safe_load(Path(saved_yaml).read_text())).to_dict())
    except (ConfigError, yaml.YAMLError, OSError, AttributeError):
        return None
    now = flatten(cfg.to_dict())
    return {k: (saved.get(k), now.get(k)) for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)}


def default_run_dir(cfg: Config) -> Path:
    """``runs/<time>-<baseline>-<schedule>``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.algorithm.baseline}-{cfg.algorithm.lr_schedule}"


def resolve_run_dir(cfg: Config, *, resume: bool) -> Path:
    """The run folder of ``cfg`` (``train.output_dir`` or :func:`default_run_dir`), checked: without
    ``resume`` it must not hold a run; with ``resume`` it must hold a checkpoint and a config that differs
    from ``cfg`` only in :data:`RESUMABLE_CHANGES`. Raises :class:`ConfigError`; nothing is written."""
    run_dir = Path(cfg.train.output_dir) if cfg.train.output_dir else default_run_dir(cfg)
    has_ckpt = latest_checkpoint(run_dir) is not None
    if resume and not has_ckpt:
        raise ConfigError(f"--resume: no checkpoint to resume in {run_dir}")
    if not resume and (has_ckpt or (run_dir / "metrics.jsonl").exists()):
        raise ConfigError(f"run folder {run_dir} already holds a run; pass --resume to continue it "
                          f"or choose another --output-dir (nothing was overwritten)")
    saved = run_dir / "config.yaml"
    if resume and saved.is_file():
        diff = config_diff(saved, cfg)
        if diff is None:
            raise ConfigError(f"cannot resume: {saved} cannot be read as an oblr config")
        changed = {k: v for k, v in diff.items() if k not in RESUMABLE_CHANGES}
        if changed:
            raise ConfigError("cannot resume with a different configuration; changed keys: "
                              + ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in changed.items()))
    return run_dir
