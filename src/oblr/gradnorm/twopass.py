"""Two-pass book-keeping for models with activation checkpointing: exact norms, nothing kept per layer.

The one-pass :class:`~oblr.gradnorm.engine.BookKeeper` keeps every hooked layer's input and output gradient
until the coefficients are known, which defeats activation checkpointing. :class:`TwoPassBookKeeper` has the
same interface and keeps only per-group Gram matrices:

1. ``record()`` installs a forward hook on every module owning trainable parameters that replaces its output
   ``y`` by ``_Tap(y, x, dummy)``: an identity whose node saves the layer input ``x`` (under non-reentrant
   checkpointing a saved tensor is dropped after the forward and recomputed when unpacked, so this costs
   nothing; the recomputation saves it again, so checkpoint's consistency check holds). ``dummy`` is one
   scalar leaf every Tap takes. Parameters keep ``requires_grad``.
2. ``backward(seq_obj, group_ids=...)`` -- the *norm pass* -- runs ``autograd.grad(seq_obj.sum(), [dummy],
   retain_graph=True)``: it walks every Tap and computes activation gradients only (no weight gradient is
   on the path to ``dummy``). Each Tap's backward turns ``(x, g)`` into the layer's contributions with its
   rule and reduces them at once into per-group Grams ``M_k[a, b] = <s_{i_a}, s_{i_b}>``
   (:func:`oblr.gradnorm.gram.group_gram`); nothing of the layer is kept. A parameter with several owners
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

from contextlib import contextmanager

import torch
from torch import nn

from .contrib import Dense, Grouping
from .engine import BookKeeper, _Hooked
from .gram import group_gram, mask_padding
from .precision import half_factors, tf32_products


class _Tap(torch.autograd.Function):
    """Identity on ``y``; in the norm pass its backward hands ``(x, g)`` to the engine."""

    @staticmethod
    def forward(ctx, y, x, dummy, book, hooked):
        ctx.save_for_backward(x)
        ctx.book, ctx.hooked = book, hooked
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        book = ctx.book
        if book._grp is not None:  # norm pass (the gradient pass lets g through untouched)
            (x,) = ctx.saved_tensors
            book._take(ctx.hooked, x, g)
        return g, None, None, None, None


class TwoPassBookKeeper(BookKeeper):
    """Exact per-row norms, group norms and the weighted gradient with activation checkpointing on.

    Same interface as :class:`~oblr.gradnorm.engine.BookKeeper` (``record``, ``backward``, ``sq_norms``,
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
        if method == "loop":
            raise ValueError("TwoPassBookKeeper: method 'loop' is the one-pass BookKeeper's reference; use BookKeeper")
        from oblr.distributed.fsdp import is_sharded

        self._fsdp = is_sharded(model)
        if grad_sink is not None and not self._fsdp:
            raise ValueError("TwoPassBookKeeper: grad_sink is not supported (its gradient pass is an ordinary "
                             "backward that fills .grad)")
        self._handles: list = []
        self._dummy: torch.Tensor | None = None
        self._grp: Grouping | None = None
        self._group_ids: torch.Tensor | None = None
        self._gram: torch.Tensor | None = None
        self._obj: torch.Tensor | None = None
        self._kept_entries: set[int] = set()
        self._summed_entries: set[int] = set()
        self._calls: dict[int, int] = {}
        self._forwarding = False
        super().__init__(model, method=method, allow_loop_fallback=False)

    _accepts_checkpointing = True

    # ------------------------------------------------------------------ recording
    @contextmanager
    def record(self):
        """Install the Tap hooks; the forward pass runs inside. Hooks stay until the gradient pass or clear()."""
        hooked = self._begin_record()
        self._dummy = torch.zeros((), requires_grad=True)
        self._calls = {}
        try:
            for h in hooked:
                self._handles.append(h.module.register_forward_hook(self._tap_hook(h), with_kwargs=True))
            self._recording = self._forwarding = True
            with torch.enable_grad():
                yield self
        except BaseException:
            self.clear()
            raise
        finally:
            self._recording = self._forwarding = False

    def _tap_hook(self, h: _Hooked):
        def hook(module, args, kwargs, output):
            if self._forwarding:
                if not torch.is_grad_enabled():
                    raise RuntimeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) ran with "
                                       "gradients disabled inside record() (torch.no_grad or reentrant "
                                       "checkpointing: enable it with use_reentrant=False)")
                self._calls[id(h)] = self._calls.get(id(h), 0) + 1
            elif not torch.is_grad_enabled():
                return None  # a no-grad forward between record() and the gradient pass: not part of the graph
            x = args[0] if args else next(iter(kwargs.values()), None)
            if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise TypeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) must take a tensor "
                                f"as first input and return a tensor")
            return _Tap.apply(output, x.detach(), self._dummy, self, h)

        return hook

    def _remove_hooks(self) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles = []

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
        self._gram = torch.zeros(self._grp.index.shape + (self._grp.index.shape[1],), device=dev)
        by_id = {id(e.param): e for e in self._entries}
        self._kept_entries = {id(e) for e in by_id.values() if len(e.owners) > 1}
        self._summed_entries = set()
        for h in self._hooked:
            if self._calls.get(id(h), 0) > 1:
                self._summed_entries |= {id(e) for e in h.params.values()}
        self._kept_entries |= self._summed_entries
        for e in self._entries:
            e.contribs = []
        self._B = B
        grp = self._grp
        try:
            torch.autograd.grad(seq_obj.sum(), [self._dummy], retain_graph=True, allow_unused=True)
            for e in self._entries:  # parameters with several owners or calls: their cross terms, now
                if e.contribs:
                    self._gram += group_gram(e.contribs, grp, self.method, mask=False)
                    e.contribs = []
            self._gram = mask_padding(self._gram, grp)  # once for the sum, not per layer
        finally:
            self._grp = None
        self._grp_done = grp
        self._obj = seq_obj
        self._batch = B
        self._device = dev

    def _take(self, h: _Hooked, x: torch.Tensor, g: torch.Tensor) -> None:
        B = self._B
        if x.shape[0] != B or g.shape[0] != B:
            raise ValueError(f"module '{h.path}': batch dim {x.shape[0]}/{g.shape[0]} != B={B}; "
                             "the engine needs batch-first activations with independent rows")
        for lname, c in h.rule.fn(h.module, x, g.detach(), h.names).items():
            e = h.params[lname]
            if id(e) in self._summed_entries:  # a module called several times (a chunked output layer)
                _add_to_row_sum(e, c, B, g.device)
            elif id(e) in self._kept_entries:
                e.contribs.append(c)
            else:
                self._gram += group_gram([c], self._grp, self.method, mask=False)

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
        self._remove_hooks()
        self._obj = self._gram = self._dummy = self._group_ids = None
        self._grp = None
        self._grp_done = None
        self._calls = {}
        super().clear()

    # _plan is shared with BookKeeper; keep the hooked modules for the kept-entry decision
    def _plan(self):
        hooked = super()._plan()
        self._hooked = hooked
        return hooked


def _add_to_row_sum(e, c, B: int, device) -> None:
    """Add contribution ``c`` into ``e``'s one running float32 per-row sum ``[B, *shape]`` (created on first use):
    a module called several times (a chunked output layer) keeps that sum, never a list of factors."""
    if not e.contribs:
        e.contribs.append(Dense(torch.zeros((B, *c.shape), dtype=torch.float32, device=device), owned=True))
    acc = e.contribs[0].z
    if isinstance(c, Dense):
        acc += c.z
    else:
        with tf32_products(half_factors([c])):
            c.add_to(acc)
