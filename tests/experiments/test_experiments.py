"""Experiment runner: a tiny grid through `oblr compare`, reuse on rerun, `oblr report`, plans and failures;
the proxy study's rank statistics against scipy and its CLI over a tiny run's checkpoints."""

import csv
import json
import math
import shutil

import pytest
import torch
import yaml

from oblr.cli import main
from oblr.config import ConfigError
from oblr.experiments.grid import decide, grid_from_dict, load_grid, plan_grid
from oblr.experiments.proxy_study import (
    average_ranks,
    compare_weights,
    sequence_weights,
    spearman_within_groups,
)

TINY = {"rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16},
        "task": {"eval_size": 4, "options": {"n_train": 200, "n_eval": 20}},
        "train": {"steps": 2, "eval_every": 0, "eval_samples": 1, "save_every": 1, "keep_checkpoints": 5,
                  "threads": 1, "plots": False}}
VARIANTS = [{"name": "oblr-snr", "algorithm.baseline": "oblr", "algorithm.lr_schedule": "snr"},
            {"name": "rloo-const", "algorithm.baseline": "rloo", "algorithm.lr_schedule": "constant",
             "algorithm.track_snr": True}]


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _grid_file(path, model, variants=VARIANTS, seeds=(0, 1), **extra):
    base = json.loads(json.dumps(TINY))
    base["model"] = {"name_or_path": str(model)}
    path.write_text(yaml.safe_dump({"base": base, "seeds": list(seeds), "runs": variants, **extra}))
    return path


@pytest.fixture(scope="module")
def grid_run(small_builtin, tmp_path_factory):
    """The tiny grid (2 variants x 2 seeds x 2 steps), run once through the CLI."""
    tmp = tmp_path_factory.mktemp("grid")
    grid, out = _grid_file(tmp / "grid.yaml", small_builtin), tmp / "out"
    assert main(["compare", "--config", str(grid), "--out", str(out)]) == 0
    return grid, out


def test_compare_runs_the_grid_labels_runs_and_writes_the_report(grid_run):
    _, out = grid_run
    for v in ("oblr-snr", "rloo-const"):
        for s in (0, 1):
            summary = json.loads((out / v / f"seed{s}" / "summary.json").read_text())
            assert summary["label"] == v and summary["grid_seed"] == s and summary["steps"] == 2
            cfg = yaml.safe_load((out / v / f"seed{s}" / "config.yaml").read_text())
            assert cfg["train"]["seed"] == s
    rloo_cfg = yaml.safe_load((out / "rloo-const" / "seed0" / "config.yaml").read_text())
    assert rloo_cfg["algorithm"]["baseline"] == "rloo" and rloo_cfg["algorithm"]["lr_schedule"] == "constant"
    rows = (_csv(out / "report" / "comparison.csv"))
    assert sorted(r["group"] for r in rows) == ["oblr-snr", "rloo-const"]
    assert all(r["runs"] == "2" for r in rows)
    md = (out / "report" / "comparison.md").read_text()
    assert "| oblr-snr | 2 |" in md and "| rloo-const | 2 |" in md
    assert (out / "report" / "compare_eval_accuracy.png").is_file()
    status = json.loads((out / "grid_status.json").read_text())
    assert [r["status"] for r in status["runs"]] == ["done"] * 4
    assert "oblr-snr seed=1 | done" in (out / "report" / "grid.md").read_text()


def test_track_snr_logs_S_and_V_for_constant_lr_rows(grid_run):
    _, out = grid_run
    rows = [json.loads(ln) for ln in (out / "rloo-const" / "seed0" / "metrics.jsonl").read_text().splitlines()]
    assert any("snr/S" in r and "snr/V" in r for r in rows)


