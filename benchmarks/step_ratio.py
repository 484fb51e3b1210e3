"""One whole ``oblr train`` step of OBLR-PO against GRPO: the phase shares of a step and the whole-step ratio
computed from them and the update ratio.

    python benchmarks/step_ratio.py --json out.json --markdown out.md      # runs `oblr train` here (CPU)
    python benchmarks/step_ratio.py --grpo A/metrics.jsonl --oblr B/metrics.jsonl   # runs made already
    python benchmarks/step_ratio.py --grpo A/metrics.jsonl --update-ratio 1.08      # a ratio measured elsewhere
    python benchmarks/step_ratio.py --set task.name=countdown --set rollout.prompts_per_step=128   # another shape

``oblr train`` logs each step's phases in ``metrics.jsonl`` (``train/trainer.py``): ``time/generate``
(rollout), ``time/score`` (rewards), ``time/norms`` (the gradient accumulation: forward, backward, and for
OBLR-PO the exact norms), ``time/update`` (clip, optimizer step, weight sync) and ``time/step`` (all of it).
Here the **update** is ``time/norms + time/update`` (what ``step_cost.py`` times: accumulation and optimizer
step), **other** is ``time/step`` less the named phases (metrics bookkeeping). Per phase the median over the
steps of every run but each run's first (warm-up).

Without ``--grpo``/``--oblr`` the script runs the default ``oblr train`` shape (the built-in arithmetic task
and tiny model, N = 16 prompts x G = 8, 32 new tokens, one thread, no evaluation or checkpoints) ``--rounds``
times for each method, GRPO (``algorithm.baseline=grpo algorithm.lr_schedule=constant``: no exact norms) and
OBLR-PO (the defaults: baseline ``oblr``, SNR schedule, the one-pass engine), ``--steps`` steps a run, the order
alternating from round to round so that drift on a shared machine hits both alike. ``--set KEY=VALUE``
(repeatable) adds a config override to both methods' runs (another task, N, G or response length).

Printed (and written with ``--json``/``--markdown``):

- the GRPO step's phase shares (measured);
- the update ratio: OBLR-PO's median update over GRPO's (measured, in training), or ``--update-ratio``;
- the whole-step ratio **computed from the measured update ratio and phase shares**:
  ``(rollout + scoring + other + r * update) / (rollout + scoring + other + update)`` with GRPO's medians;
- with both runs, the ratio of the two runs' median ``time/step`` (measured, but the two methods' rollouts
  differ after the first step: responses of other lengths), for comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PHASES = ("rollout", "scoring", "update", "other")
GRPO_ARGS = ("algorithm.baseline=grpo", "algorithm.lr_schedule=constant")
OBLR_ARGS = ("algorithm.baseline=oblr", "algorithm.lr_schedule=snr")
COMMON = ("train.threads=1", "task.eval_size=0", "train.eval_every=0", "train.save_every=0")


def step_phases(rec: dict) -> dict[str, float]:
    """The phases of one ``metrics.jsonl`` step record (seconds); KeyError for a record without them."""
    update = rec["time/norms"] + rec["time/update"]
    named = rec["time/generate"] + rec["time/score"] + update
    return {"rollout": rec["time/generate"], "scoring": rec["time/score"], "update": update,
            "other": max(rec["time/step"] - named, 0.0), "step": rec["time/step"]}


def read_steps(path: Path, skip_first: bool = True) -> list[dict[str, float]]:
    """The phases of every training step of a run's ``metrics.jsonl`` (the first one left out when
    ``skip_first`` and there are more); SystemExit (one line) when it logs none."""
    recs = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        rec = json.loads(line)
        if "time/step" in rec and "time/generate" in rec:
            try:
                recs.append(step_phases(rec))
            except KeyError as e:
                raise SystemExit(f"step_ratio: {path}:{i + 1}: a step record without {e.args[0]}") from None
    if not recs:
        raise SystemExit(f"step_ratio: {path}: no step with time/* metrics (is it an `oblr train` metrics.jsonl?)")
    return recs[1:] if skip_first and len(recs) > 1 else recs


def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in steps) for k in (*PHASES, "step")}


def shares(ph: dict[str, float]) -> dict[str, float]:
    """Each phase's share of the phases' sum."""
    total = sum(ph[k] for k in PHASES)
    return {k: ph[k] / total for k in PHASES}


def whole_step_ratio(ph: dict[str, float], update_ratio: float) -> float:
    """``(rollout + scoring + other + r * update) / (rollout + scoring + other + update)``."""
    total = sum(ph[k] for k in PHASES)
    return (total - ph["update"] + update_ratio * ph["update"]) / total


def run_train(extra: tuple[str, ...], steps: int, out_dir: Path, log) -> Path:
    cmd = [sys.executable, "-m", "oblr", "train", f"train.steps={steps}", *COMMON, *extra, "--output-dir", str(out_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"step_ratio: `oblr train {' '.join(extra)}` exited {proc.returncode}: "
                         f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ''}")
    log(f"oblr train {' '.join(extra)}: {steps} steps in {time.perf_counter() - t0:.0f} s")
    return out_dir / "metrics.jsonl"


def report(grpo: dict[str, float], update_ratio: float, ratio_source: str, oblr: dict[str, float] | None,
           command: str) -> tuple[dict, str]:
    sh = shares(grpo)
    computed = whole_step_ratio(grpo, update_ratio)
    out = {"command": command, "grpo_phase_medians_s": grpo, "grpo_phase_shares": sh, "update_ratio": update_ratio,
           "update_ratio_source": ratio_source, "whole_step_ratio_computed": computed,
           "whole_step_ratio_label": "computed from measured update ratio and phase shares"}
    lines = [f"`{command}`", "",
             "| phase (GRPO step) | median s | share |", "|---|---:|---:|"]
    lines += [f"| {k} | {grpo[k]:.3f} | {sh[k]:.1%} |" for k in PHASES]
    lines += ["", f"update ratio OBLR-PO / GRPO: {update_ratio:.3f} ({ratio_source})",
              f"whole-step ratio: {computed:.3f} (computed from measured update ratio and phase shares)"]
    if oblr is not None:
        out["oblr_phase_medians_s"] = oblr
        out["whole_step_ratio_runs"] = oblr["step"] / grpo["step"]
        lines.append(f"median time/step of the OBLR-PO runs over the GRPO runs: {out['whole_step_ratio_runs']:.3f} "
                     "(measured; the rollouts differ after the first step)")
    return out, "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grpo", type=Path, nargs="+", default=None, help="metrics.jsonl of GRPO runs (the shares)")
    ap.add_argument("--oblr", type=Path, nargs="+", default=None, help="metrics.jsonl of OBLR-PO runs (the ratio)")
    ap.add_argument("--update-ratio", type=float, default=None,
                    help="an update ratio measured elsewhere (e.g. step_cost.py at the same shape)")
    ap.add_argument("--rounds", type=int, default=2, help="without --grpo: runs of each method (default 2)")
    ap.add_argument("--steps", type=int, default=4, help="without --grpo: steps per run (default 4; the first "
                                                         "of each run is left out)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="without --grpo: a config override for both methods' runs (repeatable)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o or not o.split("=", 1)[0]]
    if bad:
        ap.error(f"--set takes KEY=VALUE, got {bad[0]!r}")
    if args.overrides and args.grpo:
        ap.error("--set applies to the runs this script makes: not with --grpo")
    if args.update_ratio is not None and not args.update_ratio > 0:
        ap.error(f"--update-ratio must be > 0, got {args.update_ratio}")
    if args.rounds < 1 or args.steps < 2:
        ap.error("--rounds must be >= 1 and --steps >= 2 (each run's first step is left out)")
    if args.oblr and not args.grpo:
        ap.error("--oblr needs --grpo (the shares come from the GRPO runs)")
    if args.grpo and not args.oblr and args.update_ratio is None:
        ap.error("--grpo needs --oblr or --update-ratio")
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.grpo:
        command = "python benchmarks/step_ratio.py " + " ".join(argv if argv is not None else sys.argv[1:])
        grpo = medians([s for f in args.grpo for s in read_steps(f)])
        oblr = medians([s for f in args.oblr for s in read_steps(f)]) if args.oblr else None
    else:
        runs = {"grpo": [], "oblr": []}
        with tempfile.TemporaryDirectory(prefix="step_ratio_") as tmp:
            for r in range(args.rounds):
                order = [("grpo", GRPO_ARGS), ("oblr", OBLR_ARGS)][:: 1 if r % 2 == 0 else -1]
                for name, extra in order:
                    runs[name] += read_steps(run_train((*args.overrides, *extra), args.steps, Path(tmp) / f"{name}{r}",
                                                       log))
        grpo, oblr = medians(runs["grpo"]), medians(runs["oblr"])
        sets = "".join(f" --set {o}" for o in args.overrides)
        command = (f"python benchmarks/step_ratio.py --rounds {args.rounds} --steps {args.steps}{sets} "
                   f"(oblr train train.steps={args.steps} {' '.join(COMMON)}{''.join(' ' + o for o in args.overrides)}, "
                   f"GRPO: {' '.join(GRPO_ARGS)}, "
                   f"OBLR-PO: {' '.join(OBLR_ARGS)})")
    if args.update_ratio is not None:
        ratio, source = args.update_ratio, "given with --update-ratio"
    else:
        ratio, source = oblr["update"] / grpo["update"], "measured: median update of the OBLR-PO runs over GRPO's"
    out, md = report(grpo, ratio, source, oblr, command)
    print(md)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(md + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
