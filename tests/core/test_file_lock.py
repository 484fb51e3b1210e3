"""oblr.file_lock: a lock taken by one open file refuses every other (in this process and in others), says who
holds it, and is released by closing the file or by the holder's death; testing a lock creates nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from oblr.file_lock import holder, try_lock


def test_a_held_lock_refuses_a_second_taker_and_names_its_holder(tmp_path):
    path = tmp_path / "x.lock"
    fh = try_lock(path)
    assert fh is not None
    assert path.read_text() == f"{os.getpid()}\n"
    assert try_lock(path) is None  # another open file, same process: refused
    assert holder(path) == str(os.getpid())
    assert path.read_text() == f"{os.getpid()}\n"  # a refused taker erased nothing
    fh.close()
    assert holder(path) is None
    again = try_lock(path, note="7 123.000")
    assert again is not None and holder(path) == "7 123.000"
    again.close()


def test_testing_a_lock_creates_nothing_and_a_missing_folder_is_an_error(tmp_path):
    assert holder(tmp_path / "none.lock") is None
    assert not (tmp_path / "none.lock").exists()
    with pytest.raises(FileNotFoundError):
        try_lock(tmp_path / "no-such-folder" / "x.lock")


def test_another_process_holds_it_until_it_dies(tmp_path):
    path = tmp_path / "x.lock"
    code = ("import sys, time; from oblr.file_lock import try_lock; fh = try_lock(sys.argv[1]); "
            "print('held' if fh else 'refused', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert holder(path) == str(proc.pid)
        assert try_lock(path) is None
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 10
    while holder(path) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder(path) is None  # killed: the kernel released it, no stale lock
    fh = try_lock(path)
    assert fh is not None
    fh.close()
