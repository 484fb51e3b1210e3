"""Loaders for the math sets in ``../shared/data`` and for user data (JSONL, JSON, Parquet, ``datasets``).

Every loader returns :class:`Records`, a list of :class:`MathRecord` with ``skipped`` (rows dropped under
``on_error="skip"``) and ``errors`` (their messages). A malformed row -- a line that is not UTF-8, bad or
over-deep JSON (read through :mod:`oblr.safe_load`), a missing or empty field, an answer that is neither a
string nor a number (a JSON object, ``null``, a boolean, NaN), an answer that cannot be extracted -- raises
``ValueError("<file>:<line>: ...")`` unless ``on_error="skip"``, which drops the row, counts it and warns
once with the count and the first message. Only a file that cannot be split into rows at all (a ``.json``
array with a syntax error, an unreadable Parquet file) fails under ``skip`` too.

The data directory is ``$OBLR_DATA_DIR`` if set, else ``shared/data`` beside the repository.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oblr.grading.extract import last_boxed
from oblr.safe_load import InputError, load_json


@dataclass
class MathRecord:
    """One problem. ``answer``: the reference final answer (a list for several answers, OlympiadBench)."""

    question: str
    answer: str | list[str]
    solution: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class Records(list):
    """A list of :class:`MathRecord` plus ``skipped`` (count) and ``errors`` (messages) of dropped rows."""

    def __init__(self, items: Iterable[MathRecord] = (), skipped: int = 0, errors: list[str] | None = None):
        super().__init__(items)
        self.skipped = skipped
        self.errors = errors or []


def data_dir() -> Path:
    env = os.environ.get("OBLR_DATA_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[4] / "shared" / "data"


# ---------------------------------------------------------------------------------------------- answers
_JSON_KINDS = {dict: "a JSON object", list: "a JSON array", type(None): "null", bool: "a boolean"}


def _answer_text(v: Any) -> str:
    """One answer as text: a string stripped, a number written out (``70.0`` -> ``"70"``); anything else
    (an object, an array, null, a boolean, NaN, inf) raises ValueError."""
    if isinstance(v, str):
        s = v.strip()
        if not s:
            raise ValueError("answer is empty")
        return s
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"answer is {v}")
        return str(int(v)) if v.is_integer() else repr(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    kind = _JSON_KINDS.get(type(v), type(v).__name__)
    raise ValueError(f"answer is {kind} ({str(v)[:40]}), expected a string or a number")


def answer_plain(value: Any) -> str | list[str]:
    """The field as the answer: strings stripped, numbers as text (``70.0`` -> ``"70"``), a list of those
    kept (several answers, OlympiadBench)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("answer list is empty")
        return [_answer_text(v) for v in value]
    return _answer_text(value)


def answer_gsm8k(value: Any) -> str:
    """The text after the last ``####`` of a GSM8K solution."""
    if not isinstance(value, str) or "####" not in value:
        raise ValueError("no '####' final answer in the solution")
    s = value[value.rfind("####") + 4:].strip()
    if not s:
        raise ValueError("empty answer after '####'")
    return s


def answer_boxed(value: Any) -> str:
    """The content of the last ``\\boxed{}`` of a solution."""
    s = last_boxed(value) if isinstance(value, str) else None
    if not s:
        raise ValueError("no \\boxed{...} answer in the solution")
    return s


ANSWER_FORMATS: dict[str, Callable[[Any], Any]] = {"plain": answer_plain, "gsm8k": answer_gsm8k,
                                                    "boxed": answer_boxed}


