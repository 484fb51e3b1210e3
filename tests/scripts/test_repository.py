"""The committed tree stays reproducible by any reader: no tracked file names an absolute folder of one
machine (a home, scratch or work folder), and none cites the specification or design notes kept beside
the repository (they are not in it; docs/spec.md is) as evidence. Reads every tracked text file
(``git ls-files``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# an absolute path into a machine's own folders; not a URL's path (a word character or a dot before the
# slash), not "~/..." and not a path built in code ("{mnt}/home/...", "$HOME/...")
MACHINE_PATH = re.compile(r"(?<![\w.~}$-])/(work|root|home|tmp|Users|mnt|scratch)/[\w.-]")
# the notes kept beside the repository, cited as if a reader had them; "../shared/data", the documented
# default data folder, is a location and not evidence
OUTSIDE_CITATION = re.compile(r"\bSPEC\.md\b|\bDESIGN\.md\b|\.\./shared/(?!data\b)")


def _tracked_text_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    files = []
    for name in names.decode().split("\0"):
        path = ROOT / name
        if not name or not path.is_file():
            continue
        head = path.read_bytes()[:8192]
        if b"\0" in head:  # binary (images)
            continue
        files.append(path)
    return files


def _matches(pattern: re.Pattern) -> list[str]:
    found = []
    for path in _tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            m = pattern.search(line)
            if m:
                found.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:120]}")
    return found


def test_the_patterns_catch_what_they_are_for():
    # built from pieces, so that this file itself holds none of them
    bad = ["run `/" + "work/baseline/demo-v2`", 'Path("/' + 'tmp/mut-work")', "/" + "home/user/x",
           "output_dir: /" + "root/runs/a"]
    good = ["https://download.pytorch.org/whl/cpu", "~/.cache/oblr", 'f"{mnt}/home/.cache"', "runs/work/a",
            "$HOME/.cache"]
    assert all(MACHINE_PATH.search(s) for s in bad) and not any(MACHINE_PATH.search(s) for s in good)
    cites = ["as SPEC" + ".md asks", "see DESIGN" + ".md", ".." + "/shared/paper/summary.md"]
    assert all(OUTSIDE_CITATION.search(s) for s in cites)
    assert not any(OUTSIDE_CITATION.search(s) for s in ["data from ../shared/data", "docs/spec.md", "beside `../shared`"])


def test_no_tracked_file_holds_an_absolute_machine_path():
    found = _matches(MACHINE_PATH)
    assert not found, "absolute machine paths in tracked files (use repository-relative paths):\n" + "\n".join(found)


def test_no_tracked_file_cites_notes_kept_outside_the_repository():
    found = _matches(OUTSIDE_CITATION)
    assert not found, ("tracked files cite notes that are not in the repository (cite docs/spec.md or the paper, "
                       "arXiv 2511.23310):\n" + "\n".join(found))


_NAMED_FILE = re.compile(r"\b((?:tests|benchmarks|examples|scripts|src/oblr)/[\w/.-]+\.(?:py|sh|md|json|yaml))\b")


def test_every_file_the_docs_name_exists():
    """README and docs name test files, benchmarks and scripts as evidence: each one must exist."""
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in _NAMED_FILE.finditer(doc.read_text()):
            path = m.group(1).rstrip(".")
            if "*" not in path and not (ROOT / path).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, "files named in the docs that do not exist:\n" + "\n".join(missing)
