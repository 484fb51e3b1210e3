"""The one-pass engine: per-sequence gradient norms, group norms and the weighted gradient from ONE backward.

How it works (see docs/gradnorm.md):

1. ``record()`` plans which modules own trainable parameters and finds a rule for each (an unsupported
   owner raises here, before any forward, naming module path, type and parameter: :class:`oblr.gradnorm.book.Book`).
   It sets ``requires_grad=False`` on those parameters (restored in ``finally``) and installs forward hooks that
   keep each call's input ``x`` and output ``y``; an output that would not require grad (e.g. the
   input embedding's, whose only trainable input was switched off) is made to require grad.
2. ``backward(seq_obj)`` runs ``torch.autograd.grad(seq_obj.sum(), [y ...])``: one backward pass that
   computes only activation gradients -- no weight gradients, and no parameter's ``.grad`` is touched.
   Because rows are independent, row i of ``dy`` is the gradient of ``seq_obj[i]`` alone, and each
   layer rule turns ``(x, dy)`` into per-row contributions (see :mod:`oblr.gradnorm.contrib`).
3. ``sq_norms``, ``group_sq_norms`` and ``accumulate_grad`` assemble from the stored contributions
   (:mod:`oblr.gradnorm.stored`).

``backward(obj, retain_graph=True)`` keeps the records so that a second per-row objective of the same
forward pass can be recorded afterwards (its contributions replace the first ones): the update uses it
when the KL penalty is on, whose per-row coefficients are known before the advantages are.

Methods (registry :data:`NORMS_METHODS`, ``algorithm.norms_method``): ``auto``, ``ghost``,
``materialize`` (one batched backward; how each parameter's norm is assembled) and ``loop``, the slow
exact reference behind the same interface: every trainable parameter gets its per-row gradients from one
backward pass per row (``autograd.grad`` with ``retain_graph``), stored dense.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from ..logprobs import sequence_logprobs, token_logprobs
from .book import Hooked, check_rows, layer_input
from .contrib import Dense
from .precision import half_factors, tf32_products
from .stored import StoredBook


@dataclass
class _Record:
    hooked: Hooked
    x: torch.Tensor
    y: torch.Tensor
    versions: tuple[int, int]


class BookKeeper(StoredBook):
    """Exact per-sequence gradient norms and the book-keeping weighted gradient, one backward per micro-batch.

    Args:
        model: any ``nn.Module``; its parameters with ``requires_grad=True`` (at ``record()`` time) are the
            trainable ones, deduplicated by identity.
        method: ``"auto"`` (ghost norm or materialisation per parameter, whichever is cheaper),
            ``"ghost"`` or ``"materialize"`` (forced where the rule allows a choice), or ``"loop"`` (one
            backward pass per row for every parameter: the slow exact reference).
        allow_loop_fallback: for a trainable parameter with no rule, warn and compute its per-row
            gradients with one extra backward per row (``retain_graph``) instead of raising.
        grad_sink: ``sink(param, increment)`` called by ``accumulate_grad*`` with each parameter's
            increment (float32, the parameter's full shape) instead of ``param.grad += increment``, in the
            same parameter order on every call (e.g. a data-parallel reduce-scatter into a sharded
            ``.grad``: :class:`oblr.distributed.fsdp.ShardedGradSink`).

    Use::

        book = BookKeeper(model)
        with book.record():
            seq_lp = sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm)  # [B]
            book.backward(seq_lp)
        w = book.sq_norms()                          # [B]  ||s_i||^2, s_i = grad seq_lp[i]
        gk = book.group_sq_norms(coeffs, group_ids)  # [K]  ||sum_{i in k} c_i s_i||^2
        gsq = book.accumulate_grad(coeffs)           # p.grad += sum_i c_i s_i; returns ||sum_i c_i s_i||^2
        book.clear()
    """

    def __init__(self, model: nn.Module, method: str = "auto", allow_loop_fallback: bool = False,
                 grad_sink=None):
        self._records: list[_Record] = []
        self._in_backward = False
        self._kept: list[_Record] | None = None  # records kept by backward(retain_graph=True)
        super().__init__(model, method=method, allow_loop_fallback=allow_loop_fallback, grad_sink=grad_sink)

    # ------------------------------------------------------------------ recording
    @contextmanager
    def record(self):
        """Install hooks and switch weight gradients off; everything is restored in ``finally``."""
        hooked = self._begin_record()
        flipped = [e.param for e in self._entries if not e.fallback]
        handles = []
        try:
            for p in flipped:
                p.requires_grad_(False)
            for h in hooked:
                handles.append(h.module.register_forward_hook(self._hook(h), with_kwargs=True))
            self._recording = True
            with torch.enable_grad():
                yield self
        finally:
            for hd in handles:
                hd.remove()
            for p in flipped:
                p.requires_grad_(True)
            self._recording = False

    def _hook(self, h: Hooked):
        def hook(module, args, kwargs, output):
            if self._batch is not None or self._in_backward:
                return  # a call during/after backward (e.g. recomputation) is not part of the record
            if not torch.is_grad_enabled():
                raise RuntimeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) ran with gradients "
                                   "disabled inside record() (torch.no_grad or reentrant checkpointing)")
            x = layer_input(h, module, args, kwargs, output)
            if not output.requires_grad:
                output.requires_grad_(True)
            self._records.append(_Record(h, x.detach(), output, (x._version, output._version)))

        return hook

    def backward(self, seq_obj: torch.Tensor, *, retain_graph: bool = False, group_ids=None) -> None:
        """One backward pass of ``seq_obj.sum()`` ([B] per-row objectives, e.g. ``l_i``); stores contributions.

        Parameter ``.grad`` fields are not touched. Row i of every activation gradient is the gradient of
        ``seq_obj[i]`` alone, provided rows do not interact in the forward pass (true for causal LMs).
        With ``retain_graph`` the graph and the records are kept, and ``backward`` may be called again
        (inside or after ``record()``) with another per-row objective of the same forward pass; the
        new contributions replace the previous ones. ``group_ids`` (the grouping of later group queries) is
        ignored here, where every grouping can be assembled; :class:`~oblr.gradnorm.twopass.TwoPassBookKeeper`
        needs it.
        """
        if seq_obj.dim() != 1:
            raise ValueError(f"seq_obj must be [B] (one objective per row), got shape {tuple(seq_obj.shape)}")
        fb = [e for e in self._entries if e.fallback]
        if self._batch is not None:
            if self._kept is None:
                raise RuntimeError("backward() was already called for this record(); call clear() and record "
                                   "again, or pass retain_graph=True to the first call")
            records, self._kept = self._kept, None
            for e in self._entries:
                e.contribs = []
        else:
            records, self._records = self._records, []
            if not records and not fb:
                raise RuntimeError("nothing recorded: run the forward pass inside `with book.record():`")
        if not seq_obj.requires_grad:
            raise ValueError("seq_obj does not depend on any trainable parameter (was the forward run inside "
                             "record() and outside torch.no_grad()?)")
        B = seq_obj.shape[0]
        for r in records:
            check_rows(r.hooked.path, r.x.shape[0], r.y.shape[0], B)
            if (r.x._version, r.y._version) != r.versions:
                raise RuntimeError(f"module '{r.hooked.path}': its input or output was modified in place after "
                                   "the forward hook; exact per-row gradients cannot be recovered")
        if fb:  # loop: one backward per row for these parameters
            params = [e.param for e in fb]
            rows = [torch.autograd.grad(seq_obj[i], params, retain_graph=True, allow_unused=True)
                    for i in range(B)]
            for j, e in enumerate(fb):
                z = torch.stack([torch.zeros_like(e.param) if g[j] is None else g[j] for g in rows])
                e.contribs.append(Dense(z.float(), owned=True))
            del rows
        self._kept = list(records) if retain_graph else None
        self._in_backward = True
        try:
            grads = (torch.autograd.grad(seq_obj.sum(), [r.y for r in records], allow_unused=True,
                                         retain_graph=retain_graph) if records else [])
        finally:
            self._in_backward = False
        grads = list(grads)
        for j in reversed(range(len(records))):  # backward order: the large output-side gradients go first
            r = records[j]
            g, grads[j], records[j] = grads[j], None, None  # drop references as we go: frees x and g early
            if g is None:
                continue
            h = r.hooked
            for lname, c in h.rule.fn(h.module, r.x, g.detach(), h.names).items():
                with tf32_products(half_factors([c])):
                    self._add(h.params[lname], c)
            del r, g
        self._fold()
        self._batch = B
        self._device = seq_obj.device

    def clear(self) -> None:
        """Free every stored activation, gradient and contribution."""
        self._records = []
        self._kept = None
        super().clear()


def sequence_grad_sq_norms(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    method: str = "auto",
) -> torch.Tensor:
    """w_i = ||grad_theta sum_t response_mask[i,t] log p(input_ids[i,t] | input_ids[i,<t])||^2. [B] float32.

    ``method``: "auto" | "ghost" | "materialize" (one batched backward) or "loop" (one backward per row).
    """
    book = BookKeeper(model, method=method)
    with book.record():
        seq_lp = sequence_logprobs(token_logprobs(model, input_ids, attention_mask), response_mask)
        book.backward(seq_lp)
    try:
        return book.sq_norms()
    finally:
        book.clear()
