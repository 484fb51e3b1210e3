"""Run plots, run summaries and multi-seed comparison tables, checked against direct computations on
synthetic metric files (missing keys, NaN/Inf, a truncated last line)."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import yaml

from oblr.experiments.compare import compare_runs, run_stats
from oblr.experiments.report import plot_run
from oblr.experiments.stats import (
    auc_normalized,
    load_run,
    paired,
    run_label,
    seed_correlation,
    spike_count,
    steps_to_target,
    t_cdf,
    t_quantile,
    welch,
)
from oblr.tracking import MetricsLogger

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVAL_EVERY = 5


def _is_png(path) -> bool:
    from matplotlib.image import imread

    if path.read_bytes()[:8] != PNG_MAGIC:
        return False
    img = imread(path)
    return img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def make_run(run_dir, *, seed=0, baseline="oblr", lr_schedule="snr", steps=30, acc_offset=0.0,
             spike_at=None, nan_at=None, truncated_tail=False, config=True):
    """Write a synthetic run; returns the ground-truth arrays used to write it."""
    rng = np.random.default_rng(seed + 100 * len(baseline))
    if config:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(
            {"seed": seed, "algorithm": {"baseline": baseline, "lr_schedule": lr_schedule}}))
    truth = {"steps": [], "grad": [], "adv": [], "reward": [], "eval_steps": [], "acc": [], "greedy": []}
    with MetricsLogger(run_dir) as log:
        for s in range(1, steps + 1):
            g = 1.0 + 0.1 * rng.random()
            if s == spike_at:
                g = 10.0
            if s == nan_at:
                g = math.inf
            reward = 0.2 + 0.5 * s / steps + 0.05 * rng.random()
            adv = 0.1 + 0.01 * rng.random()
            log.log(s, {"train/reward_mean": reward, "train/pass_rate": reward / 2, "optim/grad_norm": g,
                        "optim/lr": 1e-3 * (0.5 + 0.5 * rng.random()), "optim/skipped": int(s == nan_at),
                        "snr/snr": 0.1 * rng.random() + 1e-3, "snr/S": rng.random(), "snr/V": 1 + rng.random(),
                        "snr/factor": 0.5 * rng.random() + 0.01, "weights/mean": 2 + rng.random(),
                        "weights/cv_within_group": 0.3 * rng.random(), "adv/var_across_prompts": adv,
                        "train/response_length_mean": 40 + 10 * rng.random(), "train/entropy": rng.random(),
                        "time/generate": 0.5, "time/norms": 0.2, "time/step": 0.8})
            truth["steps"].append(s)
            truth["reward"].append(reward)
            truth["adv"].append(adv)
            truth["grad"].append(g)
            if s % EVAL_EVERY == 0:
                acc = min(1.0, 0.1 + 0.6 * s / steps + acc_offset + 0.05 * rng.random())
                greedy = math.nan if s == nan_at else acc + 0.02
                log.log(s, {"eval/accuracy_sampled": acc, "eval/accuracy_greedy": greedy})
                truth["eval_steps"].append(s)
                truth["acc"].append(acc)
                truth["greedy"].append(greedy)
    if truncated_tail:
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write('{"step": 999, "train/reward_mean": 0.')
    return {k: np.asarray(v, dtype=float) for k, v in truth.items()}


# --------------------------------------------------------------------------------------- plot_run
def test_plot_run_writes_valid_pngs(tmp_path):
    make_run(tmp_path / "r", nan_at=7, truncated_tail=True)
    paths = plot_run(tmp_path / "r")
    names = sorted(p.stem for p in paths)
    assert names == ["advantages", "eval_accuracy", "grad_norm", "lr_snr", "response", "reward", "time"]
    assert all(p.parent == tmp_path / "r" / "plots" and _is_png(p) for p in paths)


def test_plot_run_skips_missing_keys(tmp_path):
    run = tmp_path / "sparse"
    with MetricsLogger(run) as log:
        log.log(1, {"train/reward_mean": 0.1, "snr/snr": 0.0})  # SNR 0 only: no usable log axis
        log.log(2, {"train/reward_mean": math.nan, "optim/grad_norm": math.nan, "unknown/key": 1.0})
        log.log(3, {"train/reward_mean": 0.3, "snr/snr": 0.0, "eval/accuracy_sampled": 0.5})
    paths = plot_run(run, out_dir=tmp_path / "out")
    # grad norm only NaN -> no grad_norm figure; snr all zero still drawn (on a linear axis)
    assert sorted(p.stem for p in paths) == ["eval_accuracy", "lr_snr", "reward"]
    assert all(_is_png(p) for p in paths)
    empty = tmp_path / "empty"
    with MetricsLogger(empty) as log:
        log.log(0, {"something/else": 1.0})
    assert plot_run(empty) == []


# ---------------------------------------------------------------------------------------- run_stats
def test_run_stats_match_direct_computation(tmp_path):
    t = make_run(tmp_path / "r", steps=40, spike_at=25, nan_at=12, truncated_tail=True)
    assert run_label(tmp_path / "r") == "oblr+snr seed=0"
    rows = load_run(tmp_path / "r")
    s = run_stats(rows, "eval/accuracy_sampled", target=0.9 * float(np.max(t["acc"])))
    assert s["final_acc"] == pytest.approx(t["acc"][-1])
    assert s["best_acc"] == pytest.approx(float(np.max(t["acc"])))
    assert s["auc_acc"] == pytest.approx(np.trapezoid(t["acc"], t["eval_steps"]) / 35)
    ok = np.isfinite(t["greedy"])  # the greedy eval at step 10 was NaN
    sg = run_stats(rows, "eval/accuracy_greedy", target=None)
    assert sg["final_acc"] == pytest.approx(t["greedy"][-1]) and math.isnan(sg["steps_to_target"])
    assert sg["auc_acc"] == pytest.approx(np.trapezoid(t["greedy"][ok], t["eval_steps"][ok]) / 35)
    g = t["grad"][np.isfinite(t["grad"])]
    assert s["grad_norm"] == pytest.approx(g.mean()) and s["grad_norm_spikes"] == 1
    assert s["final_reward"] == pytest.approx(t["reward"][-4:].mean())
    assert s["adv_var"] == pytest.approx(t["adv"].mean())


# --------------------------------------------------------------------------------------- statistics
def test_statistics_helpers():
    steps = np.array([0, 10, 30])
    vals = np.array([0.0, 0.5, 0.9])
    assert auc_normalized(steps, vals) == pytest.approx((0.25 * 10 + 0.7 * 20) / 30)
    assert auc_normalized(np.array([5]), np.array([0.4])) == 0.4
    assert math.isnan(auc_normalized(np.array([1]), np.array([math.nan])))
    assert steps_to_target(steps, vals, 0.5) == 10 and steps_to_target(steps, vals, 0.95) is None
    base = np.ones(12)
    assert spike_count(base) == 0
    assert spike_count(np.r_[base, 3.5, base]) == 1
    assert spike_count(np.r_[3.5, base]) == 0  # no history yet
    assert spike_count(np.r_[base, 2.9, math.inf, 4.0]) == 1  # inf ignored; 2.9 below 3x median
    with pytest.raises(ValueError, match="window"):
        spike_count(base, window=0)


@pytest.mark.parametrize("df", [0.3, 1, 1.5, 2, 2.7, 4, 5.3, 8, 30, 250, 1e6, 1e9, math.inf])
def test_student_t_against_scipy(df):
    stats = pytest.importorskip("scipy.stats")
    for p in (1e-12, 0.025, 0.1, 0.5, 0.9, 0.975, 0.995, 1 - 1e-9):
        assert t_quantile(p, df) == pytest.approx(float(stats.t.ppf(p, df)), rel=1e-6, abs=1e-9)
    for t in (-1e6, -7.0, -1.0, 0.0, 0.3, 2.0, 12.0, 1e6, 1e200):
        assert t_cdf(t, df) == pytest.approx(float(stats.t.cdf(t, df)), rel=1e-8, abs=1e-12)
    with pytest.raises(ValueError, match="p must be"):
        t_quantile(1.0, df)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_quantile(0.9, 0.0)


def test_welch_against_scipy_on_unequal_seeds_and_spreads():
    stats = pytest.importorskip("scipy.stats")
    a, b = [50.1, 48.2, 49.8, 51.0, 51.4], [52.3, 47.0, 46.4]
    w = welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert w.diff / w.se == pytest.approx(float(ref.statistic), rel=1e-12)
    assert w.df == pytest.approx(float(ref.df), rel=1e-12)
    assert w.critical == pytest.approx(float(stats.t.ppf(0.975, ref.df)), rel=1e-7)
    assert (w.word == "within noise") == (ref.pvalue > 0.05)
    far = welch([x + 10 for x in a], b)
    assert far.word == "beats" and stats.ttest_ind([x + 10 for x in a], b, equal_var=False).pvalue < 0.05
    assert welch([1.0, 1.0], [2.0, 2.0]).word == "behind"  # no spread on either side: any difference is beyond it
    assert welch([0.1 + 0.2] * 3, [0.3] * 3).word == "within noise"  # but rounding is no difference
    lo, hi = w.interval
    assert (lo, hi) == pytest.approx((w.diff - w.critical * w.se, w.diff + w.critical * w.se))
    assert (lo < 0 < hi) == (w.word == "within noise")
    with pytest.raises(ValueError, match="two values or more"):
        welch([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="finite values"):
        welch([1.0, math.nan], [1.0, 2.0])


def test_run_label_sources(tmp_path):
    d = tmp_path / "grpo_seed_3"
    d.mkdir()
    assert run_label(d) == "grpo_seed_3" and run_label(d, with_seed=False) == "grpo"
    (d / "config.yaml").write_text("seed: 3\nalgorithm.baseline: rloo\n")  # flat dotted keys
    assert run_label(d) == "rloo seed=3" and run_label(d, with_seed=False) == "rloo"
    (d / "config.yaml").write_text(yaml.safe_dump({"seed": 1, "algorithm": {"baseline": "oblr",
                                                                             "lr_schedule": "constant"}}))
    assert run_label(d) == "oblr+constant seed=1"
    (d / "summary.json").write_text('{"label": "mine"}')
    assert run_label(d, with_seed=False) == "mine"
    (d / "config.yaml").write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="config.yaml: expected a mapping"):
        run_label(d)


# ------------------------------------------------------------------------------------- compare_runs
def _direct_group_stats(truths, target, acc="acc"):
    """Per-group expectations computed directly from the arrays that were written (``acc``: "acc" for the
    sampled accuracy, "greedy" for the greedy one)."""
    def mean_std(x):
        x = np.asarray(x, dtype=float)
        return x.mean(), (x.std(ddof=1) if x.size > 1 else math.nan)

    final = [t[acc][np.isfinite(t[acc])][-1] for t in truths]
    best = [np.nanmax(t[acc]) for t in truths]
    auc = []
    reached = []
    for t in truths:
        ok = np.isfinite(t[acc])
        s, v = t["eval_steps"][ok], t[acc][ok]
        auc.append(np.trapezoid(v, s) / (s[-1] - s[0]))
        hit = s[v >= target]
        if hit.size:
            reached.append(hit[0])
    grad = [t["grad"][np.isfinite(t["grad"])].mean() for t in truths]
    adv = [t["adv"].mean() for t in truths]
    return {"final_acc": mean_std(final), "best_acc": mean_std(best), "auc_acc": mean_std(auc),
            "grad_norm": mean_std(grad), "adv_var": mean_std(adv),
            "steps_to_target": mean_std(reached) if reached else (math.nan, math.nan), "n_reached": len(reached)}


def test_compare_runs_table_csv_and_plots(tmp_path):
    truths = {"oblr+snr": [], "rloo+constant": []}
    dirs = []
    for seed in range(3):
        d = tmp_path / f"oblr_s{seed}"
        truths["oblr+snr"].append(make_run(d, seed=seed, steps=30, acc_offset=0.15,
                                           nan_at=10 if seed == 0 else None, truncated_tail=seed == 1))
        dirs.append(d)
        d = tmp_path / f"rloo_s{seed}"
        truths["rloo+constant"].append(make_run(d, seed=seed, baseline="rloo", lr_schedule="constant", steps=30,
                                                spike_at=20 if seed < 2 else None))
        dirs.append(d)
    out = tmp_path / "cmp"
    # the greedy accuracy (NaN at one step of one run) when asked for; tables only
    res = compare_runs(dirs, tmp_path / "greedy", accuracy_key="eval/accuracy_greedy", plots=False)
    all_best = max(np.nanmax(t["greedy"]) for ts in truths.values() for t in ts)
    assert res["target"] == pytest.approx(0.9 * all_best)
    for g in res["groups"]:
        exp = _direct_group_stats(truths[g["group"]], res["target"], acc="greedy")
        for m in ("final_acc", "best_acc", "auc_acc", "steps_to_target"):
            assert g[f"{m}_mean"] == pytest.approx(exp[m][0], nan_ok=True), (g["group"], m)
            assert g[f"{m}_std"] == pytest.approx(exp[m][1], nan_ok=True), (g["group"], m)
    # by default the sampled accuracy, the primary metric of `oblr train` (not the greedy one)
    res = compare_runs(dirs, out)
    assert res["accuracy_key"] == "eval/accuracy_sampled"
    all_best = max(np.nanmax(t["acc"]) for ts in truths.values() for t in ts)
    assert res["target"] == pytest.approx(0.9 * all_best)
    groups = {g["group"]: g for g in res["groups"]}
    assert set(groups) == set(truths) and all(g["runs"] == 3 for g in groups.values())
    for name, ts in truths.items():
        exp = _direct_group_stats(ts, res["target"])
        assert exp["final_acc"][0] != pytest.approx(_direct_group_stats(ts, res["target"], "greedy")["final_acc"][0])
        g = groups[name]
        for m in ("final_acc", "best_acc", "auc_acc", "grad_norm", "adv_var", "steps_to_target"):
            assert g[f"{m}_mean"] == pytest.approx(exp[m][0], nan_ok=True), (name, m)
            assert g[f"{m}_std"] == pytest.approx(exp[m][1], nan_ok=True), (name, m)
        assert g["steps_to_target_n"] == exp["n_reached"]
    assert groups["rloo+constant"]["grad_norm_spikes_mean"] == pytest.approx(2 / 3)
    assert groups["oblr+snr"]["grad_norm_spikes_mean"] == 0.0

    with open(out / "comparison.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["group"] for r in rows] == sorted(truths)
    for r in rows:
        assert float(r["final_acc_mean"]) == pytest.approx(groups[r["group"]]["final_acc_mean"])
        assert float(r["adv_var_std"]) == pytest.approx(groups[r["group"]]["adv_var_std"])
    with open(out / "comparison_runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    md = (out / "comparison.md").read_text()
    g = groups["oblr+snr"]
    assert f"| oblr+snr | 3 | {g['final_acc_mean']:.3f} ± {g['final_acc_std']:.3f} |" in md
    assert "Accuracy metric: `eval/accuracy_sampled`" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["compare_eval_accuracy.png", "compare_grad_norm.png", "compare_lr.png", "compare_reward.png",
                    "compare_snr.png"]
    assert all(_is_png(out / p) for p in pngs)


def test_compare_runs_grouping_options_and_errors(tmp_path):
    dirs = []
    for i, (b, sched) in enumerate([("oblr", "snr"), ("oblr", "constant"), ("rloo", "snr")]):
        d = tmp_path / f"run{i}"
        make_run(d, seed=i, baseline=b, lr_schedule=sched, steps=10)
        dirs.append(d)
    res = compare_runs(dirs, tmp_path / "a", group_by="algorithm.baseline", accuracy_key="eval/accuracy_sampled",
                       target=2.0, plots=False)
    groups = {g["group"]: g for g in res["groups"]}
    assert set(groups) == {"algorithm.baseline=oblr", "algorithm.baseline=rloo"}
    assert groups["algorithm.baseline=oblr"]["runs"] == 2
    assert math.isnan(groups["algorithm.baseline=rloo"]["final_acc_std"])  # one run: no std
    assert groups["algorithm.baseline=oblr"]["steps_to_target_n"] == 0  # target never reached
    assert "| algorithm.baseline=rloo | 1 |" in (tmp_path / "a" / "comparison.md").read_text()
    res = compare_runs(dirs, tmp_path / "b", group_by=lambda d: "all")
    assert [g["group"] for g in res["groups"]] == ["all"]
    assert not list((tmp_path / "a").glob("*.png")) and len(list((tmp_path / "b").glob("*.png"))) == 5
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl"):
        compare_runs([tmp_path / "missing"], tmp_path / "c")
    with pytest.raises(TypeError, match="group_by"):
        compare_runs(dirs, tmp_path / "c", group_by=3)


# ------------------------------------------------------------------------------------------ oblr report
def _two_runs(tmp_path):
    dirs = [tmp_path / "runs" / "a", tmp_path / "runs" / "b"]
    make_run(dirs[0], seed=0, steps=10)
    make_run(dirs[1], seed=1, baseline="rloo", lr_schedule="constant", steps=10)
    return dirs


def test_report_refuses_an_accuracy_key_no_run_logged_before_writing_anything(tmp_path, capsys):
    from oblr.cli import main

    dirs = _two_runs(tmp_path)
    out = tmp_path / "rep"
    assert main(["report", *map(str, dirs), "--accuracy-key", "nonsense", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nonsense'" in err[0]
    assert "eval/accuracy_greedy, eval/accuracy_sampled" in err[0]
    assert not out.exists() and not (dirs[0] / "plots").exists()
    with pytest.raises(ValueError, match="no run logged it"):
        compare_runs(dirs, out, accuracy_key="eval/accuracy_sampld")
    # any key a run logged is accepted
    assert compare_runs(dirs, out, accuracy_key="train/reward_mean", plots=False)["accuracy_key"] == "train/reward_mean"


def test_report_tests_every_row_against_a_reference_by_welch(tmp_path, capsys):
    """`oblr report --reference GROUP`: 3 seeds of oblr+snr well above 3 seeds of rloo+constant (beats, and the
    reference row says so), a one-seed row (the difference, no verdict), the test against scipy's Welch on the
    runs' own final accuracies; an unknown reference is refused in one line, naming the rows, before writing."""
    stats = pytest.importorskip("scipy.stats")
    from oblr.cli import main
    from oblr.experiments.compare import versus_reference

    runs = tmp_path / "runs"
    for k in range(3):
        make_run(runs / f"snr{k}", seed=k, steps=10, acc_offset=0.2)
        make_run(runs / f"rloo{k}", seed=k, baseline="rloo", lr_schedule="constant", steps=10)
    make_run(runs / "grpo0", seed=0, baseline="grpo", lr_schedule="constant", steps=10)
    out = tmp_path / "rep"
    assert main(["report", str(runs), "--reference", "nonsense", "--out", str(out), "--no-run-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'nonsense' is not a row" in err[0] and "rloo+constant" in err[0]
    assert not out.exists()
    assert main(["report", str(runs), "--reference", "rloo+constant", "--out", str(out), "--no-run-plots"]) == 0
    md = (out / "comparison.md").read_text()
    assert "| final acc vs rloo+constant |" in md and "Welch's t-test" in md
    rows = {r["group"]: r for r in csv.DictReader(open(out / "comparison.csv"))}
    finals = {g: [float(r["final_acc"]) for r in csv.DictReader(open(out / "comparison_runs.csv")) if r["group"] == g]
              for g in rows}
    ref = stats.ttest_ind(finals["oblr+snr"], finals["rloo+constant"], equal_var=False)
    assert rows["oblr+snr"]["vs_reference_verdict"] == "beats" and ref.pvalue < 0.05 and ref.statistic > 0
    assert float(rows["oblr+snr"]["vs_reference_df"]) == pytest.approx(float(ref.df))
    assert float(rows["oblr+snr"]["vs_reference_diff"]) / float(rows["oblr+snr"]["vs_reference_se"]) == pytest.approx(
        float(ref.statistic))
    assert rows["rloo+constant"]["vs_reference"] == "reference"
    assert rows["grpo+constant"]["vs_reference"].endswith("(one run; no verdict)")
    assert rows["grpo+constant"]["vs_reference_verdict"] == ""
    line = next(x for x in md.splitlines() if x.startswith("| oblr+snr |"))
    r = rows["oblr+snr"]
    assert line.endswith(f"beats (+{float(r['vs_reference_diff']):.3f} ± {float(r['vs_reference_se']):.3f}; 95 %: "
                         f"{float(r['vs_reference_low']):+.3f} to {float(r['vs_reference_high']):+.3f}) |")
    half = float(stats.t.ppf(0.975, ref.df)) * float(r["vs_reference_se"])
    assert float(r["vs_reference_low"]) == pytest.approx(float(r["vs_reference_diff"]) - half, rel=1e-6)
    assert float(r["vs_reference_low"]) > 0  # beats: the whole interval above 0
    # close means with a spread: within noise; a run that never evaluated is left out of the test
    close = versus_reference([0.50, 0.52, 0.49, math.nan], [0.51, 0.48, 0.50])
    assert close["vs_reference_verdict"] == "within noise"
    assert close["vs_reference_diff"] == pytest.approx((0.50 + 0.52 + 0.49) / 3 - (0.51 + 0.48 + 0.50) / 3)
    assert versus_reference([math.nan], [0.5, 0.6])["vs_reference"] == "no final accuracy"


def test_a_grid_report_reference_must_be_one_of_its_runs():
    from oblr.config import ConfigError
    from oblr.experiments.grid import grid_from_dict

    grid = {"base": {}, "runs": [{"name": "grpo"}, {"name": "oblr"}], "report": {"reference": "grpo"}}
    assert grid_from_dict(grid).report == {"reference": "grpo"}
    with pytest.raises(ConfigError, match="report.reference 'gpro' is not a run name of the grid"):
        grid_from_dict({**grid, "report": {"reference": "gpro"}})
    with pytest.raises(ConfigError, match="report.reference \\['grpo'\\] is not a run name"):
        grid_from_dict({**grid, "report": {"reference": ["grpo"]}})


def test_report_writes_beside_the_runs_by_default_and_says_where(tmp_path, capsys, monkeypatch):
    from oblr.cli import main
    from oblr.experiments.report import default_report_dir

    dirs = _two_runs(tmp_path)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert main(["report", *map(str, dirs), "--no-run-plots"]) == 0
    out = tmp_path / "runs" / "oblr-report"
    printed = capsys.readouterr().out
    assert f"report written to {out}" in printed and "ranked by eval/accuracy_sampled" in printed
    assert (out / "comparison.md").is_file() and list(cwd.iterdir()) == []
    assert "Accuracy metric: `eval/accuracy_sampled`" in (out / "comparison.md").read_text()
    # a folder holding runs: its report/ ; --out: exactly there
    assert default_report_dir([tmp_path / "runs"]) == tmp_path / "runs" / "report"
    assert main(["report", str(dirs[1]), "--out", str(tmp_path / "mine"), "--no-run-plots"]) == 0
    assert (tmp_path / "mine" / "comparison.csv").is_file()
    assert f"report written to {tmp_path / 'mine'}" in capsys.readouterr().out


# ------------------------------------------------------------------------------- rows of one setting only
def test_split_by_settings_keeps_differing_runs_apart_and_names_the_keys():
    from oblr.experiments.stats import split_by_settings

    labels = {"a0": "m", "a1": "m", "b": "m", "c": "m", "x": "other", "y": "other", "u": "lone"}
    settings = {"a0": {"steps": 200, "lr": 1e-3}, "a1": {"steps": 200, "lr": 1e-3},
                "b": {"steps": 10, "lr": 1e-3}, "c": {"steps": 3, "lr": 1e-3, "extra": {"k": 1}},
                "x": {"steps": 5}, "y": {"steps": 5}, "u": None}
    rows, differ = split_by_settings(labels, settings)
    assert differ == {"m": ["extra", "steps"]}  # "lr" is shared; a key only one run has counts as differing
    assert rows == {"a0": "m [extra=<unset>, steps=200]", "a1": "m [extra=<unset>, steps=200]",
                    "b": "m [extra=<unset>, steps=10]", "c": 'm [extra={"k": 1}, steps=3]',
                    "x": "other", "y": "other", "u": "lone"}
    rows, differ = split_by_settings({"p": "m", "q": "m"}, {"p": {"steps": 1}, "q": None})
    assert differ == {"m": ["config.yaml"]} and rows == {"p": "m", "q": "m [no config.yaml]"}


def _with_train(run_dir, **train):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["train"] = {**cfg.get("train", {}), **train}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_report_gives_runs_of_other_settings_their_own_row(tmp_path):
    from oblr.experiments.report import build_report

    root = tmp_path / "runs"
    spec = [("s0", 0, 200, 1), ("s1", 1, 200, 2), ("short", 2, 10, 1), ("tiny", 3, 3, 1)]
    truths = {}
    for name, seed, steps, threads in spec:
        truths[name] = make_run(root / name, seed=seed, steps=10)
        # the seed, the output folder and train.threads differ between s0 and s1: still one setting
        _with_train(root / name, steps=steps, seed=seed, output_dir=str(root / name), threads=threads)
    logged = []
    res = build_report([root], tmp_path / "rep", run_plots=False, log=logged.append)
    groups = {g["group"]: g for g in res["groups"]}
    assert set(groups) == {"oblr+snr [train.steps=200]", "oblr+snr [train.steps=10]", "oblr+snr [train.steps=3]"}
    both = groups["oblr+snr [train.steps=200]"]
    finals = [truths[n]["acc"][-1] for n in ("s0", "s1")]
    assert both["runs"] == 2 and both["final_acc_mean"] == pytest.approx(sum(finals) / 2)
    assert both["final_acc_std"] == pytest.approx(abs(finals[0] - finals[1]) / math.sqrt(2))
    assert groups["oblr+snr [train.steps=3]"]["final_acc_mean"] == pytest.approx(truths["tiny"]["acc"][-1])
    note = "oblr+snr: its 4 runs differ in train.steps (kept in 3 rows, one per setting)"
    assert [m for m in logged if "differ" in m] == [f"[report] {note}"]
    assert f"- {note}\n" in (tmp_path / "rep" / "comparison.md").read_text()
    # a grouping asked for is kept (one row of 4), and the difference still said
    logged.clear()
    res = build_report([root], tmp_path / "rep2", run_plots=False, log=logged.append, group_by="algorithm.baseline")
    assert [(g["group"], g["runs"]) for g in res["groups"]] == [("algorithm.baseline=oblr", 4)]
    assert "[report] algorithm.baseline=oblr: its 4 runs differ in train.steps (pooled into one row by the " \
           "grouping asked for)" in logged


def test_report_of_runs_of_one_setting_is_unchanged(tmp_path):
    """Seeds of one setting share a row under their plain label and nothing is said about settings."""
    from oblr.experiments.report import build_report

    for seed in (0, 1):
        make_run(tmp_path / "runs" / f"seed{seed}", seed=seed, steps=10)
        _with_train(tmp_path / "runs" / f"seed{seed}", steps=10, seed=seed)
    logged = []
    res = build_report([tmp_path / "runs"], tmp_path / "rep", run_plots=False, log=logged.append)
    assert [(g["group"], g["runs"]) for g in res["groups"]] == [("oblr+snr", 2)]
    assert not [m for m in logged if "differ" in m]
    assert "differ in settings" not in (tmp_path / "rep" / "comparison.md").read_text()


def test_runs_moved_aside_by_compare_are_not_reported_with_the_grid(tmp_path):
    from oblr.experiments.report import find_run_dirs

    for name in ("seed0", "seed0.other-code", "seed1.damaged", "seed1.damaged-2"):
        (tmp_path / "v" / name).mkdir(parents=True)
        (tmp_path / "v" / name / "metrics.jsonl").write_text("")
    assert find_run_dirs([tmp_path]) == [tmp_path / "v" / "seed0"]
    assert find_run_dirs([tmp_path / "v" / "seed1.damaged"]) == [tmp_path / "v" / "seed1.damaged"]


def test_paired_test_and_seed_correlation_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    a = {0: 50.1, 1: 48.2, 2: 49.8, 3: 51.0, 7: 99.0}  # seed 7 has no partner: left out
    b = {0: 49.0, 1: 47.9, 2: 47.1, 3: 50.2, 5: 10.0}
    common = [0, 1, 2, 3]
    ref = stats.ttest_rel([a[k] for k in common], [b[k] for k in common])
    t = paired(a, b)
    assert t.diff / t.se == pytest.approx(float(ref.statistic), rel=1e-12) and t.df == 3
    assert t.critical == pytest.approx(float(stats.t.ppf(0.975, 3)), rel=1e-7)
    assert (t.word == "within noise") == (ref.pvalue > 0.05)
    assert seed_correlation(a, b) == pytest.approx(
        float(stats.pearsonr([a[k] for k in common], [b[k] for k in common]).statistic), rel=1e-12)
    # a seed that moves both rows the same way: pairing sees a 1-point lead Welch's test cannot
    shared = {k: 40.0 + 5 * k for k in range(4)}
    lead = {k: v + 1.0 + 0.1 * (k % 2) for k, v in shared.items()}
    assert paired(lead, shared).word == "beats"
    assert welch(list(lead.values()), list(shared.values())).word == "within noise"
    assert seed_correlation(lead, shared) > 0.99
    assert paired({0: 0.1 + 0.2, 1: 0.3}, {0: 0.3, 1: 0.3}).word == "within noise"  # rounding is no difference
    assert paired({0: 2.0, 1: 3.0}, {0: 1.0, 1: 2.0}).word == "beats"  # equal differences, no spread
    assert math.isnan(seed_correlation({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}))  # fewer than 3 in common
    assert math.isnan(seed_correlation({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 2.0, 2: 3.0}))  # no spread
    with pytest.raises(ValueError, match=r"two seeds or more in common, got 1 \(\[0\]\)"):
        paired({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})
    with pytest.raises(ValueError, match="finite values"):
        paired({0: 1.0, 1: math.nan}, {0: 1.0, 1: 2.0})
