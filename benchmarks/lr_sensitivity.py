"""Learning-rate sensitivity: held-out accuracy against the peak learning rate, per method and optimizer.

    python benchmarks/lr_sensitivity.py grids --out configs/lr-sweep      # write the grid files (below)
    oblr compare --config configs/lr-sweep/grid-core.yaml --out benchmarks/results/lr-sweep train.threads=1
    oblr compare --config configs/lr-sweep/grid-oblr-snr.yaml --out benchmarks/results/lr-sweep train.threads=1
    python benchmarks/lr_sensitivity.py report benchmarks/results/lr-sweep --out docs/results \\
        --results-doc docs/results.md                                      # table + PNG + md, and into results.md

The sweep is long (each point is a 200-step run; about 200 runs in all), so it is built to be run in pieces,
on any machine, by anyone: ``benchmarks/results/lr-sweep/`` is tracked in git, but its ``.gitignore`` keeps
only each run's ``config.yaml`` and ``summary.json`` (a few kB). A finished run is therefore kept with the
repository, and ``oblr compare`` with the same grid reuses it (config.yaml + summary.json = finished) and
runs only what is missing; checkpoints and metrics stay local. ``grid-core.yaml`` holds the decade points
(AdamW 1e-5..1e-2, SGD 0.01..10) of ``grpo-const`` and ``oblr-snr``, so that the comparison the issue asks
for exists before the half-decade points fill it in; ``grid-auto-core.yaml`` the same points of ``oblr-auto``; ``grid-window.yaml``
half-decade points at the edges of the windows the decade points show; ``grid-kl-first.yaml`` the kl schedule
from the guesses 1e-3 (AdamW) and 1 (SGD).

``grids`` writes one ``oblr compare`` grid per method (``grpo-const``: GRPO baseline, constant rate;
``oblr-snr``: OBLR-PO, the SNR rule with eta_max = lr; ``oblr-auto``: OBLR-PO with the measured step
scale, lr = its initial guess; ``oblr-kl``: OBLR-PO with the lr set from the policy's KL per step, lr = its
guess), each over AdamW lr 1e-5..1e-2 and SGD lr 0.01..10 in half-decade steps,
seeds 0, 1, 2, on the default built-in run (200 steps, evaluation every 50 steps). Run folders are
``OUT/<method>-<optimizer>-lr<lr>/seed<k>/``.

Where the committed runs are: ``benchmarks/results/lr-sweep/`` (grpo-const and oblr-snr: grid-core and
grid-window), ``benchmarks/results/lr-sweep-auto/`` (oblr-auto with the code now, grid-auto-core: run it with
``--out benchmarks/results/lr-sweep-auto``), ``benchmarks/results/lr-sweep-kl/`` (oblr-kl, grid-kl-first, made at
0fc6c29, whose default kl target was 3e-3 at every N: not the current AdamW default at N = 16, whose rows are
``benchmarks/results/lr-sweep-kl-target/``; so the report is not given both folders),
``benchmarks/results/lr-sweep-auto-attempt3/`` (the same
points with the previous estimator, seed 0 only, kept as the record of that attempt; docs/algorithm.md).
The auto runs live apart because a run folder does not record which estimator made it, and ``oblr
compare`` would reuse an old attempt's finished folder for the new one.

``report`` reads every run folder under the given directories (any number of seeds; a folder without
``summary.json`` is an unfinished point and is listed as missing), groups them by (baseline, schedule,
optimizer, lr) taken from each run's config.yaml, and writes

- a table on stdout and in ``lr_sensitivity.md``: final and best held-out sampled accuracy, mean ± sample
  std over the finished seeds (with their count), per lr and method, one table per optimizer, followed by
  the configuration of every point (the keys shared by all runs, then the keys that vary);
- ``lr_sensitivity.png``: final accuracy against lr (log x axis), one line per method (mean), every seed as
  a dot and the min-max range as a band, one panel per optimizer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from oblr.experiments.compare import aggregate
from oblr.experiments.stats import config_value, run_config
from oblr.train.run_dir import flatten
from oblr.train.summary import is_finished

sys.path.insert(0, str(Path(__file__).resolve().parent))
import doc_sections  # noqa: E402  (the marked sections of docs/results.md)

LRS = {"adamw": [1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2], "sgd": [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]}
METHODS = {  # name -> overrides; the lr is the peak (constant, snr) or the initial guess (auto)
    "grpo-const": {"algorithm.baseline": "grpo", "algorithm.lr_schedule": "constant"},
    "oblr-snr": {"algorithm.baseline": "oblr", "algorithm.lr_schedule": "snr"},
    "oblr-auto": {"algorithm.baseline": "oblr", "algorithm.lr_schedule": "auto"},
    "oblr-kl": {"algorithm.baseline": "oblr", "algorithm.lr_schedule": "kl"},
}
SEEDS = [0, 1, 2]
BASE = {"train": {"eval_every": 50, "save_every": 100, "keep_checkpoints": 1}}
KEY_OF_POINT = ("algorithm.baseline", "algorithm.lr_schedule", "optim.optimizer", "optim.lr")


def point_name(method: str, optimizer: str, lr: float) -> str:
    return f"{method}-{optimizer}-lr{lr:g}"


def grid(method: str) -> dict:
    """The ``oblr compare`` grid of one method over both optimizers' lr grids."""
    runs = [{"name": point_name(method, opt, lr), **METHODS[method], "optim.optimizer": opt, "optim.lr": lr}
            for opt, lrs in LRS.items() for lr in lrs]
    return {"description": f"lr sensitivity: {method} (issue 18)", "seeds": list(SEEDS), "base": BASE, "runs": runs}


