"""oblr.train.summary: the status a run folder's summary.json records, and which runs count as finished."""

import json

from oblr.train.summary import is_finished, summary_status


def test_only_a_completed_summary_is_a_finished_run(tmp_path):
    assert summary_status(tmp_path) is None and not is_finished(tmp_path)
    for status in ("interrupted", "failed"):
        (tmp_path / "summary.json").write_text(json.dumps({"status": status, "steps": 2}))
        assert summary_status(tmp_path) == status and not is_finished(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "completed", "steps": 2}))
    assert is_finished(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 2}))  # written before the key existed
    assert summary_status(tmp_path) == "completed" and is_finished(tmp_path)
    for bad in ('{"status": "compl', "[1, 2]"):
        (tmp_path / "summary.json").write_text(bad)
        assert summary_status(tmp_path) == "unreadable" and not is_finished(tmp_path)
