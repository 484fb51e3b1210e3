"""Two-pass book-keeping for models with activation checkpointing: exact norms, nothing kept per layer.

The one-pass :class:`~oblr.gradnorm.onepass.BookKeeper` keeps every hooked layer's input and output gradient
until the coefficients are known, which defeats activation checkpointing. :class:`TwoPassBookKeeper` has the
same interface and keeps only per-group Gram matrices:

1. ``record()`` installs a forward hook on every module owning trainable parameters that replaces its output
   ``y`` by an identity Tap saving the layer input ``x`` (:mod:`oblr.gradnorm.taps`, shared with the recompute
   engine: under non-reentrant checkpointing this costs nothing). Parameters keep ``requires_grad``.
2. ``backward(seq_obj, group_ids=...)`` -- the *norm pass* -- runs ``autograd.grad(seq_obj.sum(), [dummy],
   retain_graph=True)``: it walks every Tap and computes activation gradients only (no weight gradient is
   on the path to ``dummy``). Each Tap's backward turns ``(x, g)`` into the layer's contributions with its
   rule and reduces them into per-group Grams ``M_k[a, b] = <s_{i_a}, s_{i_b}>``
   (:func:`oblr.gradnorm.gram.group_gram`): at once, or, where that Gram is the one of the per-row gradients
   (a norm weight's ``[B, d]``, a materialised linear), those per-row gradients wait, up to
   ``slabs.SLAB_ELEMS`` elements in all, and the same-shaped ones of many layers are stacked and reduced by one
   batched product (:class:`oblr.gradnorm.gram.GramSum`: fewer operators dispatched; the Grams are summed in the
   layers' order, as one by one); nothing else of the layer is kept. A parameter with several owners
   or calls (a tied embedding) keeps its contributions until the pass ends, for the cross terms; one whose
   module runs several times (the output layer applied in chunks, :func:`oblr.logprobs.chunked_response_logprobs`)
   adds every contribution into one per-row sum ``[B, *shape]`` instead (memory independent of the length).
3. ``sq_norms()`` is the Grams' diagonal and ``group_sq_norms(coeffs, ...)`` is ``c_k^T M_k c_k``.
   ``accumulate_grad(coeffs)`` -- the *gradient pass* -- is an ordinary backward of
   ``sum_i coeffs[i] seq_obj[i]`` on the retained graph (recomputing again), restricted to the trainable
   parameters; Taps pass gradients through untouched. Under FSDP2 (``fully_shard``) the gradient pass is
   FSDP2's own backward: it reduce-scatters the gradient into the sharded ``.grad`` (a ``grad_sink`` given
   for the one-pass engine's sharded increments is not used).

Cost with checkpointing: forward 1, norm pass (recompute 1 + activation gradients ~1), gradient pass
(recompute 1 + backward 2): ~6 forward-equivalents against GRPO's 4.
"""

from __future__ import annotations

import torch
from torch import nn

from .book import Entry
from .contrib import Grouping
from .gram import GramSum, group_gram, mask_padding, row_gradients
from .taps import TapBook, fsdp_sharded, refuse_loop


