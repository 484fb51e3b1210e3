"""benchmarks/paper_regime_report.py: the paper-regime grid's rows, statistics and verdicts, recomputed by hand
from synthetic run folders."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import paper_regime_report as prr  # noqa: E402

from oblr.experiments.stats import welch  # noqa: E402


def _run(root: Path, name: str, seed: int, *, baseline="grpo", schedule="constant", lr=0.1, ema=0.9, n=128,
         final=None, lrs=(0.1, 0.1), evals=((0, 0.2), (50, 0.3)), optimizer="sgd", steps=50, task="arithmetic",
         greedy=0.5, options=None, logged=None, eta_min=0.0) -> Path:
    d = root / name / f"seed{seed}"
    d.mkdir(parents=True)
    cfg = {"task": {"name": task}, "optim": {"optimizer": optimizer, "lr": lr, "snr_ema": ema, "eta_min": eta_min},
           "algorithm": {"baseline": baseline, "lr_schedule": schedule, **({"schedule_options": options}
                                                                            if options is not None else {})},
           "rollout": {"prompts_per_step": n, "group_size": 8}, "train": {"seed": seed, "steps": steps}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"step": i + 1, "optim/lr": x, "time/step": 2.0 + i, **({"snr/factor": x / lr} if schedule == "snr"
                                                                     else {}), **(logged or {})}
            for i, x in enumerate(lrs)]
    rows += [{"step": s, "eval/accuracy_sampled": a} for s, a in evals]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    if final is not None:
        (d / "summary.json").write_text(json.dumps({"eval_accuracy_final": final, "eval_accuracy_greedy_final": greedy,
                                                    "eval_accuracy_initial": 0.2}))
    return d


def test_rows_statistics_and_verdicts_by_hand(tmp_path):
    for s, f in enumerate((0.30, 0.32, 0.34)):
        _run(tmp_path, "grpo-0.1", s, lr=0.1, final=f)
    for s, f in enumerate((0.20, 0.21, 0.22)):
        _run(tmp_path, "grpo-1", s, lr=1.0, final=f)
    snr = (0.37, 0.38, 0.39)
    for s, f in enumerate(snr):  # half the steps at lr 0; best eval at step 50
        _run(tmp_path, "snr-batch-3", s, baseline="oblr", schedule="snr", lr=3.0, ema=0.0, final=f, lrs=(0.0, 1.5),
             evals=((0, 0.2), (25, 0.4), (50, 0.3)))
    _run(tmp_path, "auto-1", 0, baseline="oblr", schedule="auto", lr=1.0, final=0.25)
    _run(tmp_path, "auto-1", 1, baseline="oblr", schedule="auto", lr=1.0)  # unfinished
    _run(tmp_path, "grpo-0.1-n16", 0, lr=0.1, n=16, final=0.9)  # another N: its own panel, not GRPO's best here
    _run(tmp_path / "long", "grpo-0.1", 0, lr=0.1, final=0.8, steps=100)  # another length: another budget, ditto
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    assert set(points) == {("arithmetic", "sgd", 128, 50, "grpo-const", 0.1), ("arithmetic", "sgd", 128, 50, "grpo-const", 1.0),
                           ("arithmetic", "sgd", 128, 50, "oblr-snr-batch", 3.0), ("arithmetic", "sgd", 128, 50, "oblr-auto", 1.0),
                           ("arithmetic", "sgd", 16, 50, "grpo-const", 0.1), ("arithmetic", "sgd", 128, 100, "grpo-const", 0.1)}
    lr, best = prr.best_grpo(points, ("arithmetic", "sgd", 128, 50))
    assert lr == 0.1 and best["final"] == [0.30, 0.32, 0.34]
    p = points[("arithmetic", "sgd", 128, 50, "oblr-snr-batch", 3.0)]
    assert p["lr0_share"] == 0.5 and p["lr_mean"] == 0.75 and math.isclose(p["factor_mean"], 0.25)
    assert p["best_step"] == [25, 25, 25]
    se = math.sqrt(statistics.variance([37, 38, 39]) / 3 + statistics.variance([30, 32, 34]) / 3)
    # Welch: 6.0 / 1.3 = 4.6 standard errors, beyond Student's t at 2.9 degrees of freedom (about 3.2)
    assert prr.verdict_of(p, best) == f"beats (+{38 - 32:.1f} ± {se:.1f})"
    auto = points[("arithmetic", "sgd", 128, 50, "oblr-auto", 1.0)]
    assert auto["missing"] == [1] and prr.verdict_of(auto, best) == "one seed (-7.0; no verdict)"
    md = prr.tables(points)
    assert "#### arithmetic, sgd (N = 128 x G = 8, 50 steps)" in md and "#### arithmetic, sgd (N = 16" in md
    assert "#### arithmetic, sgd (N = 128 x G = 8, 100 steps)" in md
    assert "| oblr-snr-batch | 3 | 38.0 ± 1.0 (3) | 50.0 ± 0.0 | 25, 25, 25 | 0.75 | 50 % | 0.250 | beats" in md
    assert "25.0 (1); unfinished seeds [1]" in md
    assert "| grpo-const | 1 | 21.0 ± 1.0 (3) |" in md and "behind (-11.0" in md


def test_a_run_kept_without_its_metrics_shows_dashes_not_none(tmp_path):
    # committed sweeps that keep only config.yaml and summary.json: no best step, no lr statistics
    for s, f in enumerate((0.30, 0.32)):
        (_run(tmp_path, "grpo-0.1", s, lr=0.1, final=f) / "metrics.jsonl").unlink()
    md = prr.tables({k: prr.point(v) for k, v in prr.collect([tmp_path]).items()})
    row = next(line for line in md.splitlines() if line.startswith("| grpo-const | 0.1 |"))
    assert "| 31.0 ± 1.4 (2) | 50.0 ± 0.0 | -, - | - | - | - |" in row and "None" not in md


def test_report_writes_files_and_its_own_section(tmp_path):
    runs = tmp_path / "runs"
    for s in (0, 1):
        _run(runs, "grpo-0.1", s, final=0.3 + 0.01 * s)
    doc = tmp_path / "results.md"
    doc.write_text("# R\n\n## Reading\n\ntext\n")
    out = tmp_path / "out"
    assert prr.main(["--runs", str(runs), "--out", str(out), "--results-doc", str(doc)]) == 0
    assert (out / "grid.png").stat().st_size > 0 and "grpo-const" in (out / "grid.md").read_text()
    text = doc.read_text()
    assert text.index(prr.BEGIN) < text.index(prr.END) < text.index("## Reading")
    assert f"{out}/grid.png" in text


def test_needed_rates_by_hand(tmp_path):
    # arithmetic: best GRPO rate 0.1; the SNR rule's best row (eta_max 1, factor 0.5) -> needs 0.2
    _run(tmp_path, "a-grpo-0.1", 0, lr=0.1, final=0.4)
    _run(tmp_path, "a-grpo-1", 0, lr=1.0, final=0.2)
    _run(tmp_path, "a-snr-1", 0, baseline="oblr", schedule="snr", lr=1.0, final=0.38, lrs=(0.5, 0.5))
    _run(tmp_path, "a-snr-10", 0, baseline="oblr", schedule="snr", lr=10.0, final=0.1, lrs=(9.0, 9.0))  # worse row
    # countdown: best GRPO rate 1; the rule's factor 0.1 at eta_max 1 -> needs 10
    _run(tmp_path, "c-grpo-1", 0, lr=1.0, final=0.3, task="countdown")
    _run(tmp_path, "c-grpo-0.1", 0, lr=0.1, final=0.2, task="countdown")
    _run(tmp_path, "c-snr-1", 0, baseline="oblr", schedule="snr", lr=1.0, final=0.25, lrs=(0.1, 0.1), task="countdown")
    _run(tmp_path, "x-grpo-1", 0, lr=1.0, final=0.3, task="countdown", n=16)  # another N: one task, no table
    # a factor of 0 (every step at lr 0) on countdown's most accurate EMA row: skipped, not divided by
    _run(tmp_path, "c-snr-3", 0, baseline="oblr", schedule="snr", lr=3.0, final=0.29, lrs=(0.0, 0.0), task="countdown")
    # the current-batch rule on arithmetic only: no row; word_problems has GRPO but no EMA rule: a "-" cell
    _run(tmp_path, "a-batch-1", 0, baseline="oblr", schedule="snr", ema=0.0, lr=1.0, final=0.3, lrs=(0.5, 0.5))
    _run(tmp_path, "w-grpo-1", 0, lr=1.0, final=0.3, task="word_problems")
    _run(tmp_path, "w-grpo-0.1", 0, lr=0.1, final=0.2, task="word_problems")
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    md = prr.needed_rates(points)
    assert md.count("#### The eta_max each rule needed") == 1 and "(sgd, N = 128, 50 steps)" in md
    assert "| rule | arithmetic | countdown | word_problems | spread (max / min) |" in md
    assert "| fixed rate: the best GRPO rate | 0.1 | 1 | 1 | 10.0x |" in md
    assert "| oblr-snr-ema: best rate / mean factor | 0.2 (factor 0.500 at 1) | 10 (factor 0.100 at 1) | - | 50.0x |" in md
    assert "oblr-snr-batch" not in md  # a rule on fewer than two tasks gets no row
    assert prr.needed_rates({k: v for k, v in points.items() if k[0] == "arithmetic"}) == ""
    assert prr._rate(158.7) == "159" and prr._rate(0.00068) == "0.00068"


def test_greedy_verdict_is_against_the_grpo_rate_best_by_greedy_accuracy(tmp_path):
    # by sampled accuracy GRPO's best rate is 1; by greedy it is 0.1, and the kl row is judged against each
    for s, (f, g) in enumerate(((0.30, 0.50), (0.32, 0.52), (0.34, 0.54))):
        _run(tmp_path, "grpo-0.1", s, lr=0.1, final=f, greedy=g)
    for s, (f, g) in enumerate(((0.40, 0.40), (0.41, 0.42), (0.42, 0.44))):
        _run(tmp_path, "grpo-1", s, lr=1.0, final=f, greedy=g)
    for s, (f, g) in enumerate(((0.40, 0.60), (0.41, 0.61), (0.42, 0.62))):
        _run(tmp_path, "kl-1", s, baseline="oblr", schedule="kl", lr=1.0, final=f, greedy=g)
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    panel = ("arithmetic", "sgd", 128, 50)
    assert prr.best_grpo(points, panel)[0] == 1.0 and prr.best_grpo(points, panel, "greedy_final")[0] == 0.1
    kl = points[(*panel, "oblr-kl", 1.0)]
    se = math.sqrt(statistics.variance([60, 61, 62]) / 3 + statistics.variance([50, 52, 54]) / 3)
    assert prr.verdict_of(kl, prr.best_grpo(points, panel, "greedy_final")[1], "greedy_final") == \
        f"beats (+{61 - 52:.1f} ± {se:.1f})"
    md = prr.tables(points)
    assert "| oblr-kl | 1 | 41.0 ± 1.0 (3) | 61.0 ± 1.0 |" in md and "| within noise (+0.0 ± 0.8) | beats (+9.0" in md
    assert "| grpo-const | 0.1 | 32.0 ± 2.0 (3) | 52.0 ± 2.0 |" in md and "| behind (-9.0 ± 1.3) | - |" in md
    assert "By greedy accuracy: 0.1 (52.0 ± 2.0 greedy)." in md


def test_a_kl_row_is_named_by_its_target_as_logged_else_as_configured(tmp_path):
    """The default target changed between commits, so a kl run is named by the target it logged (a run without
    a logged target by its config's option, or plain oblr-kl without one); rows sort after the other methods."""
    _run(tmp_path, "grpo", 0, lr=0.1, final=0.3)
    _run(tmp_path, "kl-old-default", 0, baseline="oblr", schedule="kl", lr=1.0, final=0.31, options={},
         logged={"kl/target": 0.003})
    _run(tmp_path, "kl-target", 0, baseline="oblr", schedule="kl", lr=1.0, final=0.33, options={"target": 0.0015},
         logged={"kl/target": 0.0015})
    _run(tmp_path, "kl-not-logged", 0, baseline="oblr", schedule="kl", lr=3.0, final=0.32, options={"target": 0.0015})
    _run(tmp_path, "kl-nothing", 0, baseline="oblr", schedule="kl", lr=10.0, final=0.2, options={})
    _run(tmp_path, "snr", 0, baseline="oblr", schedule="snr", lr=1.0, final=0.2)
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    assert {(k[4], k[5]) for k in points} == {("grpo-const", 0.1), ("oblr-kl-target0.003", 1.0),
                                              ("oblr-kl-target0.0015", 1.0), ("oblr-kl-target0.0015", 3.0),
                                              ("oblr-kl", 10.0), ("oblr-snr-ema", 1.0)}
    md = prr.tables(points)
    rows = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines() if line.startswith("| ") and "---" not in line
            and not line.startswith("| method")]
    assert rows == ["grpo-const", "oblr-snr-ema", "oblr-kl", "oblr-kl-target0.0015", "oblr-kl-target0.0015",
                    "oblr-kl-target0.003"]
    assert prr.is_tuning_free("oblr-kl-target0.0015") and not prr.is_tuning_free("grpo-const")


