"""The experiment grid runner and the command line of ``oblr compare``, ``oblr report`` (and ``oblr proxy-study``).

- :func:`run_grid` -- run every (variant, seed) of a :class:`oblr.experiments.grid.Grid` that is not
  already done, one after the other (or ``jobs`` processes at once), then
  :func:`oblr.experiments.compare.compare_runs` into ``OUT/report/``; a failing run is reported and the
  others go on.
- :func:`register_cli` -- ``oblr compare`` (this runner), ``oblr report``
  (:func:`oblr.experiments.report.build_report`) and ``oblr proxy-study`` (:mod:`oblr.experiments.proxy_study`).
Grid files and the reuse/resume rules are in :mod:`oblr.experiments.grid`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

from oblr.experiments.grid import (
    ON_OTHER_CODE,
    Grid,
    PlannedRun,
    clear_partial,
    load_grid,
    move_aside,
    plan_grid,
    select,
    write_grid_file,
)
from oblr.train.run_dir import lock_holder

__all__ = ["register_cli", "run_grid"]


def _fmt_s(seconds: float) -> str:
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def _label_summary(run_dir: Path, variant: str, seed: int) -> None:
    """Add ``label`` (read by :func:`oblr.experiments.stats.run_label`) and the grid cell to ``summary.json``."""
    from oblr.train.checkpoint import write_text_atomic

    path = run_dir / "summary.json"
    summary = json.loads(path.read_text())
    if summary.get("label") == variant and summary.get("grid_seed") == seed:
        return
    summary.update(label=variant, grid_variant=variant, grid_seed=seed)
    write_text_atomic(path, json.dumps(summary, indent=2) + "\n")


def _train_one(cfg_dict: dict, resume: bool, variant: str, seed: int, quiet: bool, plugins: tuple = ()) -> dict:
    """Train one run (in this process or a worker); never raises except on KeyboardInterrupt."""
    from oblr.config import config_from_dict
    from oblr.plugins import load_plugins
    from oblr.train import train

    t0 = time.perf_counter()
    run_dir = Path(cfg_dict["train"]["output_dir"])
    try:
        load_plugins(plugins)  # a spawned worker imports the user's registrations again
        summary = train(config_from_dict(cfg_dict), resume=resume, quiet=quiet)
        _label_summary(run_dir, variant, seed)
        return {"status": "done", "seconds": time.perf_counter() - t0, "summary": summary}
    except Exception as e:  # noqa: BLE001 - one failing run must not stop the grid
        tb = traceback.format_exc()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "grid_error.txt").write_text(tb)
        except OSError:
            pass
        return {"status": "failed", "seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"}


def _final_accuracies(summary: dict) -> str:
    """``", final accuracy_sampled 0.408, greedy 0.525"``: the summary's final evaluation, each named (the
    main metric first, as the summary's ``eval_metric`` names it), or '' when the run had no evaluation."""
    parts = []
    if summary.get("eval_accuracy_final") is not None:
        parts.append(f"{summary.get('eval_metric', 'accuracy')} {summary['eval_accuracy_final']:.3f}")
    greedy = summary.get("eval_accuracy_greedy_final")
    if greedy is not None and summary.get("eval_metric") != "accuracy_greedy":
        parts.append(f"greedy {greedy:.3f}")
    return (", final " + ", ".join(parts)) if parts else ""


class _Progress:
    """``[grid] k/n ...`` lines with an ETA from the runs trained so far."""

    def __init__(self, n_total: int, n_todo: int, jobs: int, log):
        self.n_total, self.n_todo, self.jobs, self.log = n_total, n_todo, jobs, log
        self.durations: list[float] = []
        self.t0 = time.perf_counter()

    def finished(self, k: int, run: PlannedRun, res: dict) -> None:
        if res["status"] == "done":
            self.durations.append(res["seconds"])
        self.n_todo -= 1
        s = res.get("summary") or {}
        what = f"done in {_fmt_s(res['seconds'])}" + _final_accuracies(s)
        if res["status"] != "done":
            what = f"FAILED after {_fmt_s(res['seconds'])}: {res['error']}"
        eta = ""
        if self.durations and self.n_todo > 0:
            mean = sum(self.durations) / len(self.durations)
            eta = f"; ETA {_fmt_s(mean * self.n_todo / self.jobs)} ({self.n_todo} left, {_fmt_s(mean)}/run)"
        self.log(f"[grid] run {k}/{self.n_total} {run.name}: {what}{eta}")


