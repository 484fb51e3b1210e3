"""Typed training configuration: dataclasses with a help line per field, YAML files, dotted overrides.

Everything is validated before any model loads: an unknown key, a wrong type or a bad value raises
:class:`ConfigError` with one line that names every offending key and says how to fix it (no problem is
dropped: all overrides are checked and all their problems reported). A choice-valued key names the
registry (or table) its choices come from (``opt(..., choices="module:NAME")``), so ``oblr train --help``,
validation errors and ``oblr tasks`` list the same names, and a name registered by user code
(``oblr train --plugin MODULE``) is accepted without editing this module. Every numeric key declares its
:class:`Range` beside its field (``opt(..., range=Range(...))``); a value must also be finite. The
dict-valued keys ``task.options``, ``algorithm.baseline_options``, ``algorithm.schedule_options`` and ``rollout.engine_options`` are
checked against the signature of the registered task, estimator or engine (:func:`oblr.checks.check_options`):
option names, simple types, ``Literal`` choices and ``Annotated[..., Range(...)]`` ranges, so a plugin's
options are checked the same way. This module is the facade and the parsing (YAML, overrides, a dict to a
:class:`Config`); the schema is :mod:`oblr.config_schema`, :func:`validate` and the help
:mod:`oblr.config_validate`, the rules between keys :mod:`oblr.config_rules`, the value and option checks
:mod:`oblr.checks`. Every name is importable from here. YAML is read through :mod:`oblr.safe_load` (alias
bombs and deep nesting refused).

    cfg = load_config("configs/qwen3-4b-gsm8k.yaml", ["algorithm.baseline=rloo", "train.steps=50"])
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from oblr.checks import (  # noqa: F401  (the checks' names, re-exported: plugins import them from here)
    BIG,
    COUNT,
    COUNT0,
    FLOAT32_MAX,
    INT_MAX,
    MAX_THREADS,
    ConfigError,
    Range,
    _check_value,
    _coerce,
    _label,
    _num,
    _raise,
    _short,
    _simple,
    _type_name,
    check_flags,
    check_options,
    option_problems,
)
from oblr.config_rules import (  # noqa: F401  (re-exported: callers import them from here)
    SINK_PACKAGES,
    chunk_problems,
    plan_problems,
    sink_problems,
    uses_exact_norms,
)
from oblr.config_schema import (  # noqa: F401  (re-exported)
    SCHEDULE_RESERVED,
    AlgorithmConfig,
    Config,
    DistributedConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    opt,
)
from oblr.config_validate import _hints, choice_fields, config_help, range_fields, validate  # noqa: F401


# ----------------------------------------------------------------------------------------------- parsing
def _from_dict(cls, data: Any, prefix: str, problems: list[str]):
    """``cls(**data)`` with every unknown key and wrong type appended to ``problems`` (and left out)."""
    if not isinstance(data, dict):
        problems.append(f"config section '{prefix.rstrip('.') or '<root>'}' must be a mapping, got {_short(data)}")
        return cls()
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if k not in names:
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; known keys: {', '.join(names)}"
            problems.append(f"unknown config key '{key}'{hint}")
            continue
        tp = hints[k]
        if dataclasses.is_dataclass(tp):
            kwargs[k] = _from_dict(tp, v, key + ".", problems)
            continue
        try:
            kwargs[k] = _coerce(v, tp, key)
        except ConfigError as e:
            problems.append(str(e))
    return cls(**kwargs)


def _parse_scalar(text: str, key: str):
    """Parse the value of a ``key=value`` override with YAML rules (so 1e-3, true, [a, b] work); text that
    is not YAML stays text, YAML beyond the limits of :mod:`oblr.safe_load` is refused."""
    from oblr.safe_load import InputError, InputLimitError, load_yaml

    if text == "":
        return ""
    try:
        return load_yaml(text, f"override {key}")
    except InputLimitError as e:
        raise ConfigError(str(e)) from None
    except InputError:
        return text


def apply_overrides(data: dict, overrides: list[str], problems: list[str] | None = None) -> dict:
    """Apply dotted ``section.key=value`` overrides to a nested dict (returns the same dict). Every override
    is applied or reported: the problems of all of them are raised together as one :class:`ConfigError`, or,
    when ``problems`` is given, appended to it (the overrides that could be applied stay applied)."""
    collect = problems is not None
    problems = problems if collect else []
    for ov in overrides:
        if "=" not in ov:
            problems.append(f"override {ov!r} is not of the form section.key=value (e.g. optim.lr=1e-3)")
            continue
        key, text = ov.split("=", 1)
        parts = key.strip().split(".")
        node = data
        try:
            for p in parts[:-1]:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"override {ov!r}: '{p}' is not a section")
            node[parts[-1]] = _parse_scalar(text, key.strip())
        except ConfigError as e:
            problems.append(str(e))
    if not collect:
        _raise(problems)
    return data


def config_from_dict(data: dict, problems: list[str] | None = None) -> Config:
    """The validated :class:`Config` of a nested dict; all problems in one :class:`ConfigError`: those of
    ``problems`` (found before, e.g. malformed overrides), unknown keys and wrong types, and the value checks
    of :func:`validate`, which run on the keys that parsed (a key left out keeps its valid default), so one
    command line's problems of every kind are reported at once."""
    problems = list(problems or [])
    cfg = _from_dict(Config, {} if data is None else data, "", problems)
    try:
        validate(cfg)
    except ConfigError as e:
        problems.append(str(e))
    _raise(problems)
    return cfg


def read_config_file(path: str | Path) -> dict:
    """The mapping of sections in a YAML config file, read through :mod:`oblr.safe_load`."""
    from oblr.safe_load import InputError, load_yaml_file

    p = Path(path)
    try:
        data = load_yaml_file(p, what="config file")
    except FileNotFoundError as e:
        raise ConfigError(str(e)) from None
    except InputError as e:
        raise ConfigError(f"config file {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections, got {type(data).__name__}")
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a YAML file (optional), apply dotted overrides, type-check and validate."""
    data = read_config_file(path) if path is not None else {}
    problems: list[str] = []
    apply_overrides(data, list(overrides or []), problems)
    return config_from_dict(data, problems)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
