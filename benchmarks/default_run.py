"""The README's default-run claim: measure it, or check it on this machine.

    python benchmarks/default_run.py measure --seeds 0 1 2 --jobs 2   # the claim: OUT/seed<k>/, claim.json, claim.md
    python benchmarks/default_run.py check                            # one seed here, against the committed claim
    python benchmarks/default_run.py check --seed 3 --keep runs/check # an unseen seed; keep its run folder

The default run is ``oblr train train.threads=1 train.seed=K`` (the built-in arithmetic task and the shipped
built-in model; run with ``model.device=cpu``, which is what ``auto`` resolves to on the CPU machine the claim was
measured on, so that a machine with a GPU checks the same computation; one torch thread because the sampled tokens depend on the float summation order, which the
thread count changes). ``measure`` runs it for each seed (``--jobs`` at a time), keeps each run's
``config.yaml`` and ``summary.json`` under ``--out`` (default ``benchmarks/results/default-run``) and writes
``claim.json`` (start and final held-out accuracy per seed, mean and sample std over seeds) and ``claim.md``
(the table README quotes).

``check`` runs the default command once with ``--seed`` (default 0) in a temporary folder and prints the claim,
the new figure and the verdicts:

- start accuracy: the model's held-out accuracy before the first step must equal the claim's for that seed
  exactly when the seed is one of the claim's (same shipped bytes, same evaluation draws), else the seeds'
  common value when they agree;
- final sampled accuracy: within seed noise when ``|new - mean| <= 2 s sqrt(1 + 1/n)`` (the spread of one new
  seed around the mean of n measured seeds with sample std s); for a measured seed it should be identical.

Exit status 0 when both hold, 1 otherwise, 2 (before anything runs) when the claim was measured with another
default schedule (``claim.json``'s ``lr_schedule``; a claim without it was measured with ``snr``, the default
before ``kl``) or, for ``kl``, at another target than the default resolves to now (``claim.json``'s
``kl_target``, the ``kl/target`` every seed logged; a ``kl`` claim without it is checked with a note).
The claim of the ``snr`` default (commit e1f55c9) is kept in ``benchmarks/results/default-run-snr/``, that of the
``kl`` default with its first AdamW target (3.75e-4 at N = 16, commit 959ed72) in ``default-run-kl-3.75e-4/``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "default-run"
KEYS = ("eval_accuracy_initial", "eval_accuracy_final", "eval_accuracy_greedy_initial",
        "eval_accuracy_greedy_final", "wall_seconds")


def command(seed: int, out_dir: Path) -> list[str]:
    """The default run, one thread, seed ``seed``, into ``out_dir``, on the CPU: the default ``model.device=auto``
    would take a GPU where there is one, and the claim was measured on CPU-only machines."""
    return [sys.executable, "-m", "oblr", "train", "model.device=cpu", "train.threads=1", f"train.seed={seed}",
            "--output-dir", str(out_dir)]


def run_one(seed: int, out_dir: Path, log) -> dict:
    t0 = time.time()
    proc = subprocess.run(command(seed, out_dir), capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: oblr train exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    summary = json.loads((out_dir / "summary.json").read_text())
    log(f"seed {seed}: {summary['eval_accuracy_initial']:.1%} -> {summary['eval_accuracy_final']:.1%} sampled, "
        f"greedy {summary['eval_accuracy_greedy_initial']:.1%} -> {summary['eval_accuracy_greedy_final']:.1%} "
        f"({time.time() - t0:.0f} s)")
    return {**{k: summary[k] for k in KEYS}, "kl_target": logged_kl_target(out_dir)}


def keep(run: Path, dst: Path) -> None:
    """Copy a run's ``config.yaml``, ``summary.json`` and ``code.json`` (the code and the start model's
    fingerprint) to ``dst``, their paths rewritten from the temporary run folder to ``dst`` (relative to the
    repository when inside it), so no machine's path is kept."""
    dst.mkdir(parents=True, exist_ok=True)
    where = dst.resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    for name in ("config.yaml", "summary.json", "code.json"):
        text = (run / name).read_text(encoding="utf-8")
        (dst / name).write_text(text.replace(str(run), str(where)), encoding="utf-8")


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and sample std (0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def logged_kl_target(run: Path) -> float | None:
    """The ``kl/target`` a run logged (its first metrics row that has it), None when it logged none."""
    with open(run / "metrics.jsonl", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "kl/target" in row:
                return float(row["kl/target"])
    return None


def claim_from_runs(per_seed: dict[int, dict], model_sha: str, commit: str, schedule: str | None = None,
                    kl_target: float | None = None) -> dict:
    finals = [r["eval_accuracy_final"] for r in per_seed.values()]
    greedy = [r["eval_accuracy_greedy_final"] for r in per_seed.values()]
    m, s = spread(finals)
    gm, gs = spread(greedy)
    return {"command": "oblr train train.threads=1 train.seed=K", "model_weights_sha256": model_sha,
            "commit": commit, "lr_schedule": schedule, "kl_target": kl_target,
            "seeds": {str(k): v for k, v in sorted(per_seed.items())},
            "final_sampled_mean": m, "final_sampled_std": s, "final_greedy_mean": gm, "final_greedy_std": gs}


def claim_table(claim: dict) -> str:
    rows = ["| seed | sampled start | sampled final | greedy start | greedy final | wall s |",
            "|---|---|---|---|---|---|"]
    for k, r in claim["seeds"].items():
        rows.append(f"| {k} | {r['eval_accuracy_initial']:.1%} | {r['eval_accuracy_final']:.1%} | "
                    f"{r['eval_accuracy_greedy_initial']:.1%} | {r['eval_accuracy_greedy_final']:.1%} | "
                    f"{r['wall_seconds']:.0f} |")
    rows.append(f"| mean ± std | | {claim['final_sampled_mean']:.1%} ± {claim['final_sampled_std']:.1%} | | "
                f"{claim['final_greedy_mean']:.1%} ± {claim['final_greedy_std']:.1%} | |")
    return "\n".join(rows)


def verdict(claim: dict, seed: int, new: dict) -> tuple[bool, list[str]]:
    """``(ok, lines)``: the start-accuracy and final-accuracy verdicts of a new run of ``seed``."""
    lines, ok = [], True
    seeds = claim["seeds"]
    if str(seed) in seeds:
        want = seeds[str(seed)]["eval_accuracy_initial"]
        same = new["eval_accuracy_initial"] == want
        lines.append(f"start accuracy (seed {seed}): claim {want:.2%}, here {new['eval_accuracy_initial']:.2%}: "
                     + ("identical" if same else "DIFFERENT"))
        ok &= same
    n = len(seeds)
    m, s = claim["final_sampled_mean"], claim["final_sampled_std"]
    half = 2 * s * math.sqrt(1 + 1 / n)
    got = new["eval_accuracy_final"]
    inside = abs(got - m) <= half
    lines.append(f"final sampled accuracy: claim {m:.1%} ± {s:.1%} over {n} seeds (a new seed within ±{half:.1%}), "
                 f"here {got:.1%}: " + ("within seed noise" if inside else "OUTSIDE seed noise"))
    ok &= inside
    if str(seed) in seeds:
        want = seeds[str(seed)]["eval_accuracy_final"]
        lines.append(f"same seed's final accuracy: claim {want:.2%}, here {got:.2%}: "
                     + ("identical" if got == want else "different (other float results on this machine)"))
    return ok, lines


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _default_schedule() -> str:
    """The default run's ``algorithm.lr_schedule`` (the claim records it; ``check`` refuses a claim of another)."""
    from oblr.config import load_config

    return load_config().algorithm.lr_schedule


def _default_kl_target() -> float | None:
    """The target the default run's ``kl`` schedule resolves to (its ``schedule_options.target``, else
    :func:`oblr.kl_rate.default_target` of its N and optimizer); None when the default schedule is not ``kl``."""
    from oblr.config import load_config
    from oblr.kl_rate import default_target

    cfg = load_config()
    if cfg.algorithm.lr_schedule != "kl":
        return None
    given = (cfg.algorithm.schedule_options or {}).get("target")
    if given is not None:
        return float(given)
    return default_target(cfg.rollout.prompts_per_step, adaptive=str(cfg.optim.optimizer).lower() != "sgd")


def check_settings(claim: dict) -> str | None:
    """Why ``claim`` cannot be checked against today's default (another schedule or ``kl`` target), else None."""
    schedule = claim.get("lr_schedule", "snr")  # claims before the field: the snr default
    if schedule != _default_schedule():
        return (f"was measured with the default schedule {schedule!r}; the default is now "
                f"{_default_schedule()!r}: measure a new claim (measure --seeds 0 1 2)")
    want, had = _default_kl_target(), claim.get("kl_target")
    if want is not None and had is not None and not math.isclose(had, want, rel_tol=1e-9):
        return (f"was measured at the kl target {had:g}; the default resolves to {want:g} now: measure a new claim "
                f"(measure --seeds 0 1 2)")
    return None


def _model_sha() -> str:
    from oblr.models import BUILTIN_DIRNAME
    from oblr.models.shipped import entry

    ent = entry(BUILTIN_DIRNAME)
    return ent["weights_sha256"] if ent else "not shipped"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    me = sub.add_parser("measure", help="run the default command for several seeds and write the claim")
    me.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    me.add_argument("--jobs", type=int, default=1)
    me.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ch = sub.add_parser("check", help="run the default command once here and compare with the claim")
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--claim", type=Path, default=DEFAULT_OUT / "claim.json")
    ch.add_argument("--keep", type=Path, default=None, help="keep the run folder here (default: a temp folder)")
    args = ap.parse_args(argv)
    log = lambda msg: print(f"[default-run] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    if args.cmd == "measure":
        args.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(max(1, args.jobs)) as pool:
            futs = {k: pool.submit(run_one, k, Path(tmp) / f"seed{k}", log) for k in args.seeds}
            per_seed = {k: f.result() for k, f in futs.items()}
            for k in args.seeds:  # keep the configuration and result of each run
                keep(Path(tmp) / f"seed{k}", args.out / f"seed{k}")
        targets = {r.pop("kl_target") for r in per_seed.values()}
        if len(targets) != 1 or targets != {_default_kl_target()}:
            raise RuntimeError(f"the seeds logged the kl targets {sorted(map(str, targets))}, the default resolves to "
                               f"{_default_kl_target()}: not one claim")
        claim = claim_from_runs(per_seed, _model_sha(), _commit(), _default_schedule(), targets.pop())
        (args.out / "claim.json").write_text(json.dumps(claim, indent=2) + "\n")
        (args.out / "claim.md").write_text(f"`{claim['command']}` (commit {claim['commit']}, default schedule "
                                           f"{claim['lr_schedule']}"
                                           + (f" at target {claim['kl_target']:g}" if claim["kl_target"] else "")
                                           + ", built-in model "
                                           f"sha256 {claim['model_weights_sha256'][:16]}...)\n\n"
                                           + claim_table(claim) + "\n")
        print(claim_table(claim))
        return 0

    claim = json.loads(args.claim.read_text())
    why = check_settings(claim)
    if why is not None:
        log(f"the claim {args.claim} {why}")
        return 2
    if claim.get("lr_schedule") == "kl" and claim.get("kl_target") is None:
        log(f"note: the claim {args.claim} does not record its kl target (measured before the field); the default "
            f"resolves to {_default_kl_target():g} now")
    if claim["model_weights_sha256"] != _model_sha():
        log(f"note: the claim was measured from built-in weights {claim['model_weights_sha256'][:16]}..., this "
            f"install ships {_model_sha()[:16]}...: start accuracies will differ")
    log(f"running the default command with seed {args.seed} (one thread; a few minutes)")
    if args.keep is not None:
        new = run_one(args.seed, args.keep, log)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            new = run_one(args.seed, Path(tmp) / "run", log)
    if claim.get("kl_target") is not None and new["kl_target"] != claim["kl_target"]:
        log(f"note: this run logged the kl target {new['kl_target']}, the claim {claim['kl_target']}")
    ok, lines = verdict(claim, args.seed, new)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
