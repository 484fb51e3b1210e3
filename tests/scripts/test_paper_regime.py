"""benchmarks/paper_regime.py: the paper-regime grids (every row 128 x 8 a step, the same budget, the rows the
study names) and the N-sweep statistics recomputed by hand from synthetic run folders."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import paper_regime as pr

from oblr.config import load_config


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_grid_rows_are_the_studys_rows_in_the_papers_regime(optimizer):
    g = pr.grid("countdown", optimizer, steps=40, seeds=[0, 1])
    assert g["seeds"] == [0, 1] and g["base"]["rollout"] == {"prompts_per_step": 128, "group_size": 8}
    assert g["base"]["train"]["steps"] == 40 and g["base"]["task"] == {"name": "countdown"}
    names = [r["name"] for r in g["runs"]]
    assert len(names) == len(set(names))  # one folder per row
    for r in g["runs"]:  # every row overrides neither N, G nor the steps: the same rollout budget
        assert r["optim.optimizer"] == optimizer
        assert not any(k.startswith(("rollout.", "train.")) for k in r)
    fixed = pr.FIXED_RATES[optimizer]
    assert all(b / a == pytest.approx(10 ** 0.5, rel=0.06) for a, b in zip(fixed, fixed[1:]))  # half-decades
    etas = pr.ETA_MAX[optimizer]
    assert etas[-1] / etas[0] >= 1000  # at least three decades of eta_max
    snr = [r for r in g["runs"] if r["algorithm.lr_schedule"] == "snr"]
    assert sorted({r["optim.snr_ema"] for r in snr}) == [0.0, 0.9] and len(snr) == 2 * len(etas)
    assert len([r for r in g["runs"] if r["algorithm.lr_schedule"] == "auto"]) == 4
    adam = [r["optim.lr"] for r in g["runs"] if r["algorithm.lr_schedule"] == "snr_adam"]
    assert adam == (etas if optimizer == "adamw" else [])  # oblr's rule for Adam: AdamW only, the same decades
    for base in ("grpo", "rloo", "oblr"):
        assert sorted(r["optim.lr"] for r in g["runs"] if r["algorithm.baseline"] == base
                      and r["algorithm.lr_schedule"] == "constant") == fixed


def test_a_grid_row_is_a_valid_config(tmp_path):
    from oblr.experiments.grid import grid_from_dict

    g = pr.grid("arithmetic", "adamw", steps=5, seeds=[0])  # every schedule of the grids (snr_adam: AdamW only)
    grid = grid_from_dict(json.loads(json.dumps(g)))
    assert len(grid.variants) == len(g["runs"])
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(g))
    assert load_config(None, ["rollout.prompts_per_step=128"]).rollout.prompts_per_step == 128


def _run(root: Path, name: str, n: int, ema: float, lrs: list[float], factors: list[float], nsnr: list[float],
         final: float | None):
    d = root / name / "seed0"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"rollout": {"prompts_per_step": n}, "optim": {"snr_ema": ema},
                                                   "train": {"steps": 4}}))
    rows = [{"step": 0, "eval/accuracy_sampled": 0.2}]
    rows += [{"step": k + 1, "snr/lr": lr, "snr/factor": f, "snr/n_snr": s}
             for k, (lr, f, s) in enumerate(zip(lrs, factors, nsnr))]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if final is not None:
        (d / "summary.json").write_text(json.dumps({"eval_accuracy_initial": 0.2, "eval_accuracy_final": final,
                                                    "eval_accuracy_greedy_final": 0.5, "wall_seconds": 10.0}))


def test_nsweep_statistics_by_hand_and_the_spliced_section(tmp_path):
    runs = tmp_path / "runs"
    _run(runs, "oblr-snr-batch-n16", 16, 0.0, [0.0, 1e-4, 0.0, 3e-4], [0.0, 0.1, 0.0, 0.3], [0.0, 0.2, 0.0, 0.6], 0.3)
    _run(runs, "oblr-snr-batch-n128", 128, 0.0, [2e-4, 4e-4, 6e-4, 8e-4], [0.2, 0.4, 0.6, 0.8], [1, 2, 3, 4], 0.4)
    _run(runs, "oblr-snr-ema-n128", 128, 0.9, [5e-4, 5e-4], [0.5, 0.5], [2, 2], None)  # unfinished
    rows = pr.nsweep_rows(runs)
    assert [(r["ema"], r["n"]) for r in rows] == [(0.0, 16), (0.0, 128), (0.9, 128)]
    a, b, c = rows
    assert a["lr0_share"] == 0.5 and b["lr0_share"] == 0.0  # 2 of 4 steps at lr 0
    assert a["factor_mean"] == pytest.approx(0.1) and a["factor_std"] == pytest.approx(
        statistics.stdev([0.0, 0.1, 0.0, 0.3]))
    assert b["n_snr_mean"] == pytest.approx(2.5) and b["lr_mean"] == pytest.approx(5e-4)
    assert a["final_sampled"] == 0.3 and not c["finished"] and c["steps"] == 2
    table = pr.nsweep_table(rows)
    assert "| current batch (snr_ema 0) | 16 | 4 | 0.100 ± 0.141 | 50.0 % |" in table
    assert "| EMA 0.9 | 128 | 2 of 4 (unfinished) |" in table
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n## Reading\n\ntext\n")
    out = tmp_path / "docs" / "results" / "paper-regime"
    assert pr.main(["nsweep", "--runs", str(runs), "--out", str(out), "--results-doc", str(doc)]) == 0
    assert (out / "nsweep.png").stat().st_size > 0 and json.loads((out / "nsweep.json").read_text())[0]["n"] == 16
    text = doc.read_text()
    assert text.index(pr.BEGIN) < text.index("## Reading")  # spliced before the reading, once
    assert "steps at lr 0 goes from 50.0 % to 0.0 %" in text and "N = 128 (EMA, 2 of 4 steps)" in text
    pr.main(["nsweep", "--runs", str(runs), "--out", str(out), "--results-doc", str(doc)])
    assert doc.read_text().count(pr.BEGIN) == 1
