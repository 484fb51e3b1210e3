"""Experiment grids: a base config, named variants and seeds -> one run folder per (variant, seed).

Grid file (YAML)::

    base: {model: {...}, rollout: {...}, ...}   # a train config mapping, or a path to one
    seeds: [0, 1, 2]
    out: runs/my-grid                           # optional default output folder
    report: {target: 0.5, reference: grpo}  # optional, passed to compare_runs (also accuracy_key, ...)
    runs:
      - name: oblr-snr                          # folder name and report label
        algorithm.baseline: oblr                # dotted overrides of the base (values are YAML values)
        algorithm.lr_schedule: snr

The config of run (v, k) is ``base``, then variant v's overrides, then ``train.seed = k``, then the
command-line overrides (which win, except that they may not set ``train.seed`` or ``train.output_dir``),
then ``train.output_dir = OUT/<v>/seed<k>``. Every config is validated before any run starts.

A run folder is *reused* when its ``summary.json`` says the run completed and its ``config.yaml`` matches (keys
in :data:`IGNORED_FOR_MATCH` aside), *resumed* when it has a checkpoint and a compatible config (an interrupted
or failed run, whose summary says so, included; or a finished run asked for more ``train.steps``), *started*
when empty (a partial run without any checkpoint is cleared first; one whose summary says it was interrupted or
failed is moved aside to ``seed<k>.interrupted`` / ``.failed``), and a *conflict* (never touched) when it holds
a run of another configuration or another process holds it (a run in progress: its ``.oblr.lock``; a second
``oblr compare`` on the same folder leaves it alone).

A folder made (or resumed) by other oblr code (another source hash, :mod:`oblr.provenance`; folders from before
runs recorded their code count as other code), or started from other weights of the same model name (another
start-model fingerprint: a built-in model rebuilt, e.g. on another machine; folders without the record and hub
models are not compared), is not reused or resumed silently: ``on_other_code`` says what happens --
``refuse`` (default: a conflict naming both codes), ``rerun`` (the folder is moved aside to
``seed<k>.other-code[-N]`` and the run starts afresh; nothing is deleted) or ``reuse`` (keep it as it is).
"""

from __future__ import annotations

import copy
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from oblr.config import Config, ConfigError, apply_overrides, config_from_dict, read_config_file
from oblr.provenance import same_code, same_start_model
from oblr.safe_load import InputError, load_yaml_file
from oblr.train.checkpoint import latest_checkpoint
from oblr.train.run_dir import RESUMABLE_CHANGES, config_diff, flatten, lock_holder
from oblr.train.summary import summary_status

GRID_KEYS = ("base", "runs", "seeds", "out", "report", "description")
REPORT_KEYS = ("target", "accuracy_key", "spike_factor", "spike_window", "reference")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")
# keys that do not change a run's numbers: a difference there does not prevent reuse
IGNORED_FOR_MATCH = frozenset({"train.output_dir", "train.threads", "train.plots", "train.tensorboard",
                               "train.wandb", "train.keep_checkpoints"})
GRID_FILE = "grid.yaml"  # written into the output folder: marks it as a grid and records what was asked
ON_OTHER_CODE = ("refuse", "rerun", "reuse")  # what `oblr compare` does with a run folder made by other code


@dataclass
class Variant:
    name: str
    overrides: dict[str, Any]  # dotted key -> value


@dataclass
class Grid:
    base: dict
    variants: list[Variant]
    seeds: list[int]
    out: str | None = None
    report: dict = field(default_factory=dict)
    description: str = ""
    source: str = "<dict>"


@dataclass
class PlannedRun:
    variant: str
    seed: int
    run_dir: Path
    cfg: Config
    action: str  # "reuse" | "resume" | "start" | "rerun" (other code: moved aside, then start) | "conflict"
    reason: str = ""

    @property
    def name(self) -> str:
        return f"{self.variant} seed={self.seed}"


def set_dotted(data: dict, key: str, value: Any, where: str) -> None:
    """``data["a"]["b"] = value`` for ``key = "a.b"``; a non-dotted mapping value is merged into that section."""
    parts = key.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"{where}: malformed key {key!r}")
    if len(parts) == 1:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: key {key!r} names a section; give a mapping or a dotted key "
                              f"such as '{key}.<name>'")
        for k, v in value.items():
            set_dotted(data, f"{key}.{k}", v, where)
        return
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: '{p}' in {key!r} is not a section")
    node[parts[-1]] = copy.deepcopy(value)