def test_rerun_reuses_finished_runs(grid_run, capsys):
    grid, out = grid_run
    before = {p: p.read_bytes() for p in out.glob("*/seed*/metrics.jsonl")}
    assert len(before) == 4
    assert main(["compare", "--config", str(grid), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.count(": reused (finished") == 4 and "starting" not in text
    assert {p: p.read_bytes() for p in out.glob("*/seed*/metrics.jsonl")} == before
    status = json.loads((out / "grid_status.json").read_text())
    assert [r["status"] for r in status["runs"]] == ["reused"] * 4


def test_report_rebuilds_tables_and_plots_from_folders(grid_run, tmp_path):
    _, out = grid_run
    assert not (out / "oblr-snr" / "seed0" / "plots").exists()  # the grid runs with train.plots=false
    rep = tmp_path / "rep"
    assert main(["report", str(out), "--out", str(rep)]) == 0
    assert (out / "oblr-snr" / "seed0" / "plots" / "reward.png").is_file()
    rows = (_csv(rep / "comparison.csv"))
    assert sorted(r["group"] for r in rows) == ["oblr-snr", "rloo-const"]
    per_run = (_csv(rep / "comparison_runs.csv"))
    assert len(per_run) == 4
    md = (rep / "comparison.md").read_text()
    assert "oblr-snr" in md and "rloo-const" in md
    # explicit run folders work too, and a group-by config key
    assert main(["report", str(out / "oblr-snr" / "seed0"), str(out / "rloo-const" / "seed1"), "--out",
                 str(tmp_path / "rep2"), "--group-by", "algorithm.baseline", "--no-run-plots"]) == 0
    groups = sorted(r["group"] for r in _csv(tmp_path / "rep2" / "comparison.csv"))
    assert groups == ["algorithm.baseline=oblr", "algorithm.baseline=rloo"]


def test_dry_run_plans_resume_and_conflict_without_touching_runs(grid_run, capsys):
    grid, out = grid_run
    before = {p: p.read_bytes() for p in out.glob("*/seed*/summary.json")}
    assert main(["compare", "--config", str(grid), "--out", str(out), "--dry-run", "train.steps=3"]) == 0
    text = capsys.readouterr().out
    assert text.count(": resume - finished at 2 steps; extending to 3") == 4
    assert main(["compare", "--config", str(grid), "--out", str(out), "--dry-run", "optim.lr=0.5"]) == 1
    text = capsys.readouterr().out
    assert text.count(": conflict - ") == 4 and text.count("changed: optim.lr") == 4
    assert {p: p.read_bytes() for p in out.glob("*/seed*/summary.json")} == before


def test_decide_resumes_a_checkpointed_run_and_clears_a_partial_one(grid_run, tmp_path):
    grid_path, out = grid_run
    grid = load_grid(grid_path)
    copy = tmp_path / "out"
    shutil.copytree(out / "oblr-snr", copy / "oblr-snr")
    plan = {(p.variant, p.seed): p for p in plan_grid(grid, copy)}
    assert plan[("oblr-snr", 0)].action == "reuse" and plan[("rloo-const", 0)].action == "start"
    run = copy / "oblr-snr" / "seed0"
    (run / "summary.json").unlink()
    assert decide(run, plan[("oblr-snr", 0)].cfg)[0] == "resume"
    shutil.rmtree(run / "checkpoints")
    assert decide(run, plan[("oblr-snr", 0)].cfg) == ("start", "partial run without checkpoint (cleared)")


def test_a_run_another_process_holds_is_a_conflict_never_cleared_or_resumed(grid_run, tmp_path, capsys):
    """A second `oblr compare` on a folder whose run is in progress (its lock held) leaves it alone: a partial run
    without a checkpoint is not cleared (moved aside) under the running trainer, a checkpointed one not resumed."""
    from oblr.train.run_dir import lock_run_dir

    grid_path, out = grid_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    run = copy / "oblr-snr" / "seed0"
    (run / "summary.json").unlink()
    shutil.rmtree(run / "checkpoints")  # what a trainer before its first checkpoint leaves
    held = lock_run_dir(run)  # "another process": another open file holding the lock
    try:
        cfg = {(p.variant, p.seed): p for p in plan_grid(load_grid(grid_path), copy)}[("oblr-snr", 0)].cfg
        action, reason = decide(run, cfg)
        assert action == "conflict" and f"{run} is in use by process" in reason
        assert main(["compare", "--config", str(grid_path), "--out", str(copy), "--only", "oblr-snr",
                     "--seeds", "0"]) == 1
        assert "in use by process" in capsys.readouterr().out
        assert run.is_dir() and (run / "metrics.jsonl").is_file() and not list(run.parent.glob("seed0.*"))
    finally:
        held.close()
    assert decide(run, cfg) == ("start", "partial run without checkpoint (cleared)")  # released: as before


def test_a_run_taken_by_another_process_after_the_plan_is_left_alone(tmp_path, monkeypatch):
    """The grid is planned once; while it trains run a, another process starts run b in its folder (takes its
    lock). When the grid reaches b it must not clear the partial folder under that trainer: b is a conflict, its
    folder untouched; a folder that gained a checkpoint since the plan is not cleared either."""
    from oblr.config import save_config
    from oblr.experiments import runner
    from oblr.train.run_dir import lock_run_dir

    g = tmp_path / "grid.yaml"
    g.write_text(yaml.safe_dump({"base": {"train": {"steps": 2}}, "seeds": [0],
                                 "runs": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}))
    grid, out = load_grid(g), tmp_path / "out"
    plan = {p.variant: p for p in plan_grid(grid, out)}
    for name in ("b", "c"):  # partial runs without a checkpoint: planned as "start (cleared)"
        d = plan[name].run_dir
        d.mkdir(parents=True)
        save_config(plan[name].cfg, d / "config.yaml")
        (d / "metrics.jsonl").write_text('{"step": 1}\n')
    assert {p.variant: p.reason for p in plan_grid(grid, out)}["b"] == "partial run without checkpoint (cleared)"
    held, trained = [], []

    def fake(cfg, resume, variant, seed, quiet, plugins=()):
        trained.append(variant)
        if variant == "a":  # meanwhile: another process takes b, and c gains a checkpoint
            held.append(lock_run_dir(plan["b"].run_dir))
            (plan["c"].run_dir / "checkpoints" / "step_000001").mkdir(parents=True)
            monkeypatch.setattr(runner, "clear_partial", _refusing_clear)
        return {"status": "done", "seconds": 0.0, "summary": {}}

    def _refusing_clear(run_dir):
        raise RuntimeError(f"refusing to clear {run_dir}: it holds a finished summary or a checkpoint")

    monkeypatch.setattr(runner, "_train_one", fake)
    monkeypatch.setattr(runner, "_grid_report", lambda *a, **k: [])
    lines = []
    try:
        res = runner.run_grid(grid, out, log=lines.append)
    finally:
        for h in held:
            h.close()
    status = {r["variant"]: r["status"] for r in res["runs"]}
    assert trained == ["a"] and status == {"a": "done", "b": "conflict", "c": "conflict"} and res["failed"] == 2
    assert any("b seed=0: CONFLICT" in x and "in use by process" in x for x in lines)
    assert any("c seed=0: CONFLICT" in x and "changed since this grid was planned" in x for x in lines)
    assert (plan["b"].run_dir / "metrics.jsonl").is_file() and not list(out.glob("b/seed0.*"))


def test_an_interrupted_run_is_resumed_or_moved_aside_never_reused(grid_run, tmp_path, capsys):
    """An interrupted (or failed) run writes summary.json too, with its status: a second `oblr compare` resumes
    it from its checkpoint, and moves one without a checkpoint aside (kept) before starting it afresh."""
    grid_path, out = grid_run
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    finished = {p: json.loads(p.read_text()) for p in copy.glob("*/seed*/summary.json")}
    cut = copy / "oblr-snr" / "seed0"  # stopped after step 1: its checkpoint of step 2 removed
    shutil.rmtree(cut / "checkpoints" / "step_000002")
    (cut / "summary.json").write_text(json.dumps({**finished[cut / "summary.json"], "status": "interrupted",
                                                  "steps": 1}))
    bare = copy / "rloo-const" / "seed1"  # failed before its first checkpoint
    shutil.rmtree(bare / "checkpoints")
    (bare / "summary.json").write_text(json.dumps({**finished[bare / "summary.json"], "status": "failed",
                                                   "steps": 0}))
    plan = {(p.variant, p.seed): p for p in plan_grid(load_grid(grid_path), copy)}
    assert (plan[("oblr-snr", 0)].action, plan[("oblr-snr", 0)].reason) == (
        "resume", "interrupted run; resuming from its last checkpoint")
    assert (plan[("rloo-const", 1)].action, plan[("rloo-const", 1)].reason) == (
        "start", "failed run without checkpoint (moved aside)")
    assert plan[("oblr-snr", 1)].action == plan[("rloo-const", 0)].action == "reuse"
    capsys.readouterr()
    assert main(["compare", "--config", str(grid_path), "--out", str(copy)]) == 0
    text = capsys.readouterr().out
    assert "(0 reuse" not in text and "2 reuse, 1 resume, 1 start" in text
    assert f"moved to {bare.with_name('seed1.failed')}" in text
    assert json.loads((bare.with_name("seed1.failed") / "summary.json").read_text())["status"] == "failed"
    for run in (cut, bare):
        s = json.loads((run / "summary.json").read_text())
        assert s["status"] == "completed" and s["steps"] == 2
    rows = [json.loads(ln) for ln in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "optim/lr" in r] == [1, 2]


def test_run_folders_record_their_code_and_compare_refuses_reruns_or_reuses_other_code(grid_run, tmp_path, capsys):
    from oblr.provenance import code_identity, read_code_file

    grid_path, out = grid_run
    rec = read_code_file(out / "oblr-snr" / "seed0")
    assert rec["source_hash"] == code_identity()["source_hash"] and rec["mixed"] is False
    assert [s["from_step"] for s in rec["segments"]] == [0]
    summary = json.loads((out / "oblr-snr" / "seed0" / "summary.json").read_text())
    assert summary["code"] == code_identity()
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    stale = copy / "oblr-snr" / "seed1"
    code = json.loads((stale / "code.json").read_text())
    code["segments"][0]["source_hash"] = code["source_hash"] = "0" * 64  # as if made by other code
    (stale / "code.json").write_text(json.dumps(code))
    (copy / "rloo-const" / "seed0" / "code.json").unlink()  # made before runs recorded their code
    summary_before = (stale / "summary.json").read_bytes()
    # default: refused, both codes named, nothing touched
    assert main(["compare", "--config", str(grid_path), "--out", str(copy)]) == 1
    text = capsys.readouterr().out
    assert text.count("CONFLICT") == 2 and text.count(": reused (finished") == 2
    assert "was made by oblr " in text and f"source {'0' * 12}" in text and "did not record itself" in text
    assert "--on-other-code rerun" in text and (stale / "summary.json").read_bytes() == summary_before
    # reuse: kept as they are, saying so
    assert main(["compare", "--config", str(grid_path), "--out", str(copy), "--dry-run", "--on-other-code", "reuse"]) == 0
    assert capsys.readouterr().out.count("kept although ") == 2
    # rerun: moved aside (nothing deleted), trained again with this code
    assert main(["compare", "--config", str(grid_path), "--out", str(copy), "--on-other-code", "rerun"]) == 0
    text = capsys.readouterr().out
    assert text.count(": rerunning (") == 2 and text.count(": reused (finished") == 2
    aside = copy / "oblr-snr" / "seed1.other-code"
    assert (aside / "summary.json").read_bytes() == summary_before
    assert read_code_file(stale)["source_hash"] == code_identity()["source_hash"]
    assert (copy / "rloo-const" / "seed0.other-code" / "metrics.jsonl").is_file()
    plan = plan_grid(load_grid(grid_path), copy)
    assert [p.action for p in plan] == ["reuse"] * 4  # the folders set aside are not run folders of the grid


def test_a_run_resumed_by_other_code_is_recorded_as_mixed(grid_run, tmp_path):
    from oblr.provenance import code_record, read_code_file, same_code

    _, out = grid_run
    run = tmp_path / "run"
    shutil.copytree(out / "oblr-snr" / "seed0", run)
    code = json.loads((run / "code.json").read_text())
    code["segments"][0]["source_hash"] = "f" * 64
    (run / "code.json").write_text(json.dumps(code))
    (run / "code.json").write_text(code_record(run, 1))  # resumed at step 1 by this code
    rec = read_code_file(run)
    assert rec["mixed"] is True and [s["from_step"] for s in rec["segments"]] == [0, 1]
    ok, why = same_code(run)
    assert not ok and "started (from step 0) by" in why and "resumed with this code" in why
    (run / "code.json").write_text(code_record(run, 0))  # restarted from step 0: only this code made it
    assert same_code(run) == (True, "")


def test_a_failing_run_is_reported_and_the_others_continue(small_builtin, tmp_path, capsys):
    variants = [{"name": "broken", "task.options": {"n_train": 200, "n_eval": 20, "difficulty": "no-such"}},
                {"name": "fine", "train.steps": 1, "train.eval_every": 0, "train.plots": False}]
    # the report's reference is the run that fails: the table is still written, without that column, and says so
    grid = _grid_file(tmp_path / "g.yaml", small_builtin, variants=variants, seeds=[0], report={"reference": "broken"})
    assert main(["compare", "--config", str(grid), "--out", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    assert "broken seed=0: FAILED" in text and "fine seed=0: done" in text
    assert "report.reference 'broken' has no finished run" in text
    assert (tmp_path / "o" / "broken" / "seed0" / "grid_error.txt").is_file()
    assert (tmp_path / "o" / "fine" / "seed0" / "summary.json").is_file()
    assert (tmp_path / "o" / "report" / "comparison.md").is_file()


@pytest.mark.parametrize("data, msg", [
    ({"base": {}, "runs": [{"name": "a", "algorithm.baselin": "oblr"}]}, "run 'a': unknown config key 'algorithm.baselin'"),
    ({"base": {}, "runs": [{"name": "a"}, {"name": "a"}]}, "duplicate run name 'a'"),
    ({"base": {}, "runs": [{"name": "a/b"}]}, "folder-safe"),
    ({"base": {}, "runs": [{"name": "a"}], "seeds": [0, 0]}, "duplicates"),
    ({"base": {}, "runs": [{"name": "a"}], "sedes": [0]}, "unknown key(s) ['sedes']"),
    ({"base": "missing.yaml", "runs": [{"name": "a"}]}, "base config 'missing.yaml' not found"),
    ({"runs": [{"name": "a"}]}, "missing key 'base'"),
])
def test_bad_grids_fail_before_any_run_with_a_clear_message(tmp_path, data, msg):
    with pytest.raises(ConfigError, match=None) as e:
        plan_grid(grid_from_dict(data, "g.yaml"), tmp_path)
    assert msg in str(e.value)
    assert not any(tmp_path.iterdir())


def test_overrides_may_not_set_seed_and_the_cli_reports_config_errors(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"base": {}, "runs": [{"name": "a"}]}))
    assert main(["compare", "--config", str(grid), "--out", str(tmp_path / "o"), "train.seed=3"]) == 2
    assert "train.seed is set by the grid" in capsys.readouterr().err
    assert main(["compare", "--config", str(tmp_path / "nope.yaml")]) == 2


def test_shipped_paper_grid_is_valid():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / "grid-paper-checks.yaml"
    grid = load_grid(path)
    assert len(grid.seeds) >= 3
    names = {v.name for v in grid.variants}
    plan = plan_grid(grid, Path("/nonexistent-grid-out"))
    assert all(p.cfg.algorithm.track_snr for p in plan)
    baselines = {p.cfg.algorithm.baseline for p in plan}
    assert baselines >= {"oblr", "rloo", "grpo", "dr_grpo", "opo", "otb_proxy"}, names
    const_lrs = {p.cfg.optim.lr for p in plan if p.cfg.algorithm.baseline == "oblr"
                 and p.cfg.algorithm.lr_schedule == "constant"}
    assert len(const_lrs) >= 3
    # the paper's rule (current batch only, snr_ema 0) next to the EMA rows, same baselines, seeds, eta_max
    snr = {(p.cfg.algorithm.baseline, p.cfg.optim.snr_ema, p.cfg.optim.lr, p.cfg.train.seed) for p in plan
           if p.cfg.algorithm.lr_schedule == "snr"}
    for baseline in ("oblr", "rloo"):
        for seed in grid.seeds:
            assert {(baseline, 0.0, 1e-3, seed), (baseline, 0.9, 1e-3, seed)} <= snr, (baseline, seed)


# ------------------------------------------------------------------------------------------- proxy study
def test_spearman_matches_scipy_with_ties_and_constant_groups():
    from scipy.stats import spearmanr

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 4, (50, 8), generator=g).double()  # many ties
    y = x + torch.randint(-2, 3, (50, 8), generator=g).double()
    x[0] = 1.0  # constant group -> NaN
    rho = spearman_within_groups(x, y)
    assert math.isnan(rho[0])
    for k in range(1, 50):
        ref = spearmanr(x[k].numpy(), y[k].numpy()).statistic
        if math.isnan(ref):
            assert math.isnan(rho[k])
        else:
            assert rho[k].item() == pytest.approx(ref, abs=1e-12)
    assert average_ranks(torch.tensor([[3.0, 1.0, 3.0, 2.0]])).tolist() == [[3.5, 1.0, 3.5, 2.0]]


def test_compare_weights_perfect_proxy_and_uniform_proxy():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (40, 6), generator=g).float()
    rewards[0] = 1.0  # uninformative group
    exact = torch.rand(40, 6, generator=g) + 0.1
    weights = {"exact": exact, "length": 3.0 * exact, "logit_energy": torch.ones(40, 6)}
    per, s = compare_weights(weights, rewards)
    assert s["rho_length_median"] == pytest.approx(1.0) and s["absdiff_length"] == pytest.approx(0.0, abs=1e-6)
    assert s["captured_length"] == pytest.approx(1.0, abs=1e-5)
    # uniform weights give exactly the leave-one-out mean: same as the 'uniform' row, captured 0
    assert s["absdiff_logit_energy"] == pytest.approx(s["absdiff_uniform"], rel=1e-5)
    assert s["captured_logit_energy"] == pytest.approx(0.0, abs=1e-5)
    assert s["rho_logit_energy_n"] == 0 and math.isnan(s["rho_logit_energy_median"])
    assert s["informative_groups"] == int((rewards.max(1).values != rewards.min(1).values).sum())
    assert per["absdiff_uniform"][0] == 0.0 and not per["informative"][0]


