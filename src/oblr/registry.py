"""One registry pattern for everything oblr chooses by name.

A :class:`Registry` maps names to objects (functions, classes, factories) of one kind: estimators,
learning-rate schedules, tasks, rollout engines, loss aggregations, gradient-norm methods, optimizers.
Registering a taken name raises; looking up an unknown name raises ``KeyError`` with one line that lists
the registered names; ``names()`` is what ``oblr train --help``, config validation and ``oblr tasks``
show, so they always agree.

    SCHEDULES = Registry("learning-rate schedule")

    @SCHEDULES.register("constant")
    class ConstantSchedule: ...

    SCHEDULES.get("constant")      # the class
    "cosine" in SCHEDULES          # False until registered

``modules`` names modules imported on the first lookup, for registries whose entries live in modules
that are costly to import eagerly (a module that does not exist, or whose optional dependency is
missing, is skipped).

:meth:`Registry.options` reads the keyword options an entry accepts from its signature (after the
``leading`` parameters oblr passes itself, e.g. ``model, tokenizer`` of an engine factory; ``target``
picks the callable out of an entry that is not one), so config validation checks option names, types and
ranges of built-in and plugin entries alike without calling them (:func:`oblr.checks.option_problems`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any


class UnknownNameError(KeyError, ValueError):
    """An unknown name was looked up (a ``KeyError`` and a ``ValueError``, with a readable message)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Registry:
    """Names -> objects of one ``kind`` (used in messages, e.g. "rollout engine")."""

    def __init__(self, kind: str, *, modules: tuple[str, ...] = (), leading: int = 0,
                 target: Callable[[Any], Callable] | None = None):
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._modules = tuple(modules)
        self._loaded = not modules
        self._leading, self._target = leading, target

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for mod in self._modules:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as e:  # an optional dependency missing, or the module itself
                if e.name != mod and not mod.startswith(f"{e.name}."):
                    raise

    def register(self, name: str, obj: Any = None) -> Callable:
        """Register ``obj`` under ``name`` (or, as a decorator, the decorated object; it is returned
        unchanged so one function can be registered under several names). Duplicates raise ``ValueError``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def deco(o):
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = o
            return o

        return deco if obj is None else deco(obj)

    def unregister(self, name: str) -> Any:
        """Remove ``name`` and return what it held (for tests and plugins that clean up after themselves)."""
        self._load()
        if name not in self._entries:
            raise UnknownNameError(self.unknown_message(name))
        return self._entries.pop(name)

    def get(self, name: str) -> Any:
        """The object registered as ``name``; an unknown name raises :class:`UnknownNameError` listing them."""
        self._load()
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown_message(name)) from None

    def options(self, name: str) -> dict[str, inspect.Parameter] | None:
        """The keyword options entry ``name`` accepts, from its signature (see :func:`option_parameters`)."""
        entry = self.get(name)
        return option_parameters(self._target(entry) if self._target else entry, leading=self._leading)

    def unknown_message(self, name: Any) -> str:
        return f"unknown {self.kind} {name!r}; registered: {', '.join(self.names()) or '(none)'}"

    def names(self) -> list[str]:
        """Registered names, sorted."""
        self._load()
        return sorted(self._entries)

    def items(self) -> list[tuple[str, Any]]:
        return [(n, self._entries[n]) for n in self.names()]

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"


def option_parameters(fn: Callable, *, leading: int = 0) -> dict[str, inspect.Parameter] | None:
    """``{name: Parameter}`` of the options ``fn`` (a function or a class) takes by keyword after its first
    ``leading`` parameters, annotations evaluated where they can be (``Annotated[...]`` kept); None when it
    takes ``**kwargs`` (any name is accepted)."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError, SyntaxError):  # an annotation names something not imported at module level
        sig = _each_evaluated(fn, inspect.signature(fn))
    params = list(sig.parameters.values())[leading:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name: p for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}


def _each_evaluated(fn: Callable, sig: inspect.Signature) -> inspect.Signature:
    """``sig`` with every string annotation evaluated on its own in ``fn``'s module: one that cannot be (e.g.
    ``torch.Tensor`` in a module that imports torch only inside its functions) stays text and is not
    checked, while the others (an option's ``Annotated[float, Range(...)]``) still are."""
    target = fn.__init__ if inspect.isclass(fn) else inspect.unwrap(fn)
    namespace = getattr(target, "__globals__", {})
    params = []
    for p in sig.parameters.values():
        annotation = p.annotation
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # as inspect.signature(eval_str=True) does
            except Exception:  # noqa: BLE001
                pass
        params.append(p.replace(annotation=annotation))
    return sig.replace(parameters=params)