def _load_base(base: Any, grid_path: Path | None) -> tuple[dict, str]:
    if isinstance(base, dict):
        return copy.deepcopy(base), "inline"
    if not isinstance(base, str):
        raise ConfigError(f"grid {grid_path}: 'base' must be a config mapping or a path to a config file, "
                          f"got {type(base).__name__}")
    tried = [grid_path.parent / base] if grid_path is not None else []
    tried.append(Path(base))
    for p in tried:
        if p.is_file():
            return read_config_file(p), str(p)
    raise ConfigError(f"grid {grid_path}: base config {base!r} not found (tried {', '.join(map(str, tried))})")


def grid_from_dict(data: dict, source: str = "<dict>", grid_path: Path | None = None) -> Grid:
    """Check and normalise a grid mapping (see the module docstring). Raises ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"grid {source}: must be a mapping with keys {', '.join(GRID_KEYS)}")
    unknown = [k for k in data if k not in GRID_KEYS]
    if unknown:
        raise ConfigError(f"grid {source}: unknown key(s) {unknown}; known keys: {', '.join(GRID_KEYS)}")
    for k in ("base", "runs"):
        if k not in data:
            raise ConfigError(f"grid {source}: missing key '{k}'")
    base, _ = _load_base(data["base"], grid_path)
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds):
        raise ConfigError(f"grid {source}: 'seeds' must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"grid {source}: 'seeds' has duplicates: {seeds}")
    runs = data["runs"]
    if not isinstance(runs, list) or not runs:
        raise ConfigError(f"grid {source}: 'runs' must be a non-empty list of variants")
    variants: list[Variant] = []
    for i, r in enumerate(runs):
        where = f"grid {source}, runs[{i}]"
        if not isinstance(r, dict) or "name" not in r:
            raise ConfigError(f"{where}: each run is a mapping with a 'name' and dotted overrides, got {r!r}")
        name = r["name"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigError(f"{where}: name {name!r} must be a folder-safe word (letters, digits, . _ + = -)")
        if name in {v.name for v in variants}:
            raise ConfigError(f"{where}: duplicate run name {name!r}")
        variants.append(Variant(name, {k: v for k, v in r.items() if k != "name"}))
    report = data.get("report") or {}
    if not isinstance(report, dict) or any(k not in REPORT_KEYS for k in report):
        raise ConfigError(f"grid {source}: 'report' must be a mapping with keys among {', '.join(REPORT_KEYS)}")
    if "reference" in report and (not isinstance(report["reference"], str)
                                  or report["reference"] not in {v.name for v in variants}):
        raise ConfigError(f"grid {source}: report.reference {report['reference']!r} is not a run name of the grid "
                          f"({', '.join(v.name for v in variants)})")
    out = data.get("out")
    if out is not None and not isinstance(out, str):
        raise ConfigError(f"grid {source}: 'out' must be a folder path, got {out!r}")
    return Grid(base=base, variants=variants, seeds=list(seeds), out=out, report=dict(report),
                description=str(data.get("description", "")), source=source)


def load_grid(path: str | Path) -> Grid:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"grid file not found: {p}")
    try:
        data = load_yaml_file(p, what="grid file")
    except InputError as e:
        raise ConfigError(f"grid file {e}") from None
    return grid_from_dict(data, str(p), p)


def select(grid: Grid, only: list[str] | None = None, seeds: list[int] | None = None) -> Grid:
    """The part of ``grid`` to run: the variants named in ``only`` (in the grid's order) and the ``seeds`` given
    (any non-negative integers: more seeds than the file lists are allowed); None keeps the grid's. Run folders
    are the full grid's (``OUT/<variant>/seed<k>``), so a later run of the whole grid reuses them. An unknown
    name, an empty selection or a bad seed is refused in one line naming what the grid has."""
    variants = grid.variants
    if only is not None:
        names = [v.name for v in grid.variants]
        unknown = [n for n in only if n not in names]
        if unknown or not only:
            raise ConfigError(f"grid {grid.source}: --only {','.join(only) or '(empty)'}: "
                              f"{'no variant ' + ', '.join(map(repr, unknown)) if unknown else 'names no variant'}; "
                              f"the grid has: {', '.join(names)}")
        variants = [v for v in grid.variants if v.name in set(only)]
    if seeds is not None:
        if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds) \
                or len(set(seeds)) != len(seeds):
            raise ConfigError(f"grid {grid.source}: --seeds must be distinct non-negative integers, got {seeds}")
    return Grid(base=grid.base, variants=list(variants), seeds=list(grid.seeds if seeds is None else seeds),
                out=grid.out, report=grid.report, description=grid.description, source=grid.source)


def run_dir_of(out_dir: Path, variant: str, seed: int) -> Path:
    return Path(out_dir) / variant / f"seed{seed}"


def build_config(grid: Grid, variant: Variant, seed: int, out_dir: Path, overrides: list[str]) -> Config:
    """The validated config of run (variant, seed); errors name the variant."""
    for ov in overrides:
        key = ov.split("=", 1)[0].strip()
        if key in ("train.seed", "train.output_dir"):
            raise ConfigError(f"override {ov!r}: {key} is set by the grid (seeds list / output folder)")
    data = copy.deepcopy(grid.base)
    where = f"grid {grid.source}, run {variant.name!r}"
    for k, v in variant.overrides.items():
        set_dotted(data, k, v, where)
    set_dotted(data, "train.seed", seed, where)
    apply_overrides(data, list(overrides))
    set_dotted(data, "train.output_dir", str(run_dir_of(out_dir, variant.name, seed)), where)
    try:
        return config_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def start_fingerprint(cfg: Config) -> str | None:
    """The fingerprint (:func:`oblr.provenance.model_fingerprint`) of the weights a run of ``cfg`` would start
    from: a built-in model (built here if it is not yet), a prepared or local folder; None for a hub id or a
    prepared model that is not there (nothing local to compare)."""
    from oblr.models import resolve_model_path
    from oblr.models.prepare import PREPARABLE
    from oblr.models.task_builtins import builtin_for_task
    from oblr.provenance import model_fingerprint

    name = builtin_for_task(cfg.model.name_or_path, cfg.task.name)
    if not (name.startswith(("builtin", "prepared:")) or Path(name).exists() or name in PREPARABLE):
        return None
    try:
        return model_fingerprint(resolve_model_path(name, build=name.startswith("builtin")))
    except (FileNotFoundError, ValueError):
        return None


def decide(run_dir: Path, cfg: Config, on_other_code: str = "refuse",
           fingerprint: str | None = None) -> tuple[str, str]:
    """``(action, reason)`` for one run folder; see the module docstring. ``fingerprint``: the start model's
    now (:func:`start_fingerprint`; None: not compared)."""
    if on_other_code not in ON_OTHER_CODE:
        raise ConfigError(f"on_other_code must be one of {', '.join(ON_OTHER_CODE)}, got {on_other_code!r}")
    owner = lock_holder(run_dir)
    if owner is not None:  # a run in progress: neither cleared, moved aside nor resumed under it
        return "conflict", (f"{run_dir} is in use by process {owner} (a run in progress); wait for it to end, "
                            f"or use another --out")
    action, reason = _decide_config(run_dir, cfg)
    if action not in ("reuse", "resume"):
        return action, reason
    same, why = same_code(run_dir)
    if same:
        same, why = same_start_model(run_dir, fingerprint)
    if same or on_other_code == "reuse":
        return action, reason + ("" if same else f"; kept although {why}")
    if on_other_code == "rerun":
        return "rerun", f"{why}; moved aside to {aside_dir(run_dir).name}, started afresh"
    return "conflict", (f"{run_dir} was {why}; pass --on-other-code rerun to move it aside and train it again, "
                        f"or --on-other-code reuse to keep its numbers")


def aside_dir(run_dir: Path, tag: str = "other-code") -> Path:
    """The first free ``<run_dir>.<tag>[-N]`` beside ``run_dir``."""
    cand, k = run_dir.with_name(f"{run_dir.name}.{tag}"), 1
    while cand.exists():
        k += 1
        cand = run_dir.with_name(f"{run_dir.name}.{tag}-{k}")
    return cand


def move_aside(run_dir: Path, tag: str = "other-code") -> Path:
    """Rename ``run_dir`` to :func:`aside_dir` (nothing deleted); returns the new path."""
    dest = aside_dir(run_dir, tag)
    run_dir.rename(dest)
    return dest


def _decide_config(run_dir: Path, cfg: Config) -> tuple[str, str]:
    """``(action, reason)`` from the folder's files and config alone (code not considered)."""
    status = summary_status(run_dir)
    finished = status == "completed"  # an interrupted or failed run writes a summary too: not finished
    has_ckpt = latest_checkpoint(run_dir) is not None
    has_cfg = (run_dir / "config.yaml").is_file()
    if not (status or has_ckpt or has_cfg or (run_dir / "metrics.jsonl").exists()):
        return "start", ""
    diff = config_diff(run_dir / "config.yaml", cfg) if has_cfg else None
    if diff is not None:
        diff = [k for k in diff if k not in IGNORED_FOR_MATCH]
    if diff is None:
        return "conflict", f"{run_dir} holds files but no readable config.yaml; move it away or use another --out"
    hard = [k for k in diff if k not in RESUMABLE_CHANGES]
    if hard:
        return "conflict", (f"{run_dir} holds a run with another configuration (changed: {', '.join(hard)}); "
                            f"move it away or use another --out")
    saved_steps = flatten(read_config_file(run_dir / "config.yaml")).get("train.steps", Config().train.steps)
    if finished:
        if cfg.train.steps == saved_steps:
            return "reuse", ("finished" + (f" (differs only in {', '.join(diff)})" if diff else ""))
        if cfg.train.steps > saved_steps and has_ckpt:
            return "resume", f"finished at {saved_steps} steps; extending to {cfg.train.steps}"
        return "conflict", (f"{run_dir} finished with train.steps={saved_steps}, asked {cfg.train.steps}; "
                            f"move it away or use another --out")
    if has_ckpt:
        return "resume", ("checkpoint without summary" if status is None
                          else f"{status} run; resuming from its last checkpoint")
    if status is not None:
        return "start", f"{status} run without checkpoint (moved aside)"
    return "start", "partial run without checkpoint (cleared)"


def plan_grid(grid: Grid, out_dir: str | Path, overrides: list[str] = (),
              on_other_code: str = "refuse") -> list[PlannedRun]:
    """One :class:`PlannedRun` per (variant, seed), variant-major; all configs validated first."""
    out_dir = Path(out_dir)
    configs = [(v, s, build_config(grid, v, s, out_dir, list(overrides))) for v in grid.variants for s in grid.seeds]
    plan, prints = [], {}
    for v, s, cfg in configs:
        rd = run_dir_of(out_dir, v.name, s)
        key = (cfg.model.name_or_path, cfg.task.name)
        if key not in prints and ((rd / "summary.json").is_file() or latest_checkpoint(rd) is not None):
            prints[key] = start_fingerprint(cfg)  # only for folders that could be reused or resumed
        action, reason = decide(rd, cfg, on_other_code, prints.get(key))
        plan.append(PlannedRun(v.name, s, rd, cfg, action, reason))
    return plan


def clear_partial(run_dir: Path) -> Path | None:
    """Make room for a fresh start in a run folder that has neither a finished summary nor an intact checkpoint
    (nothing to resume from). A folder with no checkpoint folder and no summary at all is removed; one that
    still holds checkpoint folders (all damaged) is moved aside by :func:`move_aside` (``.damaged``), and one
    whose summary says the run was interrupted or failed (``.interrupted``, ``.failed``), so nothing a user
    might recover or read is deleted. Returns the folder it was moved to, or None."""
    status = summary_status(run_dir)
    if status == "completed" or latest_checkpoint(run_dir) is not None:
        raise RuntimeError(f"refusing to clear {run_dir}: it holds a finished summary or a checkpoint")
    if not run_dir.exists():
        return None
    if status is not None:
        return move_aside(run_dir, re.sub(r"[^a-z]+", "-", status))
    if any((run_dir / "checkpoints").glob("step_*")):
        return move_aside(run_dir, "damaged")
    shutil.rmtree(run_dir)
    return None


def write_grid_file(grid: Grid, out_dir: Path, overrides: list[str], command: str) -> Path:
    """``OUT/grid.yaml``: the grid as run (base, variants, seeds, overrides, command)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"source": grid.source, "command": command, "description": grid.description, "seeds": grid.seeds,
            "overrides": list(overrides), "report": grid.report,
            "runs": [{"name": v.name, **v.overrides} for v in grid.variants], "base": grid.base}
    path = out_dir / GRID_FILE
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
