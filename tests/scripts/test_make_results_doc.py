"""scripts/make_results_doc.py: the generated results document keeps every section other scripts spliced in, and
says per run folder which start model its runs recorded (shipped bytes, other weights, not recorded)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import make_results_doc as mrd  # noqa: E402


def _run(folder: Path, fingerprint: str | None, name: str = "builtin") -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text("{}")
    if fingerprint is not None:
        (folder / "code.json").write_text(json.dumps({"start_model": {"name_or_path": name,
                                                                       "fingerprint": fingerprint}}))


def test_start_models_sorts_runs_by_recorded_fingerprint(tmp_path):
    _run(tmp_path / "g" / "a" / "seed0", "f-shipped")
    _run(tmp_path / "g" / "a" / "seed1", "f-shipped")
    _run(tmp_path / "g" / "b" / "seed0", "f-other")
    _run(tmp_path / "g" / "b" / "seed1", None)  # no code.json
    (tmp_path / "g" / "b" / "seed2").mkdir()  # no summary: not a finished run, not counted
    rows = mrd.start_models([tmp_path / "g"], {"f-shipped": "tiny-arith-v1"})
    assert sorted((n, what) for _, n, what in rows) == [
        (1, "builtin = other weights"), (1, "not recorded"), (2, "builtin = shipped tiny-arith-v1")]


def test_shipped_fingerprints_are_the_ones_a_run_records():
    from oblr.models import shipped
    from oblr.provenance import model_fingerprint
    fps = mrd.shipped_fingerprints()
    assert sorted(fps.values()) == sorted(shipped.manifest())
    for fp, d in fps.items():  # recomputed from the folder the loader verifies
        assert model_fingerprint(shipped.verified_dir(d)) == fp


def test_regeneration_keeps_every_spliced_section_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "grid"
    _run(grid / "oblr-const" / "seed0", "f-shipped")
    (grid / "report").mkdir()
    (grid / "report" / "comparison.md").write_text("| method | acc |\n|---|---|\n| oblr | 0.4 |\n")
    (grid / "grid_status.json").write_text(json.dumps({"seconds": 60, "runs": [{"status": "done", "seconds": 60}]}))
    proxy = tmp_path / "proxy"
    proxy.mkdir()
    (proxy / "proxy_study.md").write_text("proxy table\n")
    committed = Path("benchmarks/results/sweep")
    _run(committed / "grpo" / "seed0", None)
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    sections = [f"{b}\n## {b[5:17]} body\nfrom `{committed}`.\n{e}" for b, e in mrd.KEPT]
    out.write_text("# old\n\n" + "\n\n".join(reversed(sections)) + "\n\n## Reading\n\nold reading\n")
    reading = tmp_path / "reading.md"
    reading.write_text("new reading\n")
    monkeypatch.setattr(mrd, "shipped_fingerprints", lambda: {"f-shipped": "tiny-arith-v1"})
    assert mrd.main([str(grid), str(proxy), "--reading", str(reading), "--out", str(out)]) == 0
    text = out.read_text()
    starts = [text.index(b) for b, _ in mrd.KEPT]
    assert starts == sorted(starts) and all(e in text for _, e in mrd.KEPT)  # all three, in KEPT order
    assert text.index("## Start models of these tables") < text.index("## Comparison") < starts[0]
    assert f"| `{grid}` | 1 | builtin = shipped tiny-arith-v1 |" in text
    assert f"| `{committed}` | 1 | not recorded |" in text
    assert text.rstrip().endswith("new reading") and "old reading" not in text
