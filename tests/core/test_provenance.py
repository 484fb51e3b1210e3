"""Which code made a run: the source hash follows the package's .py files and nothing else; records with
segments; the one-phrase description."""

import json

from oblr import provenance
from oblr.provenance import code_identity, code_record, describe, read_code_file, same_code, source_hash


def test_source_hash_follows_the_python_files_and_nothing_else(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    h = source_hash(pkg)
    (pkg / "notes.md").write_text("docs do not count")
    (pkg / "sub" / "__pycache__").mkdir()
    (pkg / "sub" / "__pycache__" / "b.py").write_text("compiled")
    assert source_hash(pkg) == h
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    assert source_hash(pkg) != h
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "sub" / "b.py").rename(pkg / "b.py")  # same bytes, another path
    assert source_hash(pkg) != h


def test_the_identity_of_the_running_code():
    now = code_identity()
    assert now["version"] == provenance.__version__ and now["source_hash"] == source_hash()
    assert len(now["source_hash"]) == 64
    assert now["git_commit"] is None or len(now["git_commit"]) == 40


def test_records_segments_and_descriptions(tmp_path, monkeypatch):
    assert read_code_file(tmp_path) is None and describe(None).startswith("code that did not record itself")
    assert not same_code(tmp_path)[0]
    (tmp_path / "code.json").write_text(code_record(tmp_path, 0))
    assert same_code(tmp_path) == (True, "")
    other = {"version": "9.9", "source_hash": "a" * 64, "git_commit": "b" * 40, "git_dirty": True}
    monkeypatch.setattr(provenance, "code_identity", lambda: other)
    ok, why = same_code(tmp_path)
    assert not ok and why.endswith(f"this is oblr 9.9, commit {'b' * 10} (modified), source {'a' * 12}")
    (tmp_path / "code.json").write_text(code_record(tmp_path, 5))
    rec = json.loads((tmp_path / "code.json").read_text())
    assert rec["mixed"] and [s["from_step"] for s in rec["segments"]] == [0, 5] and rec["source_hash"] == "a" * 64
    (tmp_path / "code.json").write_text("{not json")
    assert read_code_file(tmp_path) is None
    # resumed from a folder without a record: the first segment is unknown code
    (tmp_path / "code.json").unlink()
    rec = json.loads(code_record(tmp_path, 3))
    assert rec["mixed"] and rec["segments"][0]["source_hash"] == "unknown"
    assert describe(rec["segments"][0]).startswith("code that did not record itself")