CORE_METHODS = ("grpo-const", "oblr-snr")


def core_grid(methods=CORE_METHODS) -> dict:
    """The decade points (every other lr of :data:`LRS`) of ``methods``, both optimizers: run first."""
    runs = [{"name": point_name(m, opt, lr), **METHODS[m], "optim.optimizer": opt, "optim.lr": lr}
            for opt, lrs in LRS.items() for lr in lrs[::2] for m in methods]
    return {"description": f"lr sensitivity: decade points of {' and '.join(methods)} (issue 18)",
            "seeds": list(SEEDS), "base": BASE, "runs": runs}


#: half-decade points at the edges of the working windows seen on the decade points, most telling first
WINDOW_POINTS = [("grpo-const", "adamw", 3e-4), ("oblr-snr", "adamw", 3e-3), ("grpo-const", "sgd", 0.3),
                 ("oblr-snr", "sgd", 3.0), ("grpo-const", "adamw", 3e-5), ("oblr-snr", "adamw", 3e-4),
                 ("oblr-snr", "sgd", 0.3)]


def window_grid() -> dict:
    """:data:`WINDOW_POINTS` (a subset of the half-decade grids, same folder names): run after the core."""
    runs = [{"name": point_name(m, opt, lr), **METHODS[m], "optim.optimizer": opt, "optim.lr": lr}
            for m, opt, lr in WINDOW_POINTS]
    return {"description": "lr sensitivity: half-decade points at the window edges (issue 18)",
            "seeds": list(SEEDS), "base": BASE, "runs": runs}


#: the kl schedule's first points: its guesses 1e-3 (AdamW) and 1 (SGD), the defaults of the paper's-regime runs
KL_FIRST_POINTS = [("oblr-kl", "adamw", 1e-3), ("oblr-kl", "sgd", 1.0)]


def kl_first_grid() -> dict:
    """:data:`KL_FIRST_POINTS` (a subset of ``grid("oblr-kl")``, same folder names): the kl schedule at N = 16."""
    runs = [{"name": point_name(m, opt, lr), **METHODS[m], "optim.optimizer": opt, "optim.lr": lr}
            for m, opt, lr in KL_FIRST_POINTS]
    return {"description": "lr sensitivity: the kl schedule (default target 3e-3) from the guesses 1e-3 (AdamW) "
            "and 1 (SGD) (issue 38)", "seeds": list(SEEDS), "base": BASE, "runs": runs}


