"""The exact-norm engines by name (:data:`ENGINES`) and :func:`make_book`, which builds the one a model needs.

Registered (one :class:`oblr.registry.Registry`, like every choice oblr makes by name):

- ``one_pass`` -- :class:`~oblr.gradnorm.onepass.BookKeeper`: one backward, every hooked layer's input and output
  gradient kept (no activation checkpointing; also the ``loop`` reference method);
- ``two_pass`` -- :class:`~oblr.gradnorm.twopass.TwoPassBookKeeper`: with activation checkpointing, a norm pass
  keeping per-prompt Grams only, then an ordinary backward for the gradient;
- ``recompute`` -- :class:`~oblr.gradnorm.recompute.RecomputeBookKeeper`: with activation checkpointing, one
  backward whose recomputed layers' contributions are kept.

The checkpointed ones are the config's choices ``algorithm.checkpointed_engine`` (TRL: ``oblr_checkpointed_engine``),
listed torch-free in :data:`oblr.gradnorm.methods.CHECKPOINTED_ENGINES`; :func:`make_book` takes that name and
builds it when the model has activation checkpointing on, else the one-pass engine (:func:`engine_name`).
Every engine is a :class:`oblr.gradnorm.book.Book` and takes ``(model, method=..., grad_sink=...)``.
"""

from __future__ import annotations

from torch import nn

from oblr.registry import Registry

from .book import Book, checkpointing_modules
from .methods import CHECKPOINTED_ENGINES
from .onepass import BookKeeper
from .recompute import RecomputeBookKeeper
from .twopass import TwoPassBookKeeper

ENGINES = Registry("exact-norm engine")
ENGINES.register("one_pass", BookKeeper)
ENGINES.register("two_pass", TwoPassBookKeeper)
ENGINES.register("recompute", RecomputeBookKeeper)


def engine_name(model: nn.Module, method: str = "auto", engine: str = "two_pass") -> str:
    """The name in :data:`ENGINES` of the engine :func:`make_book` builds: ``engine`` (a name of
    :data:`CHECKPOINTED_ENGINES`, checked whatever the model) when ``model`` has activation checkpointing on and
    ``method`` is not the loop reference, else ``"one_pass"``."""
    CHECKPOINTED_ENGINES.get(engine)  # an unknown name raises, listing the registered ones
    return engine if checkpointing_modules(model) and method != "loop" else "one_pass"


def make_book(model: nn.Module, method: str = "auto", grad_sink=None, engine: str = "two_pass") -> Book:
    """The engine for ``model``, built through :data:`ENGINES`: with activation checkpointing on (and ``method`` not
    the loop reference) the checkpointed engine ``engine`` names (``"two_pass"``: nothing kept per layer, a second
    backward; ``"recompute"``: each layer's contributions kept, no second backward); else the one-pass
    :class:`~oblr.gradnorm.onepass.BookKeeper` (``engine`` ignored)."""
    return ENGINES.get(engine_name(model, method, engine))(model, method=method, grad_sink=grad_sink)
