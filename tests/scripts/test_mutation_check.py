"""scripts/mutation_check.py without running the suite: every planted bug still matches its code exactly once
(a moved line would otherwise be a silent SKIP), names are unique, the likely tests exist, the selection
refuses unknown names in one line, and the markdown table keeps its columns when a name holds a pipe."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import mutation_check as mc  # noqa: E402


@pytest.mark.parametrize("mutation", mc.M, ids=lambda m: m[0])
def test_each_mutation_matches_its_code_once_and_names_existing_tests(mutation):
    name, _, rel, old, new, *likely = mutation
    assert old != new
    assert (ROOT / rel).read_text().count(old) == 1, f"{name}: the planted text no longer matches {rel} once"
    for path in (likely[0] if likely else []):
        assert (ROOT / path).exists(), f"{name}: likely test {path} does not exist"


def test_names_are_unique_and_listed(capsys):
    names = [m[0] for m in mc.M]
    assert len(set(names)) == len(names)
    mc.main(["--list"])
    assert capsys.readouterr().out.splitlines() == names


def test_unknown_name_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        mc.main([".", sys.executable, "no such bug"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "unknown mutation name(s) ['no such bug']; see --list" in err
    with pytest.raises(SystemExit):
        mc.main([".", sys.executable, "--match", "zzz-nothing"])
    assert "no mutation selected" in capsys.readouterr().err


def test_table_escapes_pipes_and_marks_misses(tmp_path):
    rows = [{"name": "a |g|^2 bug", "quantity": "q", "file": "f.py", "caught": True, "by": ["t.py::x"]},
            {"name": "b", "quantity": "q", "file": "f.py", "caught": False, "by": [], "scope": "likely tests only"}]
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = mc.table(str(p)).splitlines()
    assert lines[2] == "| a \\|g\\|^2 bug (`f.py`) | q | `t.py::x` |"
    assert lines[3] == "| b (`f.py`) | q | **NOT caught** (likely tests only) |"