def write_grids(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, g in [(m, grid(m)) for m in METHODS] + [("core", core_grid()), ("auto-core", core_grid(("oblr-auto",))),
                                                         ("window", window_grid()), ("kl-first", kl_first_grid())]:
        p = out / f"grid-{name}.yaml"
        p.write_text(yaml.safe_dump(g, sort_keys=False), encoding="utf-8")
        paths.append(p)
    return paths


# ------------------------------------------------------------------------------------------ reading
def find_runs(roots: list[Path]) -> list[Path]:
    """Every folder under ``roots`` holding a config.yaml (a started or finished run)."""
    found = set()
    for root in roots:
        if not root.exists():
            raise SystemExit(f"lr_sensitivity: {root} does not exist")
        found.update(p.parent for p in root.rglob("config.yaml") if "checkpoints" not in p.parts)
    return sorted(found)


def method_of(cfg: dict) -> str:
    """The method name of METHODS whose overrides this config matches, else 'baseline+schedule'."""
    for name, ov in METHODS.items():
        if all(config_value(cfg, k) == v for k, v in ov.items()):
            return name
    return f"{config_value(cfg, 'algorithm.baseline')}+{config_value(cfg, 'algorithm.lr_schedule')}"


def collect(run_dirs: list[Path]) -> dict:
    """{(optimizer, method, lr): {"final": [...], "best": [...], "seeds": [...], "missing": [...], "dirs": [...]}}."""
    points: dict = defaultdict(lambda: {"final": [], "best": [], "seeds": [], "missing": [], "dirs": []})
    for d in run_dirs:
        cfg = run_config(d)
        key = (config_value(cfg, "optim.optimizer"), method_of(cfg), float(config_value(cfg, "optim.lr")))
        pt, seed = points[key], config_value(cfg, "train.seed")
        pt["dirs"].append(d)
        summary = d / "summary.json"
        if not is_finished(d):  # no summary, or one of an interrupted or failed run
            pt["missing"].append(seed)
            continue
        s = json.loads(summary.read_text(encoding="utf-8"))
        pt["final"].append(s.get("eval_accuracy_final", math.nan))
        pt["best"].append(s.get("eval_accuracy_best", math.nan))
        pt["seeds"].append(seed)
    return dict(points)


def _cell(values: list[float]) -> str:
    mean, std, n = aggregate([100 * v for v in values])
    if n == 0:
        return "missing"
    return f"{mean:.1f}" + (f" ± {std:.1f}" if math.isfinite(std) else "") + f" ({n})"


def tables(points: dict) -> str:
    """One markdown table per optimizer: rows lr, columns method final / best."""
    out = []
    for opt in sorted({k[0] for k in points}):
        methods = sorted({k[1] for k in points if k[0] == opt}, key=lambda m: (m not in METHODS, m))
        lrs = sorted({k[2] for k in points if k[0] == opt})
        head = " | ".join(f"{m} final | {m} best" for m in methods)
        out += [f"**{opt}** (held-out sampled accuracy %, mean ± std over finished seeds (count); "
                "'missing': no finished seed)", "", f"| lr | {head} |",
                "|---|" + "---|" * (2 * len(methods))]
        for lr in lrs:
            cells = []
            for m in methods:
                pt = points.get((opt, m, lr))
                cells += [_cell(pt["final"]), _cell(pt["best"])] if pt else ["–", "–"]
                if pt and pt["missing"]:
                    cells[-1] += f"; unfinished seeds {sorted(pt['missing'])}"
            out.append(f"| {lr:g} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def configurations(points: dict) -> str:
    """The keys every run shares, then per point the keys that vary (from each run's config.yaml)."""
    flats = {d: flatten(run_config(d)) for pt in points.values() for d in pt["dirs"]}
    keys = set().union(*flats.values()) if flats else set()
    ignore = {"train.output_dir", "train.seed"}
    shared = {k: next(iter(flats.values())).get(k) for k in sorted(keys - ignore)
              if len({json.dumps(f.get(k), sort_keys=True) for f in flats.values()}) == 1}
    varying = sorted(keys - ignore - set(shared) - set(KEY_OF_POINT))
    lines = ["Configuration shared by every point (from the runs' config.yaml):", "", "```"]
    cols = ["algorithm.baseline", "algorithm.lr_schedule"] + varying
    lines += [f"{k}: {json.dumps(v)}" for k, v in shared.items()] + ["```", "", "Per point:", "",
              "| optimizer | method | lr | " + " | ".join(cols) + " | finished seeds | unfinished |",
              "|---|---|---|" + "---|" * (len(cols) + 2)]
    for (opt, m, lr), pt in sorted(points.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        f = flats[pt["dirs"][0]]
        lines.append(f"| {opt} | {m} | {lr:g} | " + " | ".join(str(f.get(k)) for k in cols)
                     + f" | {sorted(pt['seeds'])} | {sorted(pt['missing'])} |")
    return "\n".join(lines) + "\n"


def plot(points: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    opts = sorted({k[0] for k in points})
    fig, axes = plt.subplots(1, max(1, len(opts)), figsize=(6 * max(1, len(opts)), 4.2), squeeze=False)
    for ax, opt in zip(axes[0], opts):
        for m in sorted({k[1] for k in points if k[0] == opt}):
            pts = sorted((k[2], v) for k, v in points.items() if k[0] == opt and k[1] == m and v["final"])
            if not pts:
                continue
            xs = [lr for lr, _ in pts]
            vals = [[100 * x for x in v["final"]] for _, v in pts]
            line, = ax.plot(xs, [sum(v) / len(v) for v in vals], "-o", label=m, ms=4)
            ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], color=line.get_color(), alpha=0.15)
            for x, v in zip(xs, vals):
                ax.scatter([x] * len(v), v, color=line.get_color(), s=8, alpha=0.6)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate (auto: initial guess)")
        ax.set_ylabel("final held-out sampled accuracy (%)")
        ax.set_title(f"{opt}: mean, seeds (dots), min-max band")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no finished run yet", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(roots: list[Path], out: Path) -> tuple[str, Path | None]:
    points = collect(find_runs(roots))
    if not points:
        raise SystemExit(f"lr_sensitivity: no run folders (config.yaml) under {', '.join(map(str, roots))}")
    text = tables(points)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(points, out / "lr_sensitivity.png") if any(p["final"] for p in points.values()) else None
    n_done = sum(len(p["seeds"]) for p in points.values())
    n_open = sum(len(p["missing"]) for p in points.values())
    head = (f"# Learning-rate sensitivity (generated)\n\nGenerated by `python benchmarks/lr_sensitivity.py report "
            f"{' '.join(map(str, roots))} --out {out}` from {n_done} finished run folders ({n_open} unfinished, "
            "listed as such). 'best' is the maximum over the run's evaluations including step 0, so a collapsed "
            "run's best is its starting accuracy.\n\n" + ("![lr sensitivity](lr_sensitivity.png)\n\n" if png else ""))
    (out / "lr_sensitivity.md").write_text(head + text + "\n" + configurations(points), encoding="utf-8")
    return text, png


BEGIN, END = "<!-- lr-sensitivity: generated by benchmarks/lr_sensitivity.py; begin -->", "<!-- lr-sensitivity: end -->"


def results_section(md: str, image_dir: str) -> str:
    """The generated ``lr_sensitivity.md`` as a section of another document: its title becomes a level-2
    heading and the image path is taken relative to that document (``image_dir``), between markers."""
    lines = md.strip().splitlines()
    title = lines[0].lstrip("# ").strip() if lines and lines[0].startswith("# ") else "Learning-rate sensitivity"
    body = "\n".join(lines[1:] if lines and lines[0].startswith("# ") else lines)
    body = body.replace("](lr_sensitivity.png)", f"]({image_dir}/lr_sensitivity.png)")
    return f"{BEGIN}\n## {title}\n{body.rstrip()}\n{END}"


def splice(doc: Path, section: str) -> None:
    """Replace the marked section of ``doc`` with ``section`` (:func:`results_section`'s block, markers
    included); without markers, insert it before the document's ``## Reading`` heading (or at its end)."""
    body = section.removeprefix(BEGIN + "\n").removesuffix("\n" + END)
    doc_sections.splice(doc, BEGIN, END, body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grids", help="write the oblr compare grid files")
    g.add_argument("--out", type=Path, default=Path("configs/lr-sweep"))
    r = sub.add_parser("report", help="table, PNG and markdown from run folders")
    r.add_argument("roots", type=Path, nargs="+")
    r.add_argument("--out", type=Path, default=Path("outputs/lr_sensitivity"))
    r.add_argument("--results-doc", type=Path, help="also put the tables and plot into this markdown file "
                   "(e.g. docs/results.md), between markers, replacing an earlier copy")
    args = ap.parse_args(argv)
    if args.cmd == "grids":
        for p in write_grids(args.out):
            print(p)
        return 0
    text, png = report(args.roots, args.out)
    print(text)
    print(f"markdown: {args.out / 'lr_sensitivity.md'}" + (f"; plot: {png}" if png else "; no finished run to plot"))
    if args.results_doc:
        import os

        image_dir = os.path.relpath(args.out, args.results_doc.parent)
        splice(args.results_doc, results_section((args.out / "lr_sensitivity.md").read_text(encoding="utf-8"),
                                                 image_dir))
        print(f"updated the lr-sensitivity section of {args.results_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