def test_a_run_whose_summary_says_interrupted_is_unfinished(tmp_path):
    for s, f in enumerate((0.30, 0.32)):
        _run(tmp_path, "grpo-0.1", s, lr=0.1, final=f)
    cut = _run(tmp_path, "grpo-0.1", 2, lr=0.1, final=0.05)  # stopped at step 2 of 50: its summary says so
    summary = json.loads((cut / "summary.json").read_text())
    (cut / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    (p,) = [prr.point(v) for v in prr.collect([tmp_path]).values()]
    assert p["final"] == [0.30, 0.32] and p["seeds"] == [0, 1] and p["missing"] == [2]


def test_block_means_and_the_block_from_which_a_run_is_flat():
    evals = [(0, 0.10), (50, 0.40), (100, 0.50), (150, 0.60), (200, 0.62), (250, 0.63), (300, 0.65)]
    means = prr.block_means(evals, 300)
    assert [round(100 * m, 6) for m in means] == [45.0, 61.0, 64.0]  # the start evaluation is in no block
    assert prr.plateau_block(means) == 2  # 61.0 is 3.0 below the best block, 64.0: flat only from the third
    assert prr.plateau_block([0.45, 0.61, 0.625, 0.64]) == 2  # 62.5 within 2 of 64.0
    assert prr.plateau_block(means, tol=0.5) == 2  # the last block: still improving
    assert prr.block_means([(0, 0.1), (100, 0.5)], 300) == [0.5, None, None]  # unfinished: no evaluations yet
    assert prr.plateau_block([None, None]) is None


def test_long_runs_get_a_table_and_curves_and_short_runs_do_not(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "grpo-0.1", 0, lr=0.1, final=0.3)  # 50 steps: not in the long-run table
    _run(runs, "grpo-long", 0, lr=0.1, steps=300, final=0.6,
         evals=((0, 0.2), (100, 0.5), (150, 0.55), (200, 0.6), (300, 0.59)))
    _run(runs, "snr-long", 1, baseline="oblr", schedule="snr", lr=3.0, steps=300,  # unfinished at step 2
         evals=((0, 0.2), (100, 0.45)))
    raw = prr.collect([runs])
    md = prr.long_runs(raw)
    lines = [line for line in md.splitlines() if line.startswith("| arithmetic")]
    assert len(lines) == 2 and "| start | steps 1-100 | steps 101-200 | steps 201-300 | best eval (step) |" in md
    # blocks: 50.0; mean(55, 60) = 57.5 (+7.5); 59.0 (+1.5): 57.5 is within 2 of 59.0, so flat from 101-200
    assert lines[0] == ("| arithmetic | sgd | grpo-const | 0.1 | 0 | 300 | 20.0 | 50.0 | 57.5 (+7.5) | 59.0 (+1.5) "
                        "| 60.0 (200) | 101-200 |")
    assert lines[1] == ("| arithmetic | sgd | oblr-snr-ema | 3 | 1 | 300 (unfinished: 2 steps) | 20.0 | 45.0 | - | - "
                        "| 45.0 (100) | 1-100 |")
    _run(runs, "grpo-rising", 0, lr=0.3, steps=200, final=0.6, evals=((0, 0.2), (100, 0.5), (200, 0.6)))
    rising = next(line for line in prr.long_runs(prr.collect([runs])).splitlines() if "| 0.3 |" in line)
    assert rising.endswith("| 50.0 | 60.0 (+10.0) | - | 60.0 (200) | still improving |")
    out = tmp_path / "out"
    assert prr.main(["--runs", str(runs), "--out", str(out)]) == 0
    assert (out / "curves.png").stat().st_size > 0 and "How long the runs keep improving" in (out / "grid.md").read_text()
    short = tmp_path / "short"
    _run(short, "grpo-0.1", 0, lr=0.1, final=0.3)
    assert prr.long_runs(prr.collect([short])) == ""
    assert prr.main(["--runs", str(short), "--out", str(tmp_path / "out2")]) == 0
    assert not (tmp_path / "out2" / "curves.png").exists()


def test_the_factor_over_the_run_by_hand(tmp_path):
    _run(tmp_path, "grpo-1", 0, lr=1.0, final=0.40, steps=100)
    _run(tmp_path, "grpo-1", 1, lr=1.0, final=0.42, steps=100)
    # factor 0.5 on steps 1-10, 0.2 on 11-50, 0.1 on 51-100 (lr = eta_max 3 x factor); a second seed at 0.3 / 0.2 / 0.05
    _run(tmp_path, "snr-3", 0, baseline="oblr", schedule="snr", lr=3.0, steps=100, final=0.35,
         lrs=[1.5] * 10 + [0.6] * 40 + [0.3] * 50)
    _run(tmp_path, "snr-3", 1, baseline="oblr", schedule="snr", lr=3.0, steps=100, final=0.37,
         lrs=[0.9] * 10 + [0.6] * 40 + [0.15] * 50)
    _run(tmp_path, "snr-short", 0, baseline="oblr", schedule="snr", lr=10.0, steps=100, final=0.1)  # 2 steps logged
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    md = prr.factor_over_run(points)
    rows = [line for line in md.splitlines() if line.startswith("| arithmetic")]
    assert rows == ["| arithmetic | sgd | 100 | oblr-snr-ema | 3 | 2 | 0.400 | 0.200 | 0.075 | 0.19 | 36.0 | 41.0 (at 1) |"]
    assert prr.factor_over_run({k: p for k, p in points.items() if k[4] == "grpo-const"}) == ""


def test_a_rule_with_an_lr_floor_is_its_own_row_after_its_rule_and_in_the_factor_table(tmp_path):
    """optim.eta_min > 0 makes another rule (the annealing test): its rows are never pooled with the rule's."""
    _run(tmp_path, "grpo-1", 0, lr=1.0, final=0.40, steps=100)
    _run(tmp_path, "snr-3", 0, baseline="oblr", schedule="snr", lr=3.0, steps=100, final=0.35, lrs=[1.5] * 100)
    _run(tmp_path, "snr-3-floor", 0, baseline="oblr", schedule="snr", lr=3.0, eta_min=0.3, steps=100, final=0.38,
         lrs=[1.5] * 10 + [0.3] * 90)
    _run(tmp_path, "snr-3-floor-batch", 0, baseline="oblr", schedule="snr", ema=0.0, lr=3.0, eta_min=0.3, steps=100,
         final=0.36, lrs=[0.6] * 100)
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    assert {(k[4], k[5]) for k in points} == {("grpo-const", 1.0), ("oblr-snr-ema", 3.0),
                                              ("oblr-snr-ema-floor0.1", 3.0), ("oblr-snr-batch-floor0.1", 3.0)}
    assert prr.base_method("oblr-snr-ema-floor0.1") == "oblr-snr-ema" and prr.is_tuning_free("oblr-snr-ema-floor0.1")
    rows = [line.split(" | ")[0].lstrip("| ") for line in prr.tables(points).splitlines()
            if line.startswith("| ") and "---" not in line and not line.startswith("| method")]
    assert rows == ["grpo-const", "oblr-snr-batch-floor0.1", "oblr-snr-ema", "oblr-snr-ema-floor0.1"]
    md = prr.factor_over_run(points)
    assert "| arithmetic | sgd | 100 | oblr-snr-ema-floor0.1 | 3 | 1 | 0.500 | 0.100 | 0.100 | 0.20 | 38.0 | 40.0 (at 1) |" in md


def test_the_rules_against_the_fixed_rates_around_their_mean_rate_by_hand(tmp_path):
    """GRPO at 0.1 / 1 / 10 (30 / 40 / 20 %); a rule applying 0.3 on average at 45 % is above both neighbours
    (0.1, 1), one applying 3 at 25 % between (1: 40, 10: 20), one applying 0.5 at 20 % below both, one at
    exactly 1 compared with that rate alone, one applying 0.01 outside the sweep."""
    for lr, acc in ((0.1, 0.30), (1.0, 0.40), (10.0, 0.20)):
        _run(tmp_path, f"grpo-{lr}", 0, lr=lr, final=acc)
    _run(tmp_path, "above", 0, baseline="oblr", schedule="snr", lr=3.0, final=0.45, lrs=(0.2, 0.4))
    _run(tmp_path, "between", 0, baseline="oblr", schedule="snr", lr=30.0, final=0.25, lrs=(3.0, 3.0))
    _run(tmp_path, "below", 0, baseline="oblr", schedule="snr", lr=10.0, final=0.20, ema=0.0, lrs=(0.5, 0.5))
    _run(tmp_path, "exact", 0, baseline="oblr", schedule="kl", lr=0.2, final=0.43, lrs=(1.0, 1.0),
         options={"target": 0.003})
    _run(tmp_path, "outside", 0, baseline="oblr", schedule="auto", lr=0.001, final=0.1, lrs=(0.01, 0.01))
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    assert prr.grpo_bracket(points, ("arithmetic", "sgd", 128, 50), 0.3) == (0.1, 0.30, 1.0, 0.40)
    assert prr.grpo_bracket(points, ("arithmetic", "sgd", 128, 50), 1.0) == (1.0, 0.40, 1.0, 0.40)
    assert prr.grpo_bracket(points, ("arithmetic", "sgd", 128, 50), 20.0) is None
    md = prr.against_mean_rate(points)
    rows = {tuple(line.split(" | ")[2:4]): line.split(" | ")[4:] for line in md.splitlines()
            if line.startswith("| arithmetic")}
    # columns after (method, rate): seeds, mean lr applied, final %, GRPO around it, the row against both
    assert rows[("oblr-snr-ema", "3")] == ["1", "0.3", "45.0", "0.1 (30.0), 1 (40.0)", "above both |"]
    assert rows[("oblr-snr-ema", "30")] == ["1", "3", "25.0", "1 (40.0), 10 (20.0)", "between |"]
    assert rows[("oblr-snr-batch", "10")][-2:] == ["0.1 (30.0), 1 (40.0)", "below both |"]
    assert rows[("oblr-kl-target0.003", "0.2")][-2:] == ["1 (40.0)", "above both |"]
    assert rows[("oblr-auto", "0.001")][-2:] == ["outside GRPO's swept rates", "- |"]
    assert "Rows inside GRPO's swept rates: 4: 2 above both, 1 between (or within 2 points of one), 1 below both." in md
    assert prr.against_mean_rate({k: p for k, p in points.items() if k[4] == "grpo-const"}) == ""


def test_the_goal_row_by_row_by_hand(tmp_path):
    """Two tasks, GRPO's best at 0.1 on both (30 / 32 / 34 %); per setting of a rule (the same rate on both tasks):
    level on both, level on one and ahead on the other (the goal's first two conditions met), ended below its start
    (20 %) on one, five points or more below on one seed, ahead over two seeds only (open), and open (one seed within a
    few points, a task not run; level over two seeds: Welch's test on two seeds has too little power to count)."""
    for task in ("arithmetic", "countdown"):
        for s, f in enumerate((0.30, 0.32, 0.34)):
            _run(tmp_path / task, "grpo-0.1", s, lr=0.1, final=f, task=task)
        _run(tmp_path / task, "grpo-1", 0, lr=1.0, final=0.25, task=task)
        for s, f in enumerate((0.31, 0.32, 0.33)):
            _run(tmp_path / task, "kl-1", s, baseline="oblr", schedule="kl", lr=1.0, final=f, task=task,
                 options={"target": 0.003})
        ahead = (0.40, 0.41, 0.42) if task == "countdown" else (0.31, 0.33, 0.35)
        for s, f in enumerate(ahead):
            _run(tmp_path / task, "snr-3", s, baseline="oblr", schedule="snr", lr=3.0, final=f, task=task)
        _run(tmp_path / task, "snr-30", 0, baseline="oblr", schedule="snr", lr=30.0, task=task,
             final=0.10 if task == "arithmetic" else 0.30)
        _run(tmp_path / task, "auto-1", 0, baseline="oblr", schedule="auto", lr=1.0, task=task,
             final=0.25 if task == "countdown" else 0.31)
    _run(tmp_path / "arithmetic", "auto-10", 0, baseline="oblr", schedule="auto", lr=10.0, final=0.31)
    for task, finals in (("arithmetic", (0.31, 0.32, 0.33)), ("countdown", (0.41, 0.42))):  # ahead, but over 2 seeds
        for s, f in enumerate(finals):
            _run(tmp_path / task, "ema-1", s, baseline="oblr", schedule="snr", lr=1.0, final=f, task=task)
    for task, finals in (("arithmetic", (0.31, 0.33)), ("countdown", (0.31, 0.32, 0.33))):  # level, on 2 seeds on one
        for s, f in enumerate(finals):
            _run(tmp_path / task, "ema-10", s, baseline="oblr", schedule="snr", lr=10.0, final=f, task=task)
    _run(tmp_path / "other", "grpo-0.1", 0, lr=0.1, final=0.3, task="other", optimizer="adamw")  # one task: no table
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    md = prr.goal_matrix(points)
    assert "#### The goal row by row: sgd, N = 128, 50 steps" in md and "adamw" not in md
    rows = {tuple(line.split(" | ")[:2]): line.split(" | ")[2:] for line in md.splitlines() if line.startswith("| oblr")}
    se = math.sqrt(statistics.variance([31, 32, 33]) / 3 + statistics.variance([30, 32, 34]) / 3)
    lo, hi = welch([31, 32, 33], [30, 32, 34]).interval  # what the level row's seeds do not rule out
    assert rows[("| oblr-kl-target0.003", "1")] == [f"level (+0.0 ± {se:.1f}) [3]"] * 2 + [
        f"level on every task, ahead on none (95 % intervals: arithmetic {lo:+.1f} to {hi:+.1f}, countdown {lo:+.1f} to "
        f"{hi:+.1f}) |"]
    assert f"{hi:+.1f}" == "+4.2"  # Welch's df 2.9: t = 3.2 standard errors of 1.3
    assert rows[("| oblr-snr-ema", "3")][1].startswith("ahead (+9.0 ± ")
    assert rows[("| oblr-snr-ema", "3")][2] == "**met**: level on every task, ahead on countdown |"
    assert rows[("| oblr-snr-ema", "30")] == ["1 seed: -22.0 [1]; ended below its start (10.0 %)", "1 seed: -2.0 [1]",
                                             "not level: below its start on arithmetic |"]
    assert rows[("| oblr-auto", "1")][2] == "not level on few seeds: 5+ points below on countdown |"
    assert rows[("| oblr-auto", "10")] == ["1 seed: -1.0 [1]", "-",
                                          "open (fewer than 3 seeds a side, or not run, on arithmetic, countdown) |"]
    assert rows[("| oblr-snr-ema", "10")][0].startswith("level (+0.0 ± ") and rows[("| oblr-snr-ema", "10")][0].endswith("[2]")
    assert rows[("| oblr-snr-ema", "10")][2] == "open (fewer than 3 seeds a side, or not run, on arithmetic) |"
    assert rows[("| oblr-snr-ema", "1")][2] == ("level on every task; ahead on countdown over 2 seeds (fewer than 3 on "
                                               "a side: open) |")
    assert ("Settings: 7: 1 meet the goal's first two conditions, 1 are level on every task and ahead on none, 1 are "
            "behind or below their start on at least one task, 1 are 5 points or more below on fewer than 3 seeds, 1 "
            "are level on every task and ahead on one over fewer than 3 seeds on a side, 2 are open" in md)
    assert prr.goal_matrix({k: p for k, p in points.items() if k[0] == "arithmetic"}) == ""
    # what the seeds can see: GRPO's best spreads 2 points over 3 seeds; 3 seeds a side of that spread: Welch's df is
    # 4, so the line is t(0.975, 4) x 2 x sqrt(2/3) = 4.5 points; 5 seeds against 3: 3.9
    assert prr.detectable(2.0, 3, 3) == pytest.approx(2.7764451 * 2 * math.sqrt(2 / 3), rel=1e-6)
    assert ("What these seeds can see (Welch's test at 5 %, equal spreads): arithmetic: GRPO's best spreads 2.0 points over 3 seeds, "
            "so a row of that spread is told from it from 4.5 points over 3 seeds, 3.9 over 5; countdown:" in md)


def test_a_cosine_row_is_named_with_its_warmup_and_rows_are_tested_against_it(tmp_path):
    """GRPO fixed at 0.1 (30 / 32 / 34 %) and on a cosine schedule from 0.1 after 10 warm-up steps (36 / 37 / 38 %);
    a rule at 40 / 41 / 42 % is ahead of both; the fixed rate is behind the schedule; a one-seed rule is not listed."""
    for s, f in enumerate((0.30, 0.32, 0.34)):
        _run(tmp_path, "grpo-0.1", s, lr=0.1, final=f)
    for s, f in enumerate((0.36, 0.37, 0.38)):
        d = _run(tmp_path, "grpo-cos", s, lr=0.1, final=f, schedule="cosine")
        cfg = yaml.safe_load((d / "config.yaml").read_text())
        cfg["optim"]["warmup_steps"] = 10
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    for s, f in enumerate((0.40, 0.41, 0.42)):
        _run(tmp_path, "auto-1", s, baseline="oblr", schedule="auto", lr=1.0, final=f)
    _run(tmp_path, "auto-10", 0, baseline="oblr", schedule="auto", lr=10.0, final=0.5)
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    assert ("arithmetic", "sgd", 128, 50, "grpo-cosine-warmup10", 0.1) in points
    assert prr.best_grpo(points, ("arithmetic", "sgd", 128, 50))[0] == 0.1  # the schedule is not a fixed rate
    md = prr.against_schedules(points)
    assert "#### Against GRPO on a schedule: arithmetic, sgd (N = 128, 50 steps)" in md
    assert "| vs grpo-cosine-warmup10 at 0.1 (37.0 ± 1.0 (3)) |" in md
    rows = {line.split(" | ")[0]: line.split(" | ")[1:] for line in md.splitlines() if line.startswith("| grpo-const")
            or line.startswith("| oblr")}
    se_fixed = math.sqrt(statistics.variance([30, 32, 34]) / 3 + statistics.variance([36, 37, 38]) / 3)
    assert rows["| grpo-const (best fixed rate)"] == ["0.1", "32.0 ± 2.0 (3)", f"behind (-5.0 ± {se_fixed:.1f}) |"]
    se_auto = math.sqrt(statistics.variance([40, 41, 42]) / 3 + statistics.variance([36, 37, 38]) / 3)
    assert rows["| oblr-auto"] == ["1", "41.0 ± 1.0 (3)", f"beats (+4.0 ± {se_auto:.1f}) |"]
    assert "| 10 |" not in md  # one seed: not listed
    assert prr.against_schedules({k: p for k, p in points.items() if "cosine" not in k[4]}) == ""


def test_the_goal_verdicts_paired_by_seed_by_hand(tmp_path):
    """GRPO's best at 0.1 (30 / 32 / 34 % on seeds 0-2) on two tasks; a kl row one point above it seed by seed
    (31 / 33.1 / 35): Welch's test on the 3 + 3 values calls it level, the paired test on the three shared seeds
    ahead, with the seeds moving both rows together (correlation near 1); a row sharing only two seeds with GRPO is
    left out; a fixed-rate row is not tuning-free and is left out."""
    for task in ("arithmetic", "countdown"):
        for s, f in enumerate((0.30, 0.32, 0.34)):
            _run(tmp_path / task, "grpo-0.1", s, lr=0.1, final=f, task=task)
        for s, f in enumerate((0.31, 0.331, 0.35)):
            _run(tmp_path / task, "kl-1", s, baseline="oblr", schedule="kl", lr=1.0, final=f, task=task,
                 options={"target": 0.003})
        for s, f in ((0, 0.3), (1, 0.3), (5, 0.3)):
            _run(tmp_path / task, "snr-3", s, baseline="oblr", schedule="snr", lr=3.0, final=f, task=task)
        for s, f in enumerate((0.31, 0.33, 0.35)):
            _run(tmp_path / task, "oblr-0.1", s, baseline="oblr", lr=0.1, final=f, task=task)
    points = {k: prr.point(v) for k, v in prr.collect([tmp_path]).items()}
    md = prr.paired_check(points)
    a, b = {0: 31.0, 1: 33.1, 2: 35.0}, {0: 30.0, 1: 32.0, 2: 34.0}
    d = [1.0, 1.1, 1.0]
    se = statistics.stdev(d) / math.sqrt(3)
    w = welch(list(a.values()), list(b.values()))
    assert w.word == "within noise"
    rows = [line for line in md.splitlines() if line.startswith("| sgd")]
    assert rows == [f"| sgd | {task} | oblr-kl-target0.003 | 1 | 3 / 3 / 3 | level ({w.diff:+.1f} ± {w.se:.1f}) | "
                    f"ahead ({statistics.fmean(d):+.1f} ± {se:.1f}, df 2) | +1.00 |" for task in ("arithmetic", "countdown")]
    assert ("2 comparisons; the same-seed correlation's median is +1.00 (2 of 2 positive). Verdicts that differ: "
            "sgd arithmetic: oblr-kl-target0.003 at 1 (level by Welch's, ahead paired); sgd countdown: "
            "oblr-kl-target0.003 at 1 (level by Welch's, ahead paired).") in md
    assert prr.paired_check({k: p for k, p in points.items() if k[0] == "arithmetic"}) == ""  # no goal table
