"""Exact per-sequence gradient norms in one batched backward pass (and the book-keeping weighted gradient).

- :func:`sequence_grad_sq_norms` -- w_i = ||s_i||^2 for a batch (method "auto" | "ghost" | "materialize" | "loop").
- :class:`BookKeeper` -- one forward + one backward per micro-batch, then ``sq_norms``, ``group_sq_norms``,
  ``accumulate_grad`` from the stored activations and output gradients; ``method="loop"`` gives the same
  interface with one backward per sequence (the slow exact reference, registry :data:`NORMS_METHODS`).
- :class:`TwoPassBookKeeper` -- the same with activation checkpointing on: a norm pass that keeps only
  per-group Grams, then an ordinary backward for the gradient;
- :class:`RecomputeBookKeeper` -- with activation checkpointing on, the one-pass book-keeping taken from the
  recomputed layers: no second backward, each layer's contributions kept;
- :data:`ENGINES` -- the three engines by name (``one_pass``, ``two_pass``, ``recompute``; all subclasses of
  :class:`Book`); :func:`make_book` picks the one a model needs through it.
- :func:`register_rule` -- add a rule for another module type.
- :mod:`oblr.gradnorm.reference` -- the slow exact loop; :mod:`oblr.gradnorm.proxies` -- forward-only proxies.
See docs/gradnorm.md. The names below are imported from their modules on first use (:mod:`oblr._lazy`), so
:data:`NORMS_METHODS` (the config's choices, :mod:`.methods`) loads without torch.
"""

from typing import TYPE_CHECKING

from oblr._lazy import lazy_exports

if TYPE_CHECKING:
    from .book import Book, UnsupportedModuleError
    from .contrib import Dense, Grouping, Outer
    from .engine import ENGINES, make_book
    from .layers import register_rule, register_structural_rule, registered_types
    from .methods import CHECKPOINTED_ENGINES, METHODS, NORMS_METHODS
    from .onepass import BookKeeper, sequence_grad_sq_norms
    from .proxies import length_weights, logit_energy_weights
    from .recompute import RecomputeBookKeeper
    from .reference import (
        loop_group_sq_norms,
        loop_per_sequence_grads,
        loop_sequence_sq_norms,
        loop_weighted_grad,
    )
    from .twopass import TwoPassBookKeeper

__all__ = [
    "CHECKPOINTED_ENGINES",
    "ENGINES",
    "METHODS",
    "NORMS_METHODS",
    "Book",
    "BookKeeper",
    "Dense",
    "Grouping",
    "Outer",
    "RecomputeBookKeeper",
    "TwoPassBookKeeper",
    "UnsupportedModuleError",
    "length_weights",
    "logit_energy_weights",
    "make_book",
    "loop_group_sq_norms",
    "loop_per_sequence_grads",
    "loop_sequence_sq_norms",
    "loop_weighted_grad",
    "register_rule",
    "register_structural_rule",
    "registered_types",
    "sequence_grad_sq_norms",
]

_EXPORTS = {  # module -> the names this package exports from it (the imports above)
    ".methods": ["CHECKPOINTED_ENGINES", "METHODS", "NORMS_METHODS"],
    ".contrib": ["Dense", "Grouping", "Outer"],
    ".book": ["Book", "UnsupportedModuleError"],
    ".onepass": ["BookKeeper", "sequence_grad_sq_norms"],
    ".engine": ["ENGINES", "make_book"],
    ".twopass": ["TwoPassBookKeeper"],
    ".recompute": ["RecomputeBookKeeper"],
    ".layers": ["register_rule", "register_structural_rule", "registered_types"],
    ".proxies": ["length_weights", "logit_energy_weights"],
    ".reference": ["loop_group_sq_norms", "loop_per_sequence_grads", "loop_sequence_sq_norms",
            "loop_weighted_grad"],
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
