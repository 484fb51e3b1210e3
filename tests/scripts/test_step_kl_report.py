"""benchmarks/step_kl_report.py: the KL-per-step probe table recomputed by hand from synthetic run folders."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from test_paper_regime_report import _run

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_kl_report as skr  # noqa: E402


def _probe(root: Path, name: str, *, lr: float, kls, optimizer="adamw", task="arithmetic") -> Path:
    d = root / name / "seed0"
    d.mkdir(parents=True)
    cfg = {"task": {"name": task}, "optim": {"optimizer": optimizer, "lr": lr},
           "algorithm": {"baseline": "grpo", "lr_schedule": "constant", "track_step_kl": True},
           "rollout": {"prompts_per_step": 128, "group_size": 8}, "train": {"seed": 0, "steps": len(kls)}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"step": i + 1, "optim/lr": lr, "policy/step_kl": k} for i, k in enumerate(kls)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d


def test_probe_rows_by_hand(tmp_path):
    grid, probes = tmp_path / "grid", tmp_path / "probes"
    for s, f in enumerate((0.50, 0.54)):
        _run(grid, "grpo-3e-4", s, lr=3e-4, optimizer="adamw", final=f, steps=100)
    _run(grid, "grpo-1e-3", 0, lr=1e-3, optimizer="adamw", final=0.30, steps=100)
    _run(grid, "grpo-1e-3-long", 0, lr=1e-3, optimizer="adamw", final=0.90, steps=200)  # another budget: ignored
    _probe(probes, "a", lr=3e-4, kls=[0.05, 0.002, 0.008, 0.0, 0.004])  # a zero (no gradient) is left out
    _probe(probes, "b", lr=1e-3, kls=[0.4, 0.04, 0.01, 0.02])
    out = tmp_path / "out"
    assert skr.main(["--probes", str(probes), "--grids", str(grid), "--targets", "0.004", "--out", str(out)]) == 0
    md = (out / "step_kl.md").read_text()
    assert (out / "step_kl.png").stat().st_size > 0
    g_a = (0.002 * 0.008 * 0.004) ** (1 / 3)  # 0.004
    g_b = (0.04 * 0.01 * 0.02) ** (1 / 3)
    assert math.isclose(g_a, 0.004)
    row_a = next(line for line in md.splitlines() if "| 0.0003 |" in line)
    row_b = next(line for line in md.splitlines() if "| 0.001 |" in line)
    # the best fixed rate of the 100-step grid is marked; the 200-step run is not pooled into the 1e-3 row
    assert "**52.0 ± 2.8 (2)** (best)" in row_a and "| 30.0 (1) |" in row_b
    cells_a = [c.strip() for c in row_a.strip("|").split("|")]
    assert cells_a[4:] == ["0.05", f"{g_a:.2g}", f"{(0.008 + 0.0 + 0.004) / 3:.2g}", f"{3e-4:.2g}"]
    cells_b = [c.strip() for c in row_b.strip("|").split("|")]
    assert cells_b[5] == f"{g_b:.2g}" and cells_b[7] == f"{1e-3 * math.sqrt(0.004 / g_b):.2g}"


def test_a_probe_without_the_kl_is_refused_in_one_line(tmp_path):
    d = _probe(tmp_path / "p", "a", lr=1e-3, kls=[0.1, 0.2, 0.3])
    (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "optim/lr": 1e-3}) + "\n")
    with pytest.raises(SystemExit, match="track_step_kl=true"):
        skr.main(["--probes", str(tmp_path / "p"), "--grids", str(tmp_path / "p"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--targets must be positive"):
        skr.main(["--probes", str(tmp_path / "p"), "--grids", str(tmp_path / "p"), "--targets", "0",
                  "--out", str(tmp_path / "o")])
