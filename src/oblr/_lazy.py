"""Lazy package attributes: a package's public names imported from their submodules on first access.

``oblr.train``, ``oblr.distributed`` and ``oblr.gradnorm`` export names from modules that import torch;
with :func:`lazy_exports` importing the package (or a torch-free submodule of it, such as
``oblr.train.optimizers`` for the config's choices) does not import them, so ``oblr --help`` and config
validation stay fast. ``from oblr.train import train`` works as before (PEP 562 module ``__getattr__``)::

    __getattr__, __dir__ = lazy_exports(__name__, {"oblr.train.trainer": ["Trainer", "train"]})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable


def lazy_exports(package: str, exports: dict[str, Iterable[str]]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` exporting, for each module of ``exports``, its listed
    names (a module name may be relative to ``package``: ``".engine"``)."""
    where = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where})

    return __getattr__, __dir__
