"""Disk and environment faults made real with mounts in a private namespace (``unshare -rm``; skipped with
the reason where that is impossible): a read-only output folder and a read-only HOME (the model cache) are
refused in one line before any model loads; a disk that fills up during a run ends it in one line that
names the last good checkpoint, which is intact. A file where a folder should be needs no mount."""

from __future__ import annotations

import shlex
import sys

from fault_helpers import in_namespace, train_args

from oblr.cli import main
from oblr.train.checkpoint import checkpoint_problem, latest_checkpoint, load_trainer_state


def _cmd(args) -> str:
    return " ".join(shlex.quote(a) for a in [sys.executable, "-m", "oblr.cli", *args])


def _one_error_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("oblr: error: "), text[-3000:]
    return lines[0]


def test_read_only_output_folder_and_read_only_home_fail_in_one_line_before_the_model(small_builtin, tmp_path):
    mnt, res = tmp_path / "mnt", tmp_path / "res"
    mnt.mkdir(), res.mkdir()
    run = train_args(small_builtin, mnt / "run", 1)
    builtin = train_args("builtin", tmp_path / "run2", 1)  # with OBLR_BUILTIN=build: needs a writable cache
    r = in_namespace(f"""
        mount -t tmpfs -o size=4m tmpfs {mnt} && mkdir {mnt}/home && mount -o remount,ro {mnt} || exit 99
        {_cmd(run)} 2> {res}/out.err; echo $? > {res}/out.rc
        env -u OBLR_CACHE_DIR OBLR_BUILTIN=build HOME={mnt}/home {_cmd(builtin)} 2> {res}/home.err; echo $? > {res}/home.rc
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    line = _one_error_line((res / "out.err").read_text())
    assert (res / "out.rc").read_text().strip() == "2"
    assert f"run folder {mnt / 'run'} is not writable: Read-only file system" in line, line
    line = _one_error_line((res / "home.err").read_text())
    assert (res / "home.rc").read_text().strip() == "2"
    assert f"cache folder {mnt}/home/.cache/oblr/models is not writable" in line and "OBLR_CACHE_DIR" in line
    assert "building" not in (res / "home.err").read_text()  # refused before the build started


def test_a_file_where_a_folder_should_be(small_builtin, tmp_path, capsys, monkeypatch):
    f = tmp_path / "file"
    f.write_text("not a folder")
    assert main(train_args(small_builtin, f, 1)) == 2
    assert f"run folder {f} is a file, not a folder" in _one_error_line(capsys.readouterr().err)
    assert main(train_args(small_builtin, f / "run", 1)) == 2
    assert f"{f} is a file, not a folder" in _one_error_line(capsys.readouterr().err)
    monkeypatch.setenv("OBLR_CACHE_DIR", str(f))
    monkeypatch.setenv("OBLR_BUILTIN", "build")  # the shipped model needs no cache; a build of this machine does
    assert main(train_args("builtin", tmp_path / "run", 1)) == 2
    assert f"{f} is a file, not a folder" in _one_error_line(capsys.readouterr().err)
    assert f.read_text() == "not a folder"


def test_full_disk_ends_in_one_line_and_the_last_good_checkpoint_is_intact(small_builtin, tmp_path):
    mnt, res = tmp_path / "mnt", tmp_path / "res"
    mnt.mkdir(), res.mkdir()
    args = train_args(small_builtin, mnt / "run", 500, "train.save_every=1", "train.eval_every=0",
                      "task.eval_size=0")
    # once the first checkpoint is complete, the rest of the file system is filled up
    r = in_namespace(f"""
        mount -t tmpfs -o size=64m tmpfs {mnt} || exit 99
        {_cmd(args)} 2> {res}/err & pid=$!
        i=0
        while [ ! -f {mnt}/run/checkpoints/LATEST ] && kill -0 $pid 2>/dev/null && [ $i -lt 3000 ]; do
            sleep 0.1; i=$((i+1)); done
        dd if=/dev/zero of={mnt}/fill bs=64k 2>/dev/null
        wait $pid; echo $? > {res}/rc
        rm -f {mnt}/fill; cp -a {mnt}/run {res}/run
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    line = _one_error_line((res / "err").read_text())
    assert (res / "rc").read_text().strip() == "1", line
    assert "No space left on device" in line and "the last good checkpoint" in line, line
    good = latest_checkpoint(res / "run")
    assert f"{mnt}/run/checkpoints/{good.name} is intact" in line, line
    assert checkpoint_problem(good, deep=True) is None and load_trainer_state(good)["step"] >= 1
    assert not [p for p in (res / "run" / "checkpoints").iterdir() if p.name.startswith(".")]  # no leftovers


def test_trainer_state_on_a_full_disk_is_an_os_error(tmp_path):
    """``torch.save`` on a path reports a full disk as a bare RuntimeError from its zip writer (which the
    trainer would not recognise as a disk fault); the state file must fail with ENOSPC instead."""
    mnt, res = tmp_path / "mnt", tmp_path / "res"
    mnt.mkdir(), res.mkdir()
    code = ("import errno, torch; from oblr.train.checkpoint import write_state\n"
            "try:\n"
            f"    write_state('{mnt}', 3, {{'w': torch.zeros(1_000_000)}})\n"
            "except OSError as e:\n"
            "    print('OSError', e.errno == errno.ENOSPC)\n")
    r = in_namespace(f"""
        mount -t tmpfs -o size=1m tmpfs {mnt} || exit 99
        {shlex.quote(sys.executable)} -c {shlex.quote(code)} > {res}/out 2>&1; echo $? > {res}/rc
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (res / "out").read_text().strip() == "OSError True", (res / "out").read_text()
