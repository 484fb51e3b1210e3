"""Checking values against types and ranges: the rules every configurable name follows.

:class:`Range` says where a number must lie (and that it is finite and fits a float32); :func:`option_problems`
and :func:`check_options` check a dict of options against the signature of a registered entry (an
estimator, schedule, engine, task, parallel strategy, plugin): option names, simple types, ``Literal``
choices and ``Annotated[..., Range(...)]`` ranges; :func:`check_flags` checks numeric command-line flags; :func:`check_writable` finds a read-only or misplaced
output folder or cache before any model loads.
Problems are :class:`ConfigError` lines that name the key. The config schema that uses them is
:mod:`oblr.config`; this module imports nothing of oblr's but the registry's types, and no torch.
"""

from __future__ import annotations

import difflib
import inspect
import math
import os
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


FLOAT32_MAX = 3.4028234663852886e38
INT_MAX = 2**31 - 1  # the largest count any key accepts (a C int: what torch and its kernels take)
BIG = 1e6  # the cap of float keys without a natural bound (far beyond any sensible value, still safe in float32)
MAX_THREADS = 1024  # torch.set_num_threads with ~1e5 threads exhausts the address space and segfaults


@dataclass(frozen=True)
class Range:
    """Where a numeric value must lie: ``ge``/``gt`` below, ``le``/``lt`` above (None: no bound). Every
    value must also be finite (NaN and inf never pass; floats must fit a float32). ``Range(gt=0, le=1)``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __str__(self) -> str:
        lo = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        hi = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>=' if self.ge is not None else '>'} {lo[1:]}"
        return f"{'<=' if self.le is not None else '<'} {hi[:-1]}" if hi else "finite"

    def problem(self, value) -> str | None:
        """None when ``value`` lies in the range, else what is wrong (``"must be in (0, 1], got inf"``)."""
        try:
            v = float(value)
        except OverflowError:  # an int beyond any float
            v = math.inf
        ok = (math.isfinite(v) and abs(v) <= FLOAT32_MAX
              and (self.ge is None or v >= self.ge) and (self.gt is None or v > self.gt)
              and (self.le is None or v <= self.le) and (self.lt is None or v < self.lt))
        return None if ok else f"must be {self}, got {_short(value)}"


def _type_name(tp) -> str:
    """How a message names a type: ``int``, ``'a' | 'b' | None``, ``float | None``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " | ".join(map(repr, typing.get_args(tp)))
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _label(key: str) -> str:
    """How a message names ``key``: ``config key 'a.b'``, or a command-line flag (``--engine-options.x``) as is."""
    return key if key.startswith("-") else f"config key '{key}'"


