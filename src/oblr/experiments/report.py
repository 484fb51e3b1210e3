"""Reports from run folders: the figures of one run, and ``oblr report`` over many.

- :func:`plot_run` -- PNG figures of one run into ``run_dir/plots/`` (:mod:`oblr.tracking.plots`, where the
  trainer calls it from at the end; exported here too);
- :func:`find_run_dirs`, :func:`variant_label`, :func:`build_report` -- per-run plots plus the comparison
  of :func:`oblr.experiments.compare.compare_runs` (tables and seed bands) from run folders alone. A row
  averages runs of one setting only: runs of one label whose settings (:func:`run_settings`: config.yaml
  with the defaults of keys it lacks, less the seed, the output folder and the keys that do not change a
  run's numbers) differ get a row each, and the keys that differ are said (one line per label).

Every figure is computed from the metric file; a key that a run did not log is skipped, never an error.
Per-run statistics are :func:`oblr.experiments.compare.run_stats`, built on :mod:`oblr.experiments.stats`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from oblr.experiments.grid import GRID_FILE, IGNORED_FOR_MATCH
from oblr.experiments.stats import run_config, run_label, split_by_settings
from oblr.tracking.plots import RUN_PLOTS, plot_run
from oblr.train.summary import is_finished

__all__ = ["RUN_PLOTS", "SETTINGS_IGNORED", "build_report", "default_report_dir", "find_run_dirs", "plot_run",
           "run_settings", "variant_label"]

# keys left out when runs are matched by their settings: the seed (what a row averages over), the output
# folder and the keys that do not change a run's numbers (as when oblr compare reuses a run)
SETTINGS_IGNORED = IGNORED_FOR_MATCH | {"train.seed", "seed"}

# folders ``oblr compare`` moved aside (``<run>.other-code[-N]``, ``<run>.damaged[-N]``): not part of a grid
_ASIDE = re.compile(r"\.(other-code|damaged)(-\d+)?$")


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Run folders (holding ``metrics.jsonl``) among ``paths`` or anywhere below them, sorted, unique. Below a
    path, folders that ``oblr compare`` moved aside are skipped (name one explicitly to include it)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file():
            found.append(p)
        elif p.is_dir():
            below = sorted(m.parent for m in p.rglob("metrics.jsonl") if "checkpoints" not in m.parts
                           and not any(_ASIDE.search(part) for part in m.relative_to(p).parts))
            if not below:
                raise FileNotFoundError(f"{p}: no run folder (metrics.jsonl) in or below it")
            found.extend(below)
        else:
            raise FileNotFoundError(f"{p}: not a folder")
    out, seen = [], set()
    for d in found:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def variant_label(run_dir: str | Path) -> str:
    """Group label: the ``label`` a grid wrote into summary.json; for an unfinished run of a grid folder
    (``OUT/<variant>/seed<k>`` with ``OUT/grid.yaml``) the variant folder name; else :func:`run_label`."""
    d = Path(run_dir)
    summary = d / "summary.json"
    labelled = summary.is_file() and "label" in json.loads(summary.read_text())
    if not labelled and (d.parent.parent / GRID_FILE).is_file() and d.name.startswith("seed"):
        return d.parent.name
    return run_label(d, with_seed=False)


def run_settings(run_dir: str | Path) -> dict | None:
    """What a run was asked to do, for matching runs: its config.yaml flattened to dotted keys, keys it lacks
    at their defaults (a run from before a key existed matches one that leaves it at its default), without
    :data:`SETTINGS_IGNORED`; None when the run has no config.yaml."""
    from oblr.config import Config
    from oblr.train.run_dir import flatten

    if not (Path(run_dir) / "config.yaml").is_file():
        return None
    flat = {**flatten(Config().to_dict()), **flatten(run_config(run_dir))}
    return {k: v for k, v in flat.items() if k not in SETTINGS_IGNORED}


def build_report(paths: list[str | Path], out_dir: str | Path, *, run_plots: bool = True, log=print,
                 **compare_kw) -> dict:
    """The comparison (:func:`oblr.experiments.compare.compare_runs`) and then per-run plots (:func:`plot_run`)
    from run folders alone. Rows: by :func:`variant_label`, and runs of one label whose :func:`run_settings`
    differ in separate rows (:func:`oblr.experiments.stats.split_by_settings`); with ``group_by`` given, its
    rows as asked. Either way one line per row label whose runs differ names the keys that differ (logged and
    added to comparison.md). The comparison comes first, so that a bad option (an accuracy key no run
    logged) is refused before any plot is drawn; the last line logged names the folder written."""
    from oblr.experiments.compare import _grouper, compare_runs

    dirs = find_run_dirs(paths)
    unfinished = [d for d in dirs if not is_finished(d)]
    if unfinished:
        log(f"[report] {len(unfinished)} run(s) not completed (no summary.json, or one of an interrupted or failed "
            f"run; included as far as they got): "
            + ", ".join(map(str, unfinished)))
    pooled = "group_by" in compare_kw  # the caller's grouping is kept, differences only said
    label_of = _grouper(compare_kw.get("group_by", variant_label))
    rows, differ = split_by_settings({d: label_of(d) for d in dirs}, {d: run_settings(d) for d in dirs})
    if not pooled:
        compare_kw["group_by"] = lambda d: rows[Path(d)]
    res = compare_runs(dirs, out_dir, **compare_kw)
    notes = []
    for label, keys in sorted(differ.items()):
        n = sum(1 for d in dirs if label_of(d) == label)
        what = ("pooled into one row by the grouping asked for" if pooled else
                f"kept in {len({rows[d] for d in dirs if label_of(d) == label})} rows, one per setting")
        notes.append(f"{label}: its {n} runs differ in {', '.join(keys)} ({what})")
    for note in notes:
        log(f"[report] {note}")
    if notes:
        with open(Path(out_dir) / "comparison.md", "a", encoding="utf-8") as f:
            f.write("\nRuns that differ in settings (the seed, output folder and logging keys aside):\n\n"
                    + "".join(f"- {note}\n" for note in notes))
    if run_plots:
        for d in dirs:
            plot_run(d)
    log(f"[report] {len(dirs)} runs in {len(res['groups'])} groups, ranked by {res['accuracy_key']}; "
        f"report written to {out_dir}" + (" (and each run's plots/)" if run_plots else ""))
    return res


def default_report_dir(paths: list[str | Path]) -> Path:
    """Where ``oblr report`` writes without ``--out``: beside the runs, never in the current folder. The first
    path given is a run folder (``metrics.jsonl``): ``<its parent>/oblr-report``; else (a folder holding
    runs, e.g. a grid's output folder): ``<that folder>/report``."""
    first = Path(paths[0])
    if (first / "metrics.jsonl").is_file():
        return first.parent / "oblr-report"
    return first / "report"