def run_grid(grid: Grid, out_dir: str | Path, *, overrides: list[str] = (), jobs: int = 1, dry_run: bool = False,
             quiet_runs: bool = True, command: str = "", log=print, plugins: tuple = (),
             on_other_code: str = "refuse") -> dict:
    """Run the grid into ``out_dir``; returns ``{"runs": [...], "failed": int, "report": files, "seconds"}``.

    Each entry of ``runs`` holds ``variant, seed, run_dir, action, status`` (reused | done | failed |
    conflict | planned), ``seconds`` and ``error``. ``jobs > 1`` trains that many runs at once in spawned
    processes, each with ``cpu_count // jobs`` torch threads unless ``train.threads`` is set; ``plugins``
    (module names, :mod:`oblr.plugins`) are imported in each of them. ``on_other_code``: what to do with a
    folder made by other oblr code (:func:`oblr.experiments.grid.decide`).
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {jobs}")
    out_dir = Path(out_dir)
    plan = plan_grid(grid, out_dir, list(overrides), on_other_code)
    n = len(plan)
    counts = {a: sum(p.action == a for p in plan) for a in ("reuse", "resume", "start", "rerun", "conflict")}
    log(f"[grid] {grid.source}: {len(grid.variants)} variants x {len(grid.seeds)} seeds = {n} runs into {out_dir} "
        f"({counts['reuse']} reuse, {counts['resume']} resume, {counts['start']} start, "
        + (f"{counts['rerun']} rerun (other code), " if counts["rerun"] else "") + f"{counts['conflict']} conflict)")
    records = [{"variant": p.variant, "seed": p.seed, "run_dir": str(p.run_dir), "action": p.action,
                "status": "planned", "seconds": None, "error": p.reason if p.action == "conflict" else None}
               for p in plan]
    if dry_run:
        for k, p in enumerate(plan, 1):
            log(f"[grid] {k}/{n} {p.name}: {p.action}{' - ' + p.reason if p.reason else ''} -> {p.run_dir}")
        return {"runs": records, "failed": counts["conflict"], "report": [], "seconds": 0.0}

    t0 = time.perf_counter()
    write_grid_file(grid, out_dir, list(overrides), command)
    todo = []
    for k, (p, rec) in enumerate(zip(plan, records), 1):
        if p.action == "reuse":
            _label_summary(p.run_dir, p.variant, p.seed)
            rec["status"] = "reused"
            log(f"[grid] run {k}/{n} {p.name}: reused ({p.reason})")
        elif p.action == "conflict":
            rec["status"] = "conflict"
            log(f"[grid] run {k}/{n} {p.name}: CONFLICT - {p.reason}")
        else:
            todo.append((k, p, rec))
    progress = _Progress(n, len(todo), jobs, log)
    if jobs == 1 or len(todo) <= 1:
        for k, p, rec in todo:
            if not _start_msg(log, k, n, p, rec):
                progress.n_todo -= 1
                continue
            rec.update(_train_one(*_job_args(p, jobs, quiet_runs), tuple(plugins)))
            progress.finished(k, p, rec)
    else:
        _run_parallel(todo, n, jobs, progress, log, tuple(plugins))
    for rec in records:
        rec.pop("summary", None)
    failed = sum(r["status"] in ("failed", "conflict") for r in records)
    seconds = time.perf_counter() - t0
    report_files = _grid_report(grid, out_dir, plan, records, seconds, command, log)
    (out_dir / "grid_status.json").write_text(json.dumps({"seconds": seconds, "runs": records}, indent=2) + "\n")
    log(f"[grid] finished in {_fmt_s(seconds)}: {sum(r['status'] == 'done' for r in records)} trained, "
        f"{sum(r['status'] == 'reused' for r in records)} reused, {failed} failed; report: {out_dir / 'report'}")
    return {"runs": records, "failed": failed, "report": report_files, "seconds": seconds}


def _start_msg(log, k: int, n: int, p: PlannedRun, rec: dict) -> bool:
    """Say the run starts and clear or move aside what its plan says to -- unless another process has taken its
    folder since the plan (a second ``oblr compare`` on the same folder): then it is a conflict, left alone, and
    False is returned."""
    owner = lock_holder(p.run_dir)
    if owner is not None:
        rec.update(status="conflict", error=f"{p.run_dir} is in use by process {owner} (a run in progress, "
                                            "started after this grid was planned); left alone")
        log(f"[grid] run {k}/{n} {p.name}: CONFLICT - {rec['error']}")
        return False
    verb = {"resume": "resuming", "rerun": "rerunning"}.get(p.action, "starting")
    if p.action == "rerun":
        aside = move_aside(p.run_dir)
        reason = p.reason.rsplit("; moved aside", 1)[0] + f"; the old folder is now {aside}"
    else:
        reason = p.reason
    log(f"[grid] run {k}/{n} {p.name}: {verb}{' (' + reason + ')' if reason else ''} -> {p.run_dir}")
    if p.action == "start" and p.reason:
        try:
            aside = clear_partial(p.run_dir)
        except RuntimeError as e:  # it gained a checkpoint or a finished summary since the plan: not ours to clear
            rec.update(status="conflict", error=f"{e} (it changed since this grid was planned); left alone")
            log(f"[grid] run {k}/{n} {p.name}: CONFLICT - {rec['error']}")
            return False
        if aside is not None:
            why = ("held only damaged checkpoints" if ".damaged" in aside.name
                   else "held a run that stopped before any checkpoint")
            log(f"[grid] {p.run_dir} {why}: moved to {aside}, the run starts afresh")
    return True


def _job_args(p: PlannedRun, jobs: int, quiet: bool) -> tuple:
    cfg = p.cfg.to_dict()
    if jobs > 1 and cfg["train"]["threads"] == 0:
        cfg["train"]["threads"] = max(1, (os.cpu_count() or 1) // jobs)
    return cfg, p.action == "resume", p.variant, p.seed, quiet or jobs > 1


def _run_parallel(todo: list, n: int, jobs: int, progress: _Progress, log, plugins: tuple) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        pending = {}
        queue = list(todo)
        try:
            while queue or pending:
                while queue and len(pending) < jobs:
                    k, p, rec = queue.pop(0)
                    if not _start_msg(log, k, n, p, rec):
                        progress.n_todo -= 1
                        continue
                    pending[pool.submit(_train_one, *_job_args(p, jobs, True), plugins)] = (k, p, rec)
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    k, p, rec = pending.pop(fut)
                    try:
                        rec.update(fut.result())
                    except Exception as e:  # noqa: BLE001 - a worker that died (e.g. out of memory)
                        rec.update(status="failed", seconds=0.0, error=f"worker died: {type(e).__name__}: {e}")
                    progress.finished(k, p, rec)
        except KeyboardInterrupt:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _grid_report(grid: Grid, out_dir: Path, plan: list[PlannedRun], records: list[dict], seconds: float,
                 command: str, log) -> list[str]:
    """compare_runs over the finished runs (grouped by variant) + ``report/grid.md`` (what ran, status, time)."""
    from oblr.experiments.compare import compare_runs

    report_dir = out_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    finished = [p for p, r in zip(plan, records) if r["status"] in ("done", "reused")]
    files: list[str] = []
    if finished:
        variant_of = {str(p.run_dir): p.variant for p in finished}
        kw = dict(grid.report)
        if kw.get("reference") is not None and kw["reference"] not in variant_of.values():
            log(f"[grid] report.reference {kw.pop('reference')!r} has no finished run: the table has no "
                "column against it")
        try:
            res = compare_runs([p.run_dir for p in finished], report_dir, group_by=lambda d: variant_of[str(d)],
                               **kw)
            files = res["files"]
        except Exception as e:  # noqa: BLE001 - the runs are kept; the report can be rebuilt with `oblr report`
            log(f"[grid] comparison failed ({type(e).__name__}: {e}); rebuild with: oblr report {out_dir}")
    else:
        log("[grid] no finished run: no comparison table")
    lines = ["# Grid runs\n", (f"Grid: `{grid.source}`; command: `{command or '(python API)'}`; "
             f"this invocation took {_fmt_s(seconds)}.\n")]
    if grid.description:
        lines.append(grid.description.strip() + "\n")
    lines += ["| variant | overrides |", "|---|---|"]
    for v in grid.variants:
        lines.append(f"| {v.name} | " + ", ".join(f"`{k}={v.overrides[k]}`" for k in v.overrides) + " |")
    lines += ["", "| run | status | train seconds (this invocation) | run wall seconds (summary) | note |",
              "|---|---|---:|---:|---|"]
    total_wall = 0.0
    for p, r in zip(plan, records):
        wall = None
        if (p.run_dir / "summary.json").is_file():
            wall = json.loads((p.run_dir / "summary.json").read_text()).get("wall_seconds")
            total_wall += wall or 0.0
        secs = "" if r["seconds"] is None else f"{r['seconds']:.0f}"
        lines.append(f"| {p.name} | {r['status']} | {secs} | {'' if wall is None else f'{wall:.0f}'} | "
                     f"{(r['error'] or '').replace('|', '/')} |")
    lines.append(f"\nSum of run wall times (summary.json): {_fmt_s(total_wall)}.")
    path = report_dir / "grid.md"
    path.write_text("\n".join(lines) + "\n")
    return files + [str(path)]


# ------------------------------------------------------------------------------------------------- CLI
def register_cli(sub) -> None:
    from oblr.plugins import add_plugin_option

    p = sub.add_parser("compare", help="run a grid of (variant x seed) runs, reusing finished ones, and compare them",
                       description="Run every (variant, seed) of a grid file into OUT/<variant>/seed<k>/ "
                                   "(finished runs are reused, interrupted ones resumed), then write tables and "
                                   "plots to OUT/report/. Overrides key=value apply to every run.")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides for every run")
    p.add_argument("--config", required=True, help="grid file (see configs/grid-paper-checks.yaml)")
    p.add_argument("--out", help="output folder (default: the grid's 'out', else runs/<grid file name>)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (reuse/resume/start per run), run nothing")
    p.add_argument("--only", type=lambda s: [x for x in s.split(",") if x], metavar="NAME[,NAME...]",
                   help="run only these variants of the grid (their folders are the whole grid's, so running the "
                        "whole grid later reuses them)")
    p.add_argument("--seeds", type=int, nargs="+", metavar="K", help="run these seeds instead of the grid's list")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once (processes); default 1")
    p.add_argument("--verbose", action="store_true", help="show each run's own progress display (jobs=1)")
    p.add_argument("--on-other-code", choices=ON_OTHER_CODE, default="refuse",
                   help="a run folder made by other oblr code (source hash in its code.json) or from other "
                        "weights of its model (start-model fingerprint, e.g. a built-in model built on another "
                        "machine): refuse (default, a conflict naming both), rerun (move it aside to "
                        "seed<k>.other-code, train again) or reuse")
    add_plugin_option(p)
    p.set_defaults(func=_cmd_compare)

    r = sub.add_parser("report", help="tables and plots from run folders (or grid output folders)",
                       description="Rebuild per-run plots and the comparison table/plots from run folders alone. "
                                   "A folder that is not a run folder is searched for run folders.")
    r.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run folders or folders holding them")
    r.add_argument("--out", help="output folder (default: beside the runs: FIRST_RUN_DIR/../oblr-report when the "
                                 "first path is a run folder, else PATH/report for a folder holding runs)")
    r.add_argument("--group-by", help="dotted config key to group by (default: grid variant / baseline+schedule)")
    r.add_argument("--target", type=float, help="target accuracy for 'steps to target' (default 0.9 x best)")
    r.add_argument("--accuracy-key", help="metric the runs are ranked by, e.g. eval/accuracy_greedy (default: "
                                          "eval/accuracy_sampled, the primary metric of oblr train, if every run "
                                          "logged it); a key no run logged is refused")
    r.add_argument("--reference", metavar="GROUP",
                   help="a row label (e.g. grpo-const): every row's final accuracy is tested against it by Welch's "
                        "t-test over seeds (two-sided 5 %%): beats / behind / within noise; a label that is no row "
                        "is refused, naming the rows")
    r.add_argument("--no-run-plots", action="store_true", help="only the comparison, not each run's plots")
    r.set_defaults(func=_cmd_report)

    from oblr.experiments.proxy_study import register_cli as register_proxy_cli

    register_proxy_cli(sub)


def _cmd_compare(args) -> int:
    from oblr.checks import MAX_THREADS, Range, check_flags

    check_flags({"--jobs": (args.jobs, Range(ge=1, le=MAX_THREADS))})
    grid = select(load_grid(args.config), args.only, args.seeds)
    out = args.out or grid.out or str(Path("runs") / Path(args.config).stem)
    command = "oblr " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else ""
    res = run_grid(grid, out, overrides=list(args.overrides), jobs=args.jobs, dry_run=args.dry_run,
                   quiet_runs=not args.verbose, command=command, plugins=tuple(args.plugin),
                   on_other_code=args.on_other_code)
    return 1 if res["failed"] else 0


def _cmd_report(args) -> int:
    from oblr.checks import Range, check_flags

    check_flags({"--target": (args.target, Range(ge=0, le=1))})
    from oblr.experiments.report import build_report, default_report_dir

    out = Path(args.out) if args.out else default_report_dir(args.paths)
    kw = {k: v for k, v in (("target", args.target), ("accuracy_key", args.accuracy_key),
                            ("group_by", args.group_by), ("reference", args.reference)) if v is not None}

    build_report(args.paths, out, run_plots=not args.no_run_plots, **kw)
    return 0
