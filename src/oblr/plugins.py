"""Loading user code that registers estimators, tasks, rollout engines, schedules, ... before a config is
validated.

Two ways, both used by the command line before it builds its parser (so ``--help`` lists plugin names):

- ``oblr train --plugin MODULE`` (repeatable; also ``oblr compare``): ``MODULE`` is imported by name
  (it must be importable, e.g. on ``PYTHONPATH`` or installed);
- the entry-point group ``oblr.plugins`` of installed packages: every entry point is loaded (a module, or
  a callable that is then called with no arguments), e.g. in a package's ``pyproject.toml``::

      [project.entry-points."oblr.plugins"]
      my_estimators = "my_package.oblr_plugin"
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "oblr.plugins"

_loaded: set[str] = set()


class PluginError(ValueError):
    """A plugin could not be loaded (one line: which plugin and why)."""


def load_plugins(modules: Iterable[str] = (), *, entry_point_group: str | None = ENTRY_POINT_GROUP) -> list[str]:
    """Import every module of ``modules`` and load every entry point of ``entry_point_group`` (each once
    per process); returns the names loaded now. A failure raises :class:`PluginError` naming the plugin."""
    done = []
    for name in modules:
        if name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of user code becomes one clear line
            raise PluginError(f"--plugin {name}: cannot import it ({type(e).__name__}: {e})") from None
        _loaded.add(name)
        done.append(name)
    if entry_point_group:
        for ep in entry_points(group=entry_point_group):
            key = f"{entry_point_group}:{ep.name}"
            if key in _loaded:
                continue
            try:
                obj = ep.load()
                if callable(obj):
                    obj()
            except Exception as e:  # noqa: BLE001
                raise PluginError(f"plugin entry point {ep.name!r} ({ep.value}) of group {entry_point_group!r} "
                                  f"failed: {type(e).__name__}: {e}") from None
            _loaded.add(key)
            done.append(key)
    return done


def plugins_in_argv(argv: list[str]) -> list[str]:
    """The values of ``--plugin X`` / ``--plugin=X`` in a command line (read before the parser exists)."""
    out = []
    for i, a in enumerate(argv):
        if a == "--plugin" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--plugin="):
            out.append(a.split("=", 1)[1])
    return out


def add_plugin_option(parser) -> None:
    """``--plugin MODULE`` (repeatable) on an argparse parser; :func:`oblr.cli.main` imports the modules
    before parsing (:func:`plugins_in_argv`), the option itself only documents it and keeps the list."""
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): user code that registers estimators, tasks, "
                             "rollout engines, ...")