# ---------------------------------------------------------------------------------------------- rows
def _iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line or row number, row)``; a row that cannot be read is a ValueError in place of the row (so
    ``on_error="skip"`` can drop it); a file that cannot be split into rows raises ValueError naming it."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pragma: no cover - dependency missing
            raise ImportError("reading Parquet needs pyarrow: pip install 'oblr[data]'") from e
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001 - any Arrow failure: the file is not readable Parquet
            raise ValueError(f"{path}: cannot read it as Parquet ({type(e).__name__}: {e})") from None
        yield from enumerate(rows, start=1)
    elif suffix == ".json" and _starts_with_bracket(path):
        # undecodable bytes kept as lone surrogates: they fail the row that holds them, not the whole file
        text = path.read_bytes().decode("utf-8", errors="surrogateescape")
        try:
            rows = load_json(text, str(path))
        except InputError as e:
            raise ValueError(str(e)) from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a JSON file must hold one array of rows or one object per line")
        for i, row in enumerate(rows, start=1):
            try:
                json.dumps(row, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                row = ValueError(f"not valid UTF-8 (byte 0x{ord(e.object[e.start]) & 0xFF:02x})")
            yield i, row
    else:
        yield from _iter_jsonl(path)


def _starts_with_bracket(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return head.startswith(b"[")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """One JSON value per line, each line decoded and parsed on its own (a bad line fails only itself)."""
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield i, ValueError(f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            if not line.strip():
                continue
            try:
                yield i, load_json(line, "row")
            except InputError as e:
                yield i, ValueError(e.what)


def _record(row: Any, question: str, answer: str, solution: str | None, answer_format: str,
            meta_fields: Iterable[str], context: str | None) -> MathRecord:
    if isinstance(row, Exception):
        raise row
    if not isinstance(row, dict):
        raise ValueError(f"row is a {type(row).__name__}, expected a JSON object")
    for name in (question, answer):
        if name not in row:
            raise ValueError(f"missing field {name!r} (fields: {', '.join(sorted(row))})")
        if row[name] is None:
            raise ValueError(f"field {name!r} is null")
    q = row[question]
    if not isinstance(q, str) or not q.strip():
        raise ValueError(f"field {question!r} is not a non-empty string")
    if context and isinstance(row.get(context), str) and row[context].strip():
        q = row[context].strip() + "\n\n" + q
    ans = ANSWER_FORMATS[answer_format](row[answer])
    sol = row.get(solution) if solution else None
    if isinstance(sol, list):
        sol = sol[0] if sol and isinstance(sol[0], str) else None
    meta = {k: row[k] for k in meta_fields if k in row}
    return MathRecord(q.strip(), ans, sol if isinstance(sol, str) else None, meta)


def records_from_rows(rows: Iterable[tuple[int, Any]], source: str, *, question: str, answer: str,
                      solution: str | None = None, answer_format: str = "plain",
                      meta_fields: Iterable[str] = (), context: str | None = None,
                      on_error: str = "raise", limit: int | None = None) -> Records:
    """Build records from ``(line, row)`` pairs; errors name ``source:line``."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown answer_format {answer_format!r}; known: {', '.join(ANSWER_FORMATS)}")
    meta_fields = tuple(meta_fields)
    out = Records()
    for line, row in rows:
        if limit is not None and len(out) >= limit:
            break
        try:
            rec = _record(row, question, answer, solution, answer_format, meta_fields, context)
        except ValueError as e:
            msg = f"{source}:{line}: {e}"
            if on_error == "raise":
                raise ValueError(msg) from None
            out.skipped += 1
            out.errors.append(msg)
            continue
        rec.meta.setdefault("line", line)
        out.append(rec)
    if out.skipped:
        warnings.warn(f"{source}: skipped {out.skipped} malformed row(s); first: {out.errors[0]}",
                      RuntimeWarning, stacklevel=2)
    return out


def load_file(path: str | os.PathLike, *, question: str = "question", answer: str = "answer",
              solution: str | None = None, answer_format: str = "plain", meta_fields: Iterable[str] = (),
              on_error: str = "raise", limit: int | None = None, context: str | None = None) -> Records:
    """Load a local ``.jsonl`` / ``.json`` / ``.parquet`` file with a field mapping.

    ``question``/``answer``/``solution``: the field names. ``answer_format``: ``"plain"`` (the field is the
    answer), ``"gsm8k"`` (after ``####``) or ``"boxed"`` (last ``\\boxed{}``, e.g. ``answer="solution"``).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {p}")
    return records_from_rows(_iter_rows(p), str(p), question=question, answer=answer, solution=solution,
                             answer_format=answer_format, meta_fields=meta_fields, context=context,
                             on_error=on_error, limit=limit)


def load_hf_dataset(dataset: Any, *, split: str = "train", config: str | None = None, question: str = "question",
                    answer: str = "answer", solution: str | None = None, answer_format: str = "plain",
                    on_error: str = "raise", limit: int | None = None) -> Records:
    """Load a ``datasets`` dataset: a ``Dataset`` object, a folder written by ``save_to_disk``, or a name
    for ``datasets.load_dataset(name, config, split=split)`` (local or already cached; nothing is fetched
    unless ``datasets`` itself is allowed to). Rows are numbered from 1 in errors."""
    import datasets

    if isinstance(dataset, (str, os.PathLike)):
        name = str(dataset)
        p = Path(name)
        try:
            if p.is_dir() and ((p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists()):
                ds = datasets.load_from_disk(name)
            else:
                ds = datasets.load_dataset(name, config, split=split)
        except Exception as e:  # noqa: BLE001 - not found, no network, a broken folder: one line naming it
            first = (str(e).strip().splitlines() or [""])[0]
            raise ValueError(f"{name}: cannot load it as a `datasets` dataset ({type(e).__name__}: {first})") from None
        source = name
    else:
        ds, source = dataset, getattr(dataset, "info", None) and dataset.info.dataset_name or "dataset"
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ValueError(f"{source}: no split {split!r}; splits: {', '.join(ds)}")
        ds = ds[split]
    return records_from_rows(enumerate(ds, start=1), f"{source}[{split}]", question=question, answer=answer,
                             solution=solution, answer_format=answer_format, on_error=on_error, limit=limit)


# ---------------------------------------------------------------------------------------------- benchmarks
@dataclass(frozen=True)
class BenchmarkSpec:
    """Where a built-in set lives and how its fields map. ``kind``: the grading kind."""

    folder: str
    splits: tuple[str, ...]
    question: str
    answer: str
    answer_format: str
    kind: str
    solution: str | None = None
    meta_fields: tuple[str, ...] = ()
    context: str | None = None


BENCHMARKS: dict[str, BenchmarkSpec] = {
    "gsm8k": BenchmarkSpec("gsm8k", ("train", "test"), "question", "answer", "gsm8k", "gsm8k", solution="answer"),
    "math500": BenchmarkSpec("math500", ("test",), "problem", "answer", "plain", "math", solution="solution",
                             meta_fields=("subject", "level", "unique_id")),
    "aime24": BenchmarkSpec("aime24", ("test",), "problem", "answer", "plain", "math", solution="solution",
                            meta_fields=("id", "url")),
    "aime25": BenchmarkSpec("aime25", ("test",), "question", "answer", "plain", "math", meta_fields=("id",)),
    "amc23": BenchmarkSpec("amc23", ("test",), "problem", "answer", "plain", "math", meta_fields=("id", "url")),
    "olympiadbench": BenchmarkSpec("olympiadbench", ("test",), "question", "final_answer", "plain", "math",
                                   solution="solution", context="context",
                                   meta_fields=("id", "unit", "is_multiple_answer", "answer_type", "subfield")),
    "minerva_math": BenchmarkSpec("minerva_math", ("test",), "problem", "solution", "boxed", "math",
                                  solution="solution", meta_fields=("type", "idx")),
}


def load_benchmark(name: str, split: str = "test", *, limit: int | None = None, on_error: str = "raise",
                   root: str | os.PathLike | None = None) -> Records:
    """Load a built-in set by name (:data:`BENCHMARKS`); ``meta`` gets ``benchmark``, ``kind`` and ``line``."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    if split not in spec.splits:
        raise ValueError(f"benchmark {name!r} has no split {split!r}; splits: {', '.join(spec.splits)}")
    path = Path(root) if root is not None else data_dir()
    path = path / spec.folder / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{name}: {path} not found (set OBLR_DATA_DIR to the folder holding "
                                f"{spec.folder}/{split}.jsonl)")
    recs = load_file(path, question=spec.question, answer=spec.answer, solution=spec.solution,
                     answer_format=spec.answer_format, meta_fields=spec.meta_fields, on_error=on_error,
                     limit=limit, context=spec.context)
    for r in recs:
        r.meta.update(benchmark=name, kind=spec.kind)
    return recs