def test_sequence_weights_match_the_loop_reference_with_the_aggregation_scale(small_builtin):
    from oblr.experiments.proxy_study import collect_rollouts
    from oblr.gradnorm import length_weights, loop_sequence_sq_norms
    from oblr.losses import sequence_scale
    from oblr.models import load_model_and_tokenizer
    from oblr.tasks import get_task

    model, tok = load_model_and_tokenizer(small_builtin)
    task = get_task("arithmetic", n_train=50, n_eval=5)
    batch, rewards = collect_rollouts(model, tok, task, n_prompts=2, group_size=3, max_new_tokens=16, seed=1)
    assert rewards.shape == (2, 3)
    for agg in ("seq_sum_const", "seq_mean"):
        w = sequence_weights(model, batch, aggregation=agg, max_len=16)
        c = sequence_scale(batch.response_mask.float(), agg, max_len=16)
        ref = loop_sequence_sq_norms(model, batch.input_ids, batch.attention_mask, batch.response_mask) * c ** 2
        torch.testing.assert_close(w["exact"], ref.float(), rtol=1e-4, atol=1e-12)
        torch.testing.assert_close(w["length"], length_weights(batch.response_mask))
        assert (w["logit_energy"] > 0).all()


def test_proxy_study_cli_over_a_runs_checkpoints(grid_run, tmp_path):
    _, out = grid_run
    dest = tmp_path / "ps"
    assert main(["proxy-study", "--checkpoints", str(out / "oblr-snr" / "seed0"), "--out", str(dest),
                 "--prompts", "4"]) == 0
    rows = (_csv(dest / "proxy_study.csv"))
    assert [int(r["step"]) for r in rows] == [0, 1, 2]
    assert all(int(r["groups"]) == 4 for r in rows)
    groups = (_csv(dest / "proxy_study_groups.csv"))
    assert len(groups) == 12
    for r in groups:
        for k in ("rho_length", "rho_logit_energy"):
            v = float(r[k])
            assert math.isnan(v) or -1.0 - 1e-9 <= v <= 1.0 + 1e-9
    assert (dest / "proxy_study.png").stat().st_size > 0 and "Spearman" in (dest / "proxy_study.md").read_text()


