"""benchmarks/lr_sensitivity.py on fake run folders: grids written for oblr compare (valid configs, the
sweep's folder names), points grouped by (optimizer, method, lr) from config.yaml, any number of seeds,
unfinished points marked missing, mean ± std in the table, the PNG and the configuration fragment."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import lr_sensitivity as lrs

from oblr.config import Config, save_config
from oblr.experiments.grid import load_grid, plan_grid


def _fake_run(root: Path, method: str, opt: str, lr: float, seed: int, final: float | None, best=None):
    d = root / lrs.point_name(method, opt, lr) / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = Config()
    for k, v in {**lrs.METHODS[method], "optim.optimizer": opt, "optim.lr": lr, "train.seed": seed,
                 "train.output_dir": str(d)}.items():
        sec, key = k.split(".")
        setattr(getattr(cfg, sec), key, v)
    save_config(cfg, d / "config.yaml")
    if final is not None:
        (d / "summary.json").write_text(json.dumps({"eval_accuracy_final": final,
                                                    "eval_accuracy_best": final if best is None else best}))
    return d


def test_grids_are_valid_oblr_compare_grids_with_the_sweep_names(tmp_path):
    paths = lrs.write_grids(tmp_path)
    assert [p.name for p in paths] == ["grid-grpo-const.yaml", "grid-oblr-snr.yaml", "grid-oblr-auto.yaml",
                                       "grid-oblr-kl.yaml", "grid-core.yaml", "grid-auto-core.yaml", "grid-window.yaml",
                                       "grid-kl-first.yaml"]
    decades = [("adamw", 1e-5), ("adamw", 1e-4), ("adamw", 1e-3), ("adamw", 1e-2), ("sgd", 0.01), ("sgd", 0.1),
               ("sgd", 1.0), ("sgd", 10.0)]
    core = plan_grid(load_grid(paths[4]), tmp_path / "out")  # decade points of both methods, both optimizers
    assert {p.variant for p in core} == {lrs.point_name(m, o, lr) for m in ("grpo-const", "oblr-snr")
                                         for o, lr in decades}
    auto_core = plan_grid(load_grid(paths[5]), tmp_path / "out")
    assert {p.variant for p in auto_core} == {lrs.point_name("oblr-auto", o, lr) for o, lr in decades}
    window = plan_grid(load_grid(paths[6]), tmp_path / "out")  # a subset of the half-decade grids' folders
    half = {p.variant for m in ("grpo-const", "oblr-snr") for p in plan_grid(load_grid(paths[list(lrs.METHODS).index(m)]),
                                                                              tmp_path / "out")}
    assert {p.variant for p in window} <= half and len(window) == 3 * len(lrs.WINDOW_POINTS)
    plan = plan_grid(load_grid(paths[0]), tmp_path / "out")  # validates every config
    assert len(plan) == 14 * 3
    names = {p.variant for p in plan}
    assert {"grpo-const-adamw-lr1e-05", "grpo-const-adamw-lr0.0001", "grpo-const-sgd-lr1", "grpo-const-sgd-lr10"} <= names
    kl_first = plan_grid(load_grid(paths[7]), tmp_path / "out")  # a subset of the kl guesses' folders
    kl_all = {p.variant for p in plan_grid(load_grid(paths[3]), tmp_path / "out")}
    assert {p.variant for p in kl_first} == {"oblr-kl-adamw-lr0.001", "oblr-kl-sgd-lr1"} <= kl_all
    assert {p.cfg.algorithm.lr_schedule for p in kl_first} == {"kl"} and len(kl_first) == 2 * 3
    auto = yaml.safe_load(paths[2].read_text())
    assert {r["algorithm.lr_schedule"] for r in auto["runs"]} == {"auto"} and auto["seeds"] == [0, 1, 2]


def test_report_groups_seeds_marks_missing_and_writes_png_and_markdown(tmp_path, capsys):
    root = tmp_path / "sweep"
    _fake_run(root, "grpo-const", "adamw", 1e-4, 0, 0.40, best=0.45)
    _fake_run(root, "grpo-const", "adamw", 1e-4, 1, 0.50)
    _fake_run(root, "grpo-const", "adamw", 1e-3, 0, 0.0, best=0.2)
    _fake_run(root, "grpo-const", "adamw", 1e-3, 1, None)           # unfinished
    _fake_run(root, "oblr-snr", "adamw", 1e-3, 2, 0.30)              # a single seed
    _fake_run(root, "oblr-auto", "sgd", 1.0, 0, 0.25)
    _fake_run(root, "grpo-const", "sgd", 0.1, 0, None)               # nothing finished at this point
    assert lrs.main(["report", str(root), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| 0.0001 |"))
    assert "45.0 ± 7.1 (2)" in row and "47.5 ± 3.5 (2)" in row        # final 40/50, best 45/50
    row = next(ln for ln in out.splitlines() if ln.startswith("| 0.001 |"))
    assert "0.0 (1)" in row and "unfinished seeds [1]" in row and "30.0 (1)" in row
    assert "| 0.1 | missing | missing; unfinished seeds [0] |" in out
    assert (tmp_path / "out" / "lr_sensitivity.png").stat().st_size > 1000
    md = (tmp_path / "out" / "lr_sensitivity.md").read_text()
    assert "rollout.group_size: 8" in md and "| adamw | oblr-snr | 0.001 | oblr | snr | [2] | [] |" in md


def test_report_on_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no run folders"):
        lrs.main(["report", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="does not exist"):
        lrs.main(["report", str(tmp_path / "nope")])


def test_report_goes_into_the_results_doc_once_and_make_results_doc_keeps_it(tmp_path, capsys):
    """--results-doc puts the generated tables and plot into docs/results.md between markers (before its
    Reading), a second report replaces them instead of adding a copy, and scripts/make_results_doc.py,
    which rewrites the rest of results.md from the grid, keeps the section."""
    root, docs = tmp_path / "sweep", tmp_path / "docs"
    docs.mkdir()
    doc = docs / "results.md"
    doc.write_text("# Results (generated)\n\ntable\n\n## Reading\n\nprose\n")
    _fake_run(root, "grpo-const", "adamw", 1e-4, 0, 0.40)
    args = ["report", str(root), "--out", str(docs / "results"), "--results-doc", str(doc)]
    assert lrs.main(args) == 0
    first = doc.read_text()
    assert first.count(lrs.BEGIN) == 1 and first.index(lrs.END) < first.index("## Reading")
    assert "![lr sensitivity](results/lr_sensitivity.png)" in first and "| 0.0001 | 40.0 (1) |" in first
    assert first.startswith("# Results (generated)\n\ntable\n") and first.endswith("## Reading\n\nprose\n")
    _fake_run(root, "grpo-const", "adamw", 1e-4, 1, 0.50)
    assert lrs.main(args) == 0
    second = doc.read_text()
    assert second.count(lrs.BEGIN) == 1 and "45.0 ± 7.1 (2)" in second and "40.0 (1)" not in second

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import make_results_doc

    assert make_results_doc._lr_sensitivity_section(doc) == second[second.index(lrs.BEGIN):
                                                                   second.index(lrs.END) + len(lrs.END)]
    assert (make_results_doc.LR_BEGIN, make_results_doc.LR_END) == (lrs.BEGIN, lrs.END)