class TwoPassBookKeeper(TapBook):
    """Exact per-row norms, group norms and the weighted gradient with activation checkpointing on.

    Same interface as :class:`~oblr.gradnorm.onepass.BookKeeper` (``record``, ``backward``, ``sq_norms``,
    ``group_sq_norms``, ``accumulate_grad``, ``accumulate_grad_with_group_norms``, ``clear``) with these
    differences: ``backward`` takes the ``group_ids`` that later group queries will use (default: each row
    alone, so only ``sq_norms``); ``accumulate_grad*`` run a backward pass, so they may be called once per
    ``backward`` and only while the forward's graph is alive; ``accumulate_grad`` returns None. Hooks stay
    installed after ``record()`` exits until the gradient pass or ``clear()``, because recomputation
    re-runs the forward. Methods "auto" | "ghost" | "materialize"; no loop fallback, and no ``grad_sink``
    except on an FSDP2-sharded model, where FSDP2's backward fills the sharded ``.grad`` (refused otherwise).
    """

    def __init__(self, model: nn.Module, method: str = "auto", allow_loop_fallback: bool = False,
                 grad_sink=None):
        refuse_loop("TwoPassBookKeeper", method)
        self._fsdp = fsdp_sharded(model)
        if grad_sink is not None and not self._fsdp:
            raise ValueError("TwoPassBookKeeper: grad_sink is not supported (its gradient pass is an ordinary "
                             "backward that fills .grad)")
        self._group_ids: torch.Tensor | None = None
        self._gram: torch.Tensor | None = None
        self._obj: torch.Tensor | None = None
        self._kept_entries: set[int] = set()
        self._sums: GramSum | None = None
        super().__init__(model, method=method)

    # ------------------------------------------------------------------ norm pass
    def backward(self, seq_obj: torch.Tensor, *, retain_graph: bool = False, group_ids=None) -> None:
        """The norm pass on ``seq_obj`` [B] (replacing an earlier one's Grams); the graph is always retained for
        the gradient pass. ``group_ids`` [B]: the grouping later ``group_sq_norms`` calls use (default each row
        alone). ``retain_graph`` is accepted for interface compatibility."""
        if seq_obj.dim() != 1:
            raise ValueError(f"seq_obj must be [B] (one objective per row), got shape {tuple(seq_obj.shape)}")
        if self._dummy is None:
            raise RuntimeError("nothing recorded: run the forward pass inside `with book.record():`")
        if not seq_obj.requires_grad:
            raise ValueError("seq_obj does not depend on any trainable parameter (was the forward run inside "
                             "record() and outside torch.no_grad()?)")
        self._forwarding = False
        self._batch = self._grp_done = None  # queries refuse until this pass completes (a failed pass: stale Grams)
        B = seq_obj.shape[0]
        dev = seq_obj.device
        gid = torch.arange(B, device=dev) if group_ids is None else group_ids.to(dev)
        if gid.shape != (B,):
            raise ValueError(f"group_ids must be [B] with B={B}, got shape {tuple(gid.shape)}")
        self._grp = Grouping.from_groups(torch.ones(B, device=dev), gid)
        self._group_ids = gid
        by_id = {id(e.param): e for e in self._entries}
        self._kept_entries = {id(e) for e in by_id.values() if len(e.owners) > 1}
        self._summed_entries = self._summed()
        self._kept_entries |= self._summed_entries
        for e in self._entries:
            e.contribs = []
        self._B = B
        grp = self._grp
        self._sums = GramSum(grp)
        try:
            torch.autograd.grad(seq_obj.sum(), [self._dummy], retain_graph=True, allow_unused=True)
            self._gram = self._sums.total()  # every layer's Gram, in the order the layers handed them over
            for e in self._entries:  # parameters with several owners or calls: their cross terms, now
                if e.contribs:
                    self._gram += group_gram(e.contribs, grp, self.method, mask=False)
                    e.contribs = []
            self._gram = mask_padding(self._gram, grp)  # once for the sum, not per layer
        finally:
            self._grp = self._sums = None
        self._grp_done = grp
        self._obj = seq_obj
        self._batch = B
        self._device = dev

    def _keep(self, e: Entry, c) -> None:
        """A parameter with several owners or calls keeps ``c`` for its cross terms; any other is reduced into the
        Grams at once, or, when its Gram is that of its per-row gradients, those wait to be reduced together with
        same-shaped others' (:class:`oblr.gradnorm.gram.GramSum`: at most ``slabs.SLAB_ELEMS`` elements); the
        Grams are summed in the order given."""
        if id(e) in self._kept_entries:
            e.contribs.append(c)
            return
        z = row_gradients(c, self._grp, self.method)
        if z is None:
            self._sums.add(group_gram([c], self._grp, self.method, mask=False))
        else:
            self._sums.add_rows(z)

    # ------------------------------------------------------------------ queries
    def sq_norms(self) -> torch.Tensor:
        """w_i = ||s_i||^2 over all trainable parameters. [B] float32."""
        B = self._check()
        grp = self._grp_done
        diag = torch.diagonal(self._gram, dim1=1, dim2=2)
        out = torch.zeros(B, dtype=torch.float32, device=self._device)
        valid = grp.scale != 0
        out[grp.index[valid]] = diag[valid]
        return out

    def group_sq_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """||sum_{i: group_ids[i] = k} coeffs[i] s_i||^2 for each distinct id k (sorted). [K] float32.
        ``group_ids`` must equal those given to ``backward``."""
        self._check(coeffs)
        if not torch.equal(group_ids.to(self._device), self._group_ids):
            raise ValueError("TwoPassBookKeeper: group_ids differ from those given to backward(); the norm pass "
                             "keeps only Grams within those groups")
        c = coeffs.detach().float().to(self._device)[self._grp_done.index] * (self._grp_done.scale != 0)
        return torch.einsum("km,kmn,kn->k", c, self._gram, c)

    # ------------------------------------------------------------------ gradient pass
    def accumulate_grad(self, coeffs: torch.Tensor) -> None:
        """``p.grad += sum_i coeffs[i] s_i`` by an ordinary backward of ``sum_i coeffs[i] seq_obj[i]``."""
        self._check(coeffs)
        if self._obj is None:
            raise RuntimeError("the gradient pass already ran for this backward(); record and backward again")
        obj, self._obj = self._obj, None
        try:
            if self._fsdp:  # FSDP2 computes with unsharded copies and reduce-scatters their grads itself
                torch.autograd.backward((coeffs.detach().to(obj) * obj).sum())
                self._dummy.grad = None
            else:
                torch.autograd.backward((coeffs.detach().to(obj) * obj).sum(), inputs=[e.param for e in self._entries])
        finally:
            self._remove_hooks()

    def accumulate_grad_with_group_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """The group norms (:meth:`group_sq_norms`), then ``p.grad += sum_i coeffs[i] s_i``."""
        sq = self.group_sq_norms(coeffs, group_ids)
        self.accumulate_grad(coeffs)
        return sq

    def clear(self) -> None:
        """Remove the hooks and free the graph reference, the Grams and any kept contribution."""
        self._obj = self._gram = self._group_ids = None
        self._grp_done = None
        super().clear()