def test_progress_line_names_the_accuracy_it_prints():
    """The grid's 'done' line names each final accuracy (it printed the greedy one as 'final acc' while the
    report's tables use the run's eval metric, the sampled one by default)."""
    from oblr.experiments.runner import _final_accuracies

    s = {"eval_metric": "accuracy_sampled", "eval_accuracy_final": 0.4075, "eval_accuracy_greedy_final": 0.525}
    assert _final_accuracies(s) == ", final accuracy_sampled 0.407, greedy 0.525"
    assert _final_accuracies({"eval_metric": "accuracy_greedy", "eval_accuracy_final": 0.5,
                              "eval_accuracy_greedy_final": 0.5}) == ", final accuracy_greedy 0.500"
    assert _final_accuracies({}) == ""


def test_a_run_from_other_weights_of_the_same_model_is_not_reused_silently(grid_run, tmp_path, capsys):
    """code.json records the start model's fingerprint; a folder whose weights differ from the model the grid
    would start from now (a built-in model rebuilt elsewhere) is a conflict, rerun or kept like other code."""
    from oblr.experiments.grid import start_fingerprint
    from oblr.provenance import read_code_file

    grid_path, out = grid_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    stale = copy / "oblr-snr" / "seed1"
    rec = read_code_file(stale)
    plan = plan_grid(load_grid(grid_path), copy)
    now = start_fingerprint(plan[0].cfg)
    assert now and rec["start_model"]["fingerprint"] == now  # recorded when the run started
    assert [p.action for p in plan] == ["reuse"] * 4
    code = json.loads((stale / "code.json").read_text())
    code["start_model"]["fingerprint"] = "e" * 64
    (stale / "code.json").write_text(json.dumps(code))
    assert main(["compare", "--config", str(grid_path), "--out", str(copy), "--dry-run"]) == 1
    text = capsys.readouterr().out
    assert text.count(": conflict - ") == 1 and "started from other weights of" in text and "e" * 12 in text
    assert main(["compare", "--config", str(grid_path), "--out", str(copy), "--dry-run",
                 "--on-other-code", "reuse"]) == 0
    assert "kept although started from other weights" in capsys.readouterr().out
    del code["start_model"]  # a folder from before the record: not compared
    (stale / "code.json").write_text(json.dumps(code))
    assert [p.action for p in plan_grid(load_grid(grid_path), copy)] == ["reuse"] * 4