def _short(value: Any, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[: n - 3] + "..."


def _coerce(value: Any, tp, key: str):
    """Check (and gently coerce: int -> float) ``value`` against the annotation ``tp`` (bool, int, float,
    str, dict, list, None, unions of these and ``Literal``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError:
                pass
        raise ConfigError(f"{_label(key)}: expected {_type_name(tp)}, got {_short(value)}")
    if origin is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise ConfigError(f"{_label(key)}: must be one of {', '.join(map(str, typing.get_args(tp)))}, "
                          f"got {_short(value)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads "1e-6" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp in (dict, list):
        if isinstance(value, tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    raise ConfigError(f"{_label(key)}: expected {_type_name(tp)}, got {type(value).__name__} {_short(value)}")


def _raise(problems: list[str]) -> None:
    if problems:
        raise ConfigError("; ".join(problems))


def _check_value(value: Any, annotation: Any, key: str) -> Any:
    """``value`` checked (and coerced) against a parameter annotation: its type when it is a simple one (see
    :func:`_coerce`; others, ``Any`` included, are not checked), the :class:`Range` objects of an
    ``Annotated[...]``, and any number must be finite. Raises ConfigError naming ``key``."""
    base, ranges = annotation, []
    if typing.get_origin(annotation) is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        ranges = [r for r in extras if isinstance(r, Range)]
    if _simple(base):
        value = _coerce(value, base, key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for r in ranges or [Range()]:
            problem = r.problem(value)
            if problem:
                raise ConfigError(f"{_label(key)}: {problem}")
    return value


def _simple(tp) -> bool:
    if tp in (bool, int, float, str, dict, list, type(None)) or typing.get_origin(tp) is typing.Literal:
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return all(_simple(a) for a in typing.get_args(tp))
    return False


def option_problems(registry, name: str, options: dict, key: str,
                    reserved: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """``(checked options, problems)``: ``options`` for the entry ``name`` of ``registry`` against its
    signature (:meth:`oblr.registry.Registry.options`) -- every name must be a parameter (unless the entry
    takes ``**kwargs``), every value must fit the parameter's annotation (:func:`_check_value`), every
    required parameter must be given; ``reserved`` names options oblr passes itself (with why)."""
    reserved = reserved or {}
    params = registry.options(name)
    out, problems, unknown = dict(options), [], []
    for opt_name, value in options.items():
        k = f"{key}.{opt_name}"
        if opt_name in reserved:
            problems.append(f"{_label(k)}: not an option to set here ({reserved[opt_name]})")
        elif params is not None and opt_name not in params:
            unknown.append(opt_name)
        else:  # a parameter of the entry, or any name for an entry that takes **kwargs (numbers must be finite)
            try:
                out[opt_name] = _check_value(value, params[opt_name].annotation if params else Any, k)
            except ConfigError as e:
                problems.append(str(e))
    if unknown:
        accepted = [p for p in params if p not in reserved]
        close = [c for u in unknown for c in difflib.get_close_matches(str(u), accepted, n=1)]
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        problems.insert(0, f"unknown option{'s' * (len(unknown) > 1)} {', '.join(f'{key}.{u}' for u in unknown)}"
                           f"{hint}: {registry.kind} {name!r} accepts {', '.join(accepted) or 'no options'}")
    missing = [p for p, par in (params or {}).items()
               if par.default is inspect.Parameter.empty and p not in options and p not in reserved]
    if missing:
        problems.append(f"{_label(key)}: {registry.kind} {name!r} needs the option(s) {', '.join(missing)}")
    return out, problems


def check_options(registry, name: str, options: dict, key: str, reserved: dict[str, str] | None = None) -> dict:
    """:func:`option_problems` that raises one :class:`ConfigError` with every problem; returns the checked
    options (numbers coerced as their annotations say). Used by the config, ``oblr eval --engine-options``,
    :func:`oblr.rollout.make_engine` and :func:`oblr.tasks.get_task`."""
    out, problems = option_problems(registry, name, options, key, reserved)
    _raise(problems)
    return out


def check_flags(values: dict[str, tuple[Any, Range]]) -> None:
    """Numeric command-line flags against their ranges: ``{"--jobs": (value, Range(...))}`` (None = not
    given, not checked); one ConfigError naming every flag out of range."""
    _raise([f"{flag} {rng.problem(v)}" for flag, (v, rng) in values.items() if v is not None and rng.problem(v)])


def _num(x: float) -> str:
    """A bound as people write it: 2, 0.001, 1e6, 2^31-1."""
    for e in (31, 32):
        if x == 2**e - 1:
            return f"2^{e}-1"
    if float(x).is_integer() and abs(x) < 1e5:
        return str(int(x))
    mantissa, _, exp = f"{x:g}".partition("e")
    return f"{mantissa}e{int(exp)}" if exp else mantissa


COUNT = Range(ge=1, le=INT_MAX)  # a positive count
COUNT0 = Range(ge=0, le=INT_MAX)  # a count where 0 means "none" or "off"


def check_writable(folder: Path, what: str, *, hint: str = "") -> None:
    """Raise :class:`ConfigError` (one line) unless ``folder`` is, or can be made, a writable folder: a file
    where a folder (or one of its parents) should be, or a read-only or full file system, is named. Creates
    the folder; writes and removes one probe file."""
    folder = Path(folder)
    for parent in (folder, *folder.parents):
        if parent.exists() and not parent.is_dir():
            raise ConfigError(f"{what} {folder}: {parent} is a file, not a folder{hint and '; ' + hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".oblr-write-test-{os.getpid()}"
        with open(probe, "w") as f:
            f.write("x")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"{what} {folder} is not writable: {e.strerror or e}{hint and '; ' + hint}") from None
