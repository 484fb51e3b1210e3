"""Which code made a run: the package version, the git commit (if the package lives in a git work tree) and a
hash of the package's own source files.

:func:`code_identity` is written into every run folder as ``code.json`` when the run starts (and into
``summary.json`` as ``code``), so that a folder says which code produced its numbers. The source hash is what
decides "the same code": it covers every ``.py`` file of the installed :mod:`oblr` package (relative path and
bytes), whether or not git is there, and ignores everything outside it (tests, docs, benchmarks). The git
commit and whether the work tree had uncommitted changes are recorded for people, not compared.
:func:`same_code` compares a folder's record with the running code; ``oblr compare`` uses it to refuse (or,
when asked, rerun) a run folder made by other code (:mod:`oblr.experiments.grid`).

The record also names the start model: ``start_model`` = ``{"name_or_path", "fingerprint"}``, the fingerprint
(:func:`model_fingerprint`) of the local folder the run's weights were loaded from when it started (None for
a hub id). Built-in models are built on each machine and differ between machines, so the same code and config
can start from other weights; :func:`same_start_model` lets ``oblr compare`` tell such a folder apart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
from pathlib import Path

from oblr import __version__

CODE_FILE = "code.json"
PACKAGE_DIR = Path(__file__).resolve().parent


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 over the sorted ``.py`` files under ``package_dir``: each file's relative path, then its bytes."""
    h = hashlib.sha256()
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


#: files whose bytes make a model folder's fingerprint (weights, and the config that shapes them)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
FULL_HASH_BYTES = 64 << 20  # files up to this size are hashed whole ...
EDGE_BYTES = 4 << 20        # ... larger ones by size, first and last EDGE_BYTES (seconds for an 8B checkpoint)


def model_fingerprint(path) -> str | None:
    """sha256 over a local model folder's ``config.json`` and weight files (:data:`WEIGHT_SUFFIXES`, subfolders
    included): each file's relative path and size, then its bytes (whole up to :data:`FULL_HASH_BYTES`, else
    its first and last :data:`EDGE_BYTES`). None when ``path`` is not a local folder (a hub id)."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = sorted(f for f in folder.rglob("*")
                   if f.is_file() and (f.suffix in WEIGHT_SUFFIXES or f.name == "config.json"))
    h = hashlib.sha256()
    for f in files:  # subfolders too: a sharded checkpoint keeps its weights under sharded/
        size = f.stat().st_size
        h.update(f"{f.relative_to(folder).as_posix()}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= FULL_HASH_BYTES:
                h.update(fh.read())
            else:
                h.update(fh.read(EDGE_BYTES))
                fh.seek(size - EDGE_BYTES)
                h.update(fh.read(EDGE_BYTES))
    return h.hexdigest()


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def code_identity() -> dict:
    """``{"version", "source_hash", "git_commit", "git_dirty"}`` of the running oblr (git fields None when the
    package is not in a git work tree, e.g. installed from a wheel)."""
    commit = _git("rev-parse", "HEAD")
    dirty = None
    if commit is not None:
        status = _git("status", "--porcelain", "--", ".")
        dirty = bool(status) if status is not None else None
    return {"version": __version__, "source_hash": source_hash(), "git_commit": commit, "git_dirty": dirty}


def read_code_file(run_dir: Path) -> dict | None:
    """The code record of a run folder, or None when it has none (made before runs recorded it) or it is
    unreadable. ``segments`` lists the code of each start or resumption (``from_step``)."""
    try:
        rec = json.loads((Path(run_dir) / CODE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(rec, dict) and isinstance(rec.get("source_hash"), str)):
        return None
    segs = rec.get("segments")
    if not (isinstance(segs, list) and all(isinstance(s, dict) and isinstance(s.get("source_hash"), str)
                                           for s in segs)):
        rec["segments"] = [dict(rec, from_step=0)]
    return rec


def code_record(run_dir: Path, start_step: int, start_model: dict | None = None) -> str:
    """The text of ``code.json`` for a run (re)starting at ``start_step`` in ``run_dir``: the running code as a
    new segment after the segments already recorded there (those at or after ``start_step`` are dropped: the
    steps they made are being made again). Top-level fields: the code of the newest segment; ``mixed`` is
    true when the segments differ in source; ``start_model`` (module docstring): ``start_model`` when the run
    starts (``start_step`` 0), the recorded one when it resumes."""
    old = read_code_file(run_dir) if start_step > 0 else None
    segs = [s for s in (old or {}).get("segments", []) if s.get("from_step", 0) < start_step]
    if start_step > 0 and not segs:  # resumed from a folder made before code was recorded
        segs = [{"from_step": 0, "version": None, "source_hash": "unknown", "git_commit": None, "git_dirty": None}]
    segs.append({"from_step": start_step, **code_identity()})
    rec = {**code_identity(), "mixed": len({s["source_hash"] for s in segs}) > 1, "segments": segs}
    model = start_model if start_step == 0 else (old or {}).get("start_model")
    if model is not None:
        rec["start_model"] = model
    return json.dumps(rec, indent=2) + "\n"


def same_start_model(run_dir: Path, fingerprint: str | None) -> tuple[bool, str]:
    """``(True, "")`` unless ``run_dir`` recorded a start-model fingerprint and ``fingerprint`` (the model the
    run would start from now) is another one; then ``(False, why)``. A folder without the record, or a model
    without a fingerprint (a hub id), cannot be told apart and counts as the same."""
    rec = read_code_file(run_dir)
    old = ((rec or {}).get("start_model") or {}).get("fingerprint")
    if old is None or fingerprint is None or old == fingerprint:
        return True, ""
    name = (rec.get("start_model") or {}).get("name_or_path", "?")
    return False, (f"started from other weights of {name!r} (fingerprint {old[:12]}, the model now is "
                   f"{fingerprint[:12]}: a built-in model is built per machine)")


def describe(rec: dict | None) -> str:
    """One phrase for a code record: ``oblr 0.1.0, commit 1a2b3c4 (modified), source 5d6e7f8a``."""
    if rec is None or rec.get("source_hash") == "unknown":
        return "code that did not record itself (no code.json)"
    parts = [f"oblr {rec.get('version', '?')}"]
    if rec.get("git_commit"):
        parts.append(f"commit {rec['git_commit'][:10]}{' (modified)' if rec.get('git_dirty') else ''}")
    parts.append(f"source {rec['source_hash'][:12]}")
    return ", ".join(parts)


def same_code(run_dir: Path) -> tuple[bool, str]:
    """``(True, "")`` when ``run_dir`` was made by the running code (same source hash); else ``(False, why)``
    naming both."""
    rec = read_code_file(run_dir)
    now = code_identity()
    if rec is not None and all(s["source_hash"] == now["source_hash"] for s in rec["segments"]):
        return True, ""
    if rec is not None and rec["source_hash"] == now["source_hash"]:  # resumed with this code, started with other
        first = next(s for s in rec["segments"] if s["source_hash"] != now["source_hash"])
        return False, (f"started (from step {first.get('from_step', 0)}) by {describe(first)}, "
                       f"resumed with this code ({describe(now)})")
    return False, f"made by {describe(rec)}; this is {describe(now)}"
