"""Config checks that need no model, and the tables they read: :func:`choice_fields` (every choice-valued
key and its registry's names), :func:`range_fields` (every numeric key's Range), :func:`validate` (choices,
ranges, the options of dict-valued keys, the rules between keys of :mod:`oblr.config_rules`; one
:class:`oblr.checks.ConfigError` naming every offending key) and :func:`config_help` (``oblr train --help``)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import typing

from oblr.checks import Range, _raise, _short, _type_name, option_problems
from oblr.config_rules import plan_problems, sink_problems
from oblr.config_schema import Config


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


_DEVICE = re.compile(r"auto|(cpu|cuda|mps)(:\d+)?")


def _choices(f: dataclasses.Field) -> tuple[str, list[str]] | None:
    """``(kind, names)`` of a choice-valued field (None for other fields); imports the registry's module."""
    table = _table(f)
    if table is None:
        return None
    if hasattr(table, "names"):  # a Registry
        return table.kind, table.names()
    return f.name, list(table)


def _table(f: dataclasses.Field):
    ref = f.metadata.get("choices")
    if ref is None:
        return None
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _sections():
    """``(section name, section dataclass)`` of :class:`Config`."""
    return [(sec.name, _hints(Config)[sec.name]) for sec in dataclasses.fields(Config)]


def choice_fields() -> list[tuple[str, str, list[str]]]:
    """``[(dotted key, kind, names)]`` for every choice-valued key of the config."""
    out = []
    for sec, cls in _sections():
        for f in dataclasses.fields(cls):
            c = _choices(f)
            if c is not None:
                out.append((f"{sec}.{f.name}", *c))
    return out


def range_fields() -> list[tuple[str, Range]]:
    """``[(dotted key, Range)]`` for every numeric key (all of them have one)."""
    return [(f"{sec}.{f.name}", f.metadata["range"]) for sec, cls in _sections() for f in dataclasses.fields(cls)
            if "range" in f.metadata]


def validate(cfg: Config) -> None:
    """Value checks that need no model or data: choices, ranges, the options of dict-valued keys, and the
    rules between keys. Raises one ConfigError naming every offending key."""
    problems: list[str] = []

    def bad(key: str, msg: str) -> None:
        problems.append(f"config key '{key}': {msg}")

    valid_choice = {}
    for key, kind, names in choice_fields():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        valid_choice[key] = value in names
        if not valid_choice[key]:
            bad(key, f"unknown {kind} {_short(value)}; registered: {', '.join(names)}")
    for key, rng in range_fields():
        sec, name = key.split(".")
        value = getattr(getattr(cfg, sec), name)
        problem = None if value is None else rng.problem(value)  # None: an optional key left unset
        if problem:
            bad(key, problem)
    for sec, cls in _sections():  # the options of dict-valued keys, against the chosen entry's signature
        section = getattr(cfg, sec)
        for f in dataclasses.fields(cls):
            of = f.metadata.get("options_of")
            if of is None or not valid_choice.get(f"{sec}.{of}"):
                continue
            registry = _table(next(g for g in dataclasses.fields(cls) if g.name == of))
            checked, found = option_problems(registry, getattr(section, of), getattr(section, f.name),
                                             f"{sec}.{f.name}", f.metadata.get("reserved"))
            setattr(section, f.name, checked)
            problems.extend(found)
    r, a, o = cfg.rollout, cfg.algorithm, cfg.optim
    if not _DEVICE.fullmatch(cfg.model.device):
        bad("model.device", f"{cfg.model.device!r} is not auto, cpu, cuda, cuda:N or mps")
    if valid_choice["rollout.engine"]:
        from oblr.rollout import check_engine

        try:
            check_engine(r.engine)  # e.g. vllm without its package: refused here, before a model loads
        except ValueError as e:
            bad("rollout.engine", str(e))
    for key, why in sink_problems(cfg.train):  # e.g. train.tensorboard without its package: refused before a run
        bad(key, why)  # folder is made or a model loads
    if valid_choice["algorithm.lr_schedule"]:
        from oblr.schedules import SCHEDULES

        if (getattr(SCHEDULES.get(a.lr_schedule), "needs_snr", False) or a.track_snr) and r.prompts_per_step < 2:
            bad("rollout.prompts_per_step", "S and V (SNR schedule, algorithm.track_snr) estimate the noise across "
                "prompts; the step needs at least 2 prompts")
        fits = getattr(SCHEDULES.get(a.lr_schedule), "optimizers", None)
        if fits is not None and o.optimizer not in fits:
            bad("algorithm.lr_schedule", f"{a.lr_schedule!r} is derived for optim.optimizer {' or '.join(fits)}, "
                f"got {o.optimizer!r}" + getattr(SCHEDULES.get(a.lr_schedule), "instead", ""))
    if o.eta_min > o.lr and not Range().problem(o.eta_min):
        bad("optim.eta_min", f"must be in [0, optim.lr = {o.lr:g}], got {o.eta_min:g}")
    if not (len(o.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1
                                      for b in o.betas)):
        bad("optim.betas", f"must be two numbers in [0, 1), got {_short(o.betas)}")
    if valid_choice["algorithm.memory_plan"]:
        for key, msg in plan_problems(cfg):
            bad(key, msg)
    if cfg.distributed.backend not in ("auto", "gloo", "nccl"):
        bad("distributed.backend", f"{cfg.distributed.backend!r} is not auto, gloo or nccl")
    _raise(problems)


def config_help() -> str:
    """One line per key: ``section.key (type, default): help [choices | range]``, for ``oblr train --help``."""
    lines = []
    for sec, cls in _sections():
        lines.append(f"{sec}:")
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            choices = _choices(f)
            extra = f" [{' | '.join(choices[1])}]" if choices else ""
            if "range" in f.metadata:
                extra = f" [{f.metadata['range']}]"
            lines.append(f"  {sec}.{f.name} ({_type_name(hints[f.name])}, default {default!r}): "
                         f"{f.metadata.get('help', '')}{extra}")
    return "\n".join(lines)
