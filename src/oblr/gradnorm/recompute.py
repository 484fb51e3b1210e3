"""One-pass book-keeping under activation checkpointing: the contributions are taken from the recomputed layers.

:class:`RecomputeBookKeeper` sits between the two other engines. Like the two-pass
:class:`~oblr.gradnorm.twopass.TwoPassBookKeeper` it installs an identity Tap (:mod:`oblr.gradnorm.taps`) after
every module owning trainable parameters, so nothing of a layer is held by the engine between the forward and
the backward: under non-reentrant checkpointing the Tap's saved input is dropped after the forward and
recomputed, with the layer, right before the layer's backward. Like the one-pass
:class:`~oblr.gradnorm.onepass.BookKeeper` it then *keeps* each layer's contributions -- the per-row gradients
``[B, R, C]`` where those take no more memory than their factors (``assembly.keep_dense``, the usual case once a
row's tokens outnumber the layer's width), else the factors -- and serves every query and the weighted gradient
from them, so **no gradient pass runs**:

1. ``record()``: the forward, hooks as in the two-pass engine;
2. ``backward(seq_obj)``: one activation-gradient backward to the Taps' scalar (no weight gradient, each layer
   recomputed once); each Tap turns ``(x, g)`` into contributions and stores them as the one-pass engine does.
   A module called several times (the output layer in chunks) adds into one per-row sum instead;
3. ``sq_norms``, ``group_sq_norms``, ``accumulate_grad`` and ``accumulate_grad_with_group_norms`` are the
   one-pass engine's, on the stored contributions (:mod:`oblr.gradnorm.stored`; ``grad_sink`` honoured, so DDP
   and FSDP2 ranks work as they do with it).

Cost with checkpointing, in forward-equivalents: forward 1 + recomputation 1 + activation gradients 1 + the
per-row gradient products (about one weight-gradient product, 1) = ~4, a checkpointed GRPO step's count, plus
the cheap assembly. Memory: a checkpointed GRPO step's, plus the kept contributions -- up to ``B x`` the
trainable parameters in float32 once the responses are long. That is small for LoRA and small models and too
large for full fine-tuning at billions of parameters, where the two-pass engine (nothing kept) is the one
that fits; the planner (``algorithm.memory_plan``, :mod:`oblr.train.plan`) prices both.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from .book import Entry
from .contrib import Grouping
from .precision import half_factors, tf32_products
from .stored import StoredBook
from .taps import TapBook, fsdp_sharded, refuse_loop


class RecomputeBookKeeper(TapBook, StoredBook):
    """Exact per-row norms, group norms and the weighted gradient with activation checkpointing on, from one
    activation-gradient backward whose recomputed layers' contributions are kept (module docstring).

    Interface of :class:`~oblr.gradnorm.onepass.BookKeeper`: ``backward(seq_obj, retain_graph=...)`` may be
    called again with another objective of the same forward when ``retain_graph`` was given (the new
    contributions replace the old ones); every grouping can be queried; ``accumulate_grad`` returns the
    squared norm of what it added and may be called more than once. Hooks are removed when the last
    ``backward`` ends (no ``retain_graph``) or by ``clear()``. Methods "auto" | "ghost" | "materialize"
    (``allow_loop_fallback`` is accepted and ignored: no loop fallback); on an FSDP2-sharded model a ``grad_sink``
    is required.
    """

    def __init__(self, model: nn.Module, method: str = "auto", allow_loop_fallback: bool = False,
                 grad_sink=None):
        refuse_loop("RecomputeBookKeeper", method)
        self._fsdp = fsdp_sharded(model)
        super().__init__(model, method=method, grad_sink=grad_sink)
        if self._fsdp and grad_sink is None:
            raise ValueError("RecomputeBookKeeper: an FSDP2-sharded model needs a grad_sink for the sharded .grad "
                             "(oblr.distributed.fsdp.ShardedGradSink, as oblr.update is given one); without it the "
                             "whole gradients would be written into the DTensor parameters")
        self._retained = False

    @contextmanager
    def record(self):
        self._retained = False
        with super().record() as book:
            yield book

    # ------------------------------------------------------------------ the one backward
    def backward(self, seq_obj: torch.Tensor, *, retain_graph: bool = False, group_ids=None) -> None:
        """The activation-gradient backward of ``seq_obj.sum()`` ([B] per-row objectives); stores every
        layer's contributions. ``retain_graph``: keep the graph for another ``backward`` of the same forward
        (its contributions then replace these). ``group_ids`` is ignored (every grouping can be assembled)."""
        if seq_obj.dim() != 1:
            raise ValueError(f"seq_obj must be [B] (one objective per row), got shape {tuple(seq_obj.shape)}")
        if self._dummy is None:
            raise RuntimeError("nothing recorded: run the forward pass inside `with book.record():`")
        if self._batch is not None and not self._retained:
            raise RuntimeError("backward() was already called for this record(); call clear() and record "
                               "again, or pass retain_graph=True to the first call")
        if not seq_obj.requires_grad:
            raise ValueError("seq_obj does not depend on any trainable parameter (was the forward run inside "
                             "record() and outside torch.no_grad()?)")
        self._forwarding = False
        self._batch = None  # queries refuse until this pass completes
        B = seq_obj.shape[0]
        self._B = B
        self._summed_entries = self._summed()
        for e in self._entries:
            e.contribs = []
        self._grp = Grouping.rows(B)  # marks "inside the pass" for the Taps (the two-pass engine's flag)
        try:
            torch.autograd.grad(seq_obj.sum(), [self._dummy], retain_graph=retain_graph, allow_unused=True)
        except BaseException:
            for e in self._entries:
                e.contribs = []
            raise
        finally:
            self._grp = None
            if not retain_graph:
                self._remove_hooks()
        self._fold()
        self._retained = retain_graph
        self._batch = B
        self._device = seq_obj.device

    def _keep(self, e: Entry, c) -> None:
        """Stored as the one-pass engine stores it (:meth:`oblr.gradnorm.stored.StoredBook._add`)."""
        with tf32_products(half_factors([c])):
            self._add(e, c)

    # the queries are the one-pass engine's (StoredBook's), on the stored contributions

    def clear(self) -> None:
        """Remove the hooks and free every kept contribution."""
        super().clear()
        self._retained = False