def test_model_fingerprint_follows_the_bytes(tmp_path):
    from oblr.provenance import model_fingerprint

    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text("{}")
    (a / "model.safetensors").write_bytes(b"\0" * 1000)
    (a / "notes.txt").write_text("not part of it")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert model_fingerprint(a) == model_fingerprint(b) and len(model_fingerprint(a)) == 64
    (b / "notes.txt").write_text("changed")
    assert model_fingerprint(a) == model_fingerprint(b)
    (b / "model.safetensors").write_bytes(b"\0" * 999 + b"\1")
    assert model_fingerprint(a) != model_fingerprint(b)
    (a / "sharded").mkdir()  # weights in a subfolder (a sharded checkpoint) count too
    (a / "sharded" / "shard_0.pt").write_bytes(b"1")
    before = model_fingerprint(a)
    (a / "sharded" / "shard_0.pt").write_bytes(b"2")
    assert model_fingerprint(a) != before
    assert model_fingerprint("Qwen/Qwen3-4B-Base") is None and model_fingerprint(tmp_path / "missing") is None


def test_model_fingerprint_of_large_files_reads_their_edges(tmp_path, monkeypatch):
    import oblr.provenance as prov

    monkeypatch.setattr(prov, "FULL_HASH_BYTES", 100)
    monkeypatch.setattr(prov, "EDGE_BYTES", 10)
    (tmp_path / "model.safetensors").write_bytes(bytes(range(200)))
    first = prov.model_fingerprint(tmp_path)
    data = bytearray(range(200))
    data[195] = 0  # inside the last 10 bytes
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    assert prov.model_fingerprint(tmp_path) != first
    (tmp_path / "model.safetensors").write_bytes(bytes(range(200)) + b"\0")  # another size
    assert prov.model_fingerprint(tmp_path) != first


