"""The built-in models as shipped bytes: one start model on every machine.

The three built-in checkpoints (``builtin:tiny-arith``, ``builtin:tiny-countdown``, ``builtin:tiny-words``)
ship inside the package, in ``oblr/models/weights/<dirname>/`` (a Hugging Face folder each: config,
safetensors weights, tokenizer, ``oblr_builtin.json`` with the recipe, the build's measured accuracy and the
library versions). ``weights/MANIFEST.json`` holds every file's sha256; a name resolves to its shipped folder
only when every file matches (:func:`verified_dir`), so a run starts from the same bytes on every machine.

Building stays possible: the recipe in :mod:`oblr.models.builtin` / :mod:`oblr.models.task_builtins` made
these bytes (``scripts/ship_builtin_models.py`` builds and ships them), ``oblr models build NAME`` rebuilds one
and says whether this machine reproduces the shipped bytes (:func:`compare_build`), and ``OBLR_BUILTIN=build``
makes every built-in name resolve to a build of this machine in ``$OBLR_CACHE_DIR`` instead (numbers then
differ from the documented ones: a CPU's float reductions decide the SFT's outcome).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST_FILE = "MANIFEST.json"
#: environment variable choosing where built-in names resolve: ``shipped`` (default) or ``build``
SOURCE_ENV = "OBLR_BUILTIN"
SOURCES = ("shipped", "build")
#: the files of a shipped folder (anything else in a build, e.g. a generation config, ships too if present)
WEIGHTS_FILE = "model.safetensors"
_verified: dict[tuple[str, str], Path] = {}  # (weights dir, dirname) -> folder already checked in this process


def source() -> str:
    """``shipped`` or ``build`` from ``$OBLR_BUILTIN`` (unset: ``shipped``); anything else is refused."""
    value = os.environ.get(SOURCE_ENV, "").strip().lower() or "shipped"
    if value not in SOURCES:
        raise ValueError(f"environment variable {SOURCE_ENV}={os.environ[SOURCE_ENV]!r}: must be one of "
                         f"{', '.join(SOURCES)} (shipped: the bytes in the package; build: built on this machine)")
    return value


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest(weights_dir: Path | None = None) -> dict:
    """The shipped manifest: ``{dirname: {"name", "files": {file: sha256}, "weights_sha256", "accuracy_sampled_t1",
    "accuracy_greedy", "n_measure", "recipe", "versions", "torch_threads"}}``; ``{}`` when nothing is shipped."""
    path = (weights_dir or WEIGHTS_DIR) / MANIFEST_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def entry(dirname: str, weights_dir: Path | None = None) -> dict | None:
    return manifest(weights_dir).get(dirname)


def verified_dir(dirname: str, weights_dir: Path | None = None) -> Path:
    """The shipped folder of ``dirname`` after checking every file against the manifest (once per process).

    A missing manifest entry, a missing file or a file whose sha256 differs raises ``FileNotFoundError`` in one
    line naming the file and the two ways on (reinstall, or ``OBLR_BUILTIN=build``)."""
    root = weights_dir or WEIGHTS_DIR
    key = (str(root), dirname)
    if key in _verified:
        return _verified[key]
    ent = entry(dirname, root)
    fix = (f"reinstall oblr (pip install --force-reinstall oblr, or git checkout the repository's "
           f"src/oblr/models/weights), or set {SOURCE_ENV}=build to build it on this machine instead")
    if ent is None:
        raise FileNotFoundError(f"built-in model {dirname} is not shipped in {root} (no entry in {MANIFEST_FILE}); {fix}")
    folder = root / dirname
    for name, digest in sorted(ent["files"].items()):
        f = folder / name
        if not f.is_file():
            raise FileNotFoundError(f"built-in model {dirname}: shipped file {f} is missing; {fix}")
        got = sha256_file(f)
        if got != digest:
            raise FileNotFoundError(f"built-in model {dirname}: shipped file {f} is damaged (sha256 {got[:12]}..., "
                                    f"expected {digest[:12]}...); {fix}")
    _verified[key] = folder
    return folder


def _build_files(build_dir: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(build_dir.iterdir()) if p.is_file()}


def compare_build(build_dir: str | os.PathLike, dirname: str, weights_dir: Path | None = None) -> dict:
    """How a build of this machine compares with the shipped bytes of ``dirname``: ``{"identical_weights",
    "identical_files": [...], "different_files": [...], "max_abs_weight_diff", "shipped_sha256", "build_sha256"}``.
    ``oblr_builtin.json`` is left out of the file comparison (it records timings)."""
    from safetensors.torch import load_file

    from oblr.models.builtin import METADATA_FILE

    root = weights_dir or WEIGHTS_DIR
    ent = entry(dirname, root)
    if ent is None:
        raise FileNotFoundError(f"built-in model {dirname} is not shipped in {root}")
    build = _build_files(Path(build_dir))
    same, diff = [], []
    for name, digest in sorted(ent["files"].items()):
        if name == METADATA_FILE:
            continue
        (same if build.get(name) == digest else diff).append(name)
    a = load_file(str(root / dirname / WEIGHTS_FILE))
    b = load_file(str(Path(build_dir) / WEIGHTS_FILE))
    if set(a) != set(b):
        max_diff = float("inf")
    else:
        max_diff = max((float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].numel()),
                       default=0.0) if all(a[k].shape == b[k].shape for k in a) else float("inf")
    return {"identical_weights": build.get(WEIGHTS_FILE) == ent["weights_sha256"], "identical_files": same,
            "different_files": diff, "max_abs_weight_diff": max_diff, "shipped_sha256": ent["weights_sha256"],
            "build_sha256": build.get(WEIGHTS_FILE)}


def ship(build_dir: str | os.PathLike, dirname: str, weights_dir: Path | None = None) -> dict:
    """Copy a complete build into ``weights/<dirname>`` and record it in the manifest; returns its entry.

    The build's ``oblr_builtin.json`` must hold its recipe (a default build, not a test-sized one)."""
    from oblr.models.builtin import METADATA_FILE

    root = weights_dir or WEIGHTS_DIR
    src = Path(build_dir)
    meta = json.loads((src / METADATA_FILE).read_text())
    if not meta.get("recipe"):
        raise ValueError(f"{src} is not a default build (its {METADATA_FILE} holds no recipe); build it with the "
                         f"default recipe before shipping it")
    dst = root / dirname
    tmp = root / f".tmp-{dirname}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if dst.exists():
        shutil.rmtree(dst)
    os.rename(tmp, dst)
    files = _build_files(dst)
    ent = {"name": meta["name"], "files": files, "weights_sha256": files[WEIGHTS_FILE],
           "accuracy_sampled_t1": meta["accuracy_sampled_t1"], "accuracy_greedy": meta["accuracy_greedy"],
           "n_measure": meta["n_measure"], "recipe": meta["recipe"], "versions": meta["versions"],
           "torch_threads": meta["torch_threads"]}
    man = manifest(root)
    man[dirname] = ent
    (root / MANIFEST_FILE).write_text(json.dumps(dict(sorted(man.items())), indent=2) + "\n")
    _verified.pop((str(root), dirname), None)
    return ent
