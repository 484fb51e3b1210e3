"""benchmarks/task_claims.py on fake run folders: the per-task grid is a valid oblr compare grid on that task
(the sweep's folder names, the comparison first), points grouped by (method, lr), the cross-task table's
best fixed rate, auto's worst guess and the beyond-seed-noise verdicts, and mixed protocols refused."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import task_claims as tc

from oblr.config import Config, save_config
from oblr.experiments.grid import load_grid, plan_grid
from oblr.kl_rate import default_target


def _fake_run(root: Path, method: str, lr: float, seed: int, final: float | None, steps: int = 100,
              kl_target: float | None = None, name: str | None = None):
    """A run folder; a kl run logs ``kl_target`` (default: today's default target at the config's N = 16)."""
    d = root / (name or tc.lrs.point_name(method, "adamw", lr)) / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = Config()
    for k, v in {**tc.METHODS[method], "optim.optimizer": "adamw", "optim.lr": lr, "train.seed": seed,
                 "train.steps": steps, "train.output_dir": str(d)}.items():
        sec, key = k.split(".")
        setattr(getattr(cfg, sec), key, v)
    save_config(cfg, d / "config.yaml")
    if method == "oblr-kl":
        target = default_target(cfg.rollout.prompts_per_step) if kl_target is None else kl_target
        (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy_sampled": 0.1}) + "\n"
                                         + json.dumps({"step": 1, "kl/target": target}) + "\n")
    if final is not None:
        (d / "summary.json").write_text(json.dumps({"eval_accuracy_final": final}))
    return d


def test_grid_is_a_valid_compare_grid_on_the_task_with_the_comparison_first(tmp_path):
    path = tc.write_grid("countdown", tmp_path, steps=40)
    plan = plan_grid(load_grid(path), tmp_path / "out")  # validates every config
    assert len(plan) == 15 * 3  # 3 sweep methods x 4 rates, and the comparison's rloo, oblr-const and oblr-kl
    assert {p.cfg.task.name for p in plan} == {"countdown"} and {p.cfg.train.steps for p in plan} == {40}
    first = list(dict.fromkeys(p.variant for p in plan))[:len(tc.COMPARISON)]
    assert first == [tc.lrs.point_name(m, "adamw", lr) for m, lr in tc.COMPARISON]
    assert {"oblr-auto-adamw-lr1e-05", "oblr-snr-adamw-lr0.01", "grpo-const-adamw-lr0.001"} <= {p.variant for p in plan}
    assert {p.cfg.algorithm.lr_schedule for p in plan if p.variant == "oblr-kl-adamw-lr0.001"} == {"kl"}
    only = plan_grid(load_grid(tc.write_grid("countdown", tmp_path, only=("oblr-kl",), name="grid-claims-kl")),
                     tmp_path / "out")
    assert {p.variant for p in only} == {"oblr-kl-adamw-lr0.001"} and (tmp_path / "grid-claims.yaml").is_file()


def test_report_verdicts_best_fixed_rate_and_auto_worst_guess(tmp_path):
    root = tmp_path / "countdown"
    for seed, (g, r, o, s) in enumerate([(0.20, 0.30, 0.40, 0.31), (0.22, 0.31, 0.41, 0.29), (0.21, 0.32, 0.42, 0.30)]):
        _fake_run(root, "grpo-const", 1e-4, seed, g)
        _fake_run(root, "rloo-const", 1e-4, seed, r)
        _fake_run(root, "oblr-const", 1e-4, seed, o)
        _fake_run(root, "oblr-snr", 1e-3, seed, s)
        _fake_run(root, "oblr-kl", 1e-3, seed, g - 0.05)
        _fake_run(root, "grpo-const", 1e-3, seed, 0.25)
        _fake_run(root, "oblr-auto", 1e-5, seed, 0.15 + 0.01 * seed)
        _fake_run(root, "oblr-auto", 1e-2, seed, 0.35)
        if seed < 2:
            _fake_run(root, "oblr-kl", 1e-2, seed, 0.30)  # a second guess, two seeds
    _fake_run(root, "grpo-const", 1e-2, 0, None)  # unfinished
    md = tc.report({"countdown": [root]}, tmp_path / "out")
    row = next(line for line in md.splitlines() if line.startswith("| countdown |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "100"
    assert cells[2].startswith("0.001: 25.0 ± 0.0 (3)")  # the best grpo-const rate
    assert cells[3].startswith("guess 1e-05 of 2: 16.0 ± 1.0 (3)")  # auto's worst initial guess
    assert cells[4] == "guess 0.001 of 2: 16.0 ± 1.0 (3)"  # kl's: 1e-3 below its 1e-2
    # oblr-const vs rloo-const: +10 points, se ~0.8 -> beats; vs grpo-const beats; oblr-snr vs rloo: -1 within noise
    assert cells[5].startswith("beats (+10.0") and cells[6].startswith("beats (+") and cells[7].startswith("within noise")
    assert cells[8].startswith("beats (+")
    # oblr-kl (grpo - 5 points) vs rloo-const: behind; vs grpo-const: -5.0 exactly, se 0.8 -> behind
    assert cells[9].startswith("behind (-15.0") and cells[10].startswith("behind (-5.0 ± 0.8)")
    assert "| oblr-kl | 0.001 | 16.0 ± 1.0 (3) |" in md
    assert "| 0.01 | missing; unfinished [0] | – | 35.0 ± 0.0 (3) | 30.0 ± 0.0 (2) |" in md  # kl: a guess column
    assert (tmp_path / "out" / "task_claims.png").stat().st_size > 1000


def test_kl_runs_at_an_earlier_default_target_are_listed_apart_never_mixed_into_the_kl_column(tmp_path):
    root = tmp_path / "word_problems"
    for seed in range(3):
        _fake_run(root, "grpo-const", 1e-4, seed, 0.30 + 0.01 * seed)
        _fake_run(root, "oblr-kl", 1e-3, seed, 0.31 + 0.01 * seed)  # today's default at N = 16: 1.875e-4
        # the same folder layout, an earlier default (3.75e-4, logged, not configured): its own row
        _fake_run(root, "oblr-kl", 1e-3, seed, 0.10, kl_target=3.75e-4, name="old-kl-adamw-lr0.001")
    md = tc.report({"word_problems": [root]}, tmp_path / "out")
    assert "| oblr-kl | 0.001 | 32.0 ± 1.0 (3) |" in md  # the old runs' 10 % would pull it to 21 %
    assert "oblr-kl-target0.000375 at 0.001: 10.0 ± 0.0 (3)" in md
    # a configured target that is today's default is the oblr-kl column, whatever the folder is called
    cfg = {"algorithm": {"baseline": "oblr", "lr_schedule": "kl", "schedule_options": {"target": 1.875e-4}},
           "rollout": {"prompts_per_step": 16}, "optim": {"optimizer": "adamw"}}
    assert tc.method_of(cfg, tmp_path) == "oblr-kl"
    cfg["optim"]["optimizer"] = "sgd"  # SGD's default is 3e-3 at every N
    assert tc.method_of(cfg, tmp_path) == "oblr-kl-target0.0001875"


def test_a_kl_run_whose_target_cannot_be_told_is_refused_with_its_folder(tmp_path):
    d = _fake_run(tmp_path, "oblr-kl", 1e-3, 0, 0.3)
    (d / "metrics.jsonl").unlink()  # only config.yaml and summary.json kept, no target configured
    with pytest.raises(SystemExit, match=f"{d}: a kl run with no schedule_options.target"):
        tc.collect([tmp_path])


def test_behind_and_too_few_seeds():
    a = {"final": [0.10, 0.11, 0.12], "missing": []}
    b = {"final": [0.30, 0.31, 0.32], "missing": []}
    assert tc.verdict(a, b).startswith("behind (-20.0")
    assert tc.verdict({"final": [0.5], "missing": []}, b) == "too few seeds"
    assert tc.verdict(None, b) == tc.verdict({"final": [], "missing": [0]}, b) == "not run"
    # a finished run with no final accuracy (NaN) is left out, as the cells' mean ± std leave it out
    assert tc.verdict({"final": [0.10, 0.11, 0.12, math.nan], "missing": []}, b) == tc.verdict(a, b)
    assert tc.verdict({"final": [0.10, math.nan], "missing": []}, b) == "too few seeds"


def test_one_task_mixing_protocols_is_refused(tmp_path):
    _fake_run(tmp_path, "grpo-const", 1e-4, 0, 0.2, steps=100)
    _fake_run(tmp_path, "grpo-const", 1e-4, 1, 0.2, steps=200)
    with pytest.raises(SystemExit, match="mix protocols"):
        tc.collect([tmp_path])


def test_splice_replaces_its_section_and_keeps_the_rest(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\nintro\n\n## Reading\n\ntext\n")
    tc.splice(doc, "## The claims per task (generated)\n\n![x](task_claims.png)\nA\n", "results/task-claims")
    tc.splice(doc, "## The claims per task (generated)\n\n![x](task_claims.png)\nB\n", "results/task-claims")
    text = doc.read_text()
    assert text.count(tc.BEGIN) == 1 and "\nB\n" in text and "\nA\n" not in text
    assert "](results/task-claims/task_claims.png)" in text and text.index(tc.END) < text.index("## Reading")


def test_make_results_doc_keeps_the_task_claims_section(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import make_results_doc

    assert (make_results_doc.TC_BEGIN, make_results_doc.TC_END) == (tc.BEGIN, tc.END)
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n## Reading\n\ntext\n")
    tc.splice(doc, "## The claims per task (generated)\n\nbody\n", "results/task-claims")
    kept = make_results_doc._kept_section(doc, make_results_doc.TC_BEGIN, make_results_doc.TC_END)
    assert kept.startswith(tc.BEGIN) and kept.endswith(tc.END) and "body" in kept


def test_the_verdict_is_welchs_t_test_not_twice_the_standard_error():
    """3 seeds a side, the difference 2.4 standard errors: beyond 2 SE, inside Welch's 5 % (critical value ~2.78 at
    4 degrees of freedom), so within noise; at 3.2 SE it is behind. The brackets keep the difference ± its SE."""
    b = {"final": [0.30, 0.31, 0.32], "missing": []}
    se_each = 0.01 / math.sqrt(3)  # the standard error of each mean (std 1 point)
    shift = 2.4 * math.sqrt(2) * se_each
    a = {"final": [x - shift for x in b["final"]], "missing": []}
    assert tc.verdict(a, b) == "within noise (-2.0 ± 0.8)"
    shift = 3.2 * math.sqrt(2) * se_each
    a = {"final": [x - shift for x in b["final"]], "missing": []}
    assert tc.verdict(a, b) == "behind (-2.6 ± 0.8)"