def test_clear_partial_moves_a_folder_of_damaged_checkpoints_aside_and_removes_an_empty_partial(tmp_path):
    from oblr.experiments.grid import clear_partial

    damaged = tmp_path / "v" / "seed0"
    (damaged / "checkpoints" / "step_000004").mkdir(parents=True)
    (damaged / "checkpoints" / "step_000004" / "model.safetensors").write_bytes(b"truncated")  # no state file
    (damaged / "metrics.jsonl").write_text('{"step": 1}\n')
    aside = clear_partial(damaged)
    assert aside == damaged.with_name("seed0.damaged") and not damaged.exists()
    assert (aside / "checkpoints" / "step_000004" / "model.safetensors").read_bytes() == b"truncated"
    assert (aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
    partial = tmp_path / "v" / "seed1"
    partial.mkdir()
    (partial / "metrics.jsonl").write_text("")
    assert clear_partial(partial) is None and not partial.exists()
    assert clear_partial(tmp_path / "v" / "never-made") is None


def test_only_and_seeds_select_part_of_a_grid_into_the_whole_grids_folders(tmp_path, capsys):
    from oblr.experiments.grid import run_dir_of, select

    grid = grid_from_dict({"base": {}, "seeds": [0, 1, 2],
                           "runs": [{"name": "a"}, {"name": "b", "optim.lr": 0.5}, {"name": "c"}]}, "g.yaml")
    part = select(grid, ["c", "a"], [2, 5])
    assert [v.name for v in part.variants] == ["a", "c"] and part.seeds == [2, 5]  # the grid's order
    assert [(p.variant, p.seed) for p in plan_grid(part, tmp_path)] == [("a", 2), ("a", 5), ("c", 2), ("c", 5)]
    assert [p.run_dir for p in plan_grid(part, tmp_path)][0] == run_dir_of(tmp_path, "a", 2)  # the full grid's
    assert select(grid).variants == grid.variants and select(grid).seeds == [0, 1, 2]
    for only, seeds, msg in ((["a", "x"], None, "no variant 'x'; the grid has: a, b, c"), ([], None, "names no variant"),
                             (None, [-1], "non-negative"), (None, [1, 1], "distinct"), (None, [], "distinct")):
        with pytest.raises(ConfigError) as e:
            select(grid, only, seeds)
        assert msg in str(e.value)
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"base": {}, "seeds": [0, 1], "runs": [{"name": "a"}, {"name": "b"}]}))
    assert main(["compare", "--config", str(path), "--out", str(tmp_path / "o"), "--dry-run",
                 "--only", "b", "--seeds", "1"]) == 0
    said = "".join(capsys.readouterr())
    assert "1 variants x 1 seeds = 1 runs" in said and "b/seed1" in said and "a/seed" not in said
    assert main(["compare", "--config", str(path), "--out", str(tmp_path / "o"), "--only", "z"]) == 2
    assert "no variant 'z'" in "".join(capsys.readouterr()) and not (tmp_path / "o").exists()
