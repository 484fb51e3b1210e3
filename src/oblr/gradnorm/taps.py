"""What the two engines for activation checkpointing share: an identity Tap after every hooked layer.

Under activation checkpointing a layer's activations are dropped after the forward and recomputed before its
backward, so an engine cannot hold them from the forward. :class:`TapBook` (the base of
:class:`~oblr.gradnorm.twopass.TwoPassBookKeeper` and :class:`~oblr.gradnorm.recompute.RecomputeBookKeeper`)
installs a forward hook on every module owning trainable parameters that replaces its output ``y`` by
``_Tap(y, x, dummy)``: an identity whose node saves the layer input ``x`` (under non-reentrant checkpointing a
saved tensor is dropped after the forward and recomputed when unpacked, so this costs nothing; the
recomputation saves it again, so checkpoint's consistency check holds). ``dummy`` is one scalar leaf every Tap
takes: a backward to it walks every Tap and computes activation gradients only. Inside such a pass (the engine's
``_grp`` set) each Tap hands ``(x, g)`` to :meth:`TapBook._take`, which applies the layer's rule and passes each
contribution to the engine's :meth:`TapBook._keep`; a module called several times in one forward (the output
layer in chunks, :func:`oblr.logprobs.chunked_response_logprobs`) adds every contribution into one float32
per-row sum ``[B, *shape]`` instead (:func:`add_to_row_sum`). Parameters keep ``requires_grad``.
"""

from __future__ import annotations

import weakref
from abc import abstractmethod
from contextlib import contextmanager

import torch
from torch import nn

from .book import Book, Entry, Hooked, check_rows, layer_input
from .contrib import Dense, Grouping
from .precision import half_factors, tf32_products


class _Tap(torch.autograd.Function):
    """Identity on ``y``; in the engine's pass its backward hands ``(x, g)`` to the engine."""

    @staticmethod
    def forward(ctx, y, x, dummy, book, hooked):
        ctx.save_for_backward(x)
        ctx.book, ctx.hooked = book, hooked
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        book = ctx.book
        if book._grp is not None:  # the engine's pass (the two-pass gradient pass lets g through untouched)
            (x,) = ctx.saved_tensors
            book._take(ctx.hooked, x, g)
        return g, None, None, None, None


def fsdp_sharded(model: nn.Module) -> bool:
    """True when ``model`` is FSDP2-sharded (``fully_shard``): the two engines' gradient then goes to the sharded
    ``.grad`` by FSDP2's backward or a sink (torch's own type, read here so that gradnorm needs nothing of
    :mod:`oblr.distributed`, the layer above it; :func:`oblr.distributed.fsdp.is_sharded` is the same test)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def refuse_loop(engine: str, method: str) -> None:
    """The checkpointed engines have no loop method: it is the one-pass engine's reference."""
    if method == "loop":
        raise ValueError(f"{engine}: method 'loop' is the one-pass BookKeeper's reference; use BookKeeper")


class TapBook(Book):
    """Tap hooks for activation checkpointing (module docstring). ``record()`` installs them; they stay installed
    after it exits (recomputation re-runs the forward) until the subclass removes them or ``clear()``. The
    subclasses run the pass (``_grp`` set while it runs, ``_B`` its batch) and say what :meth:`_keep` does with
    a contribution."""

    checkpointed = True

    def __init__(self, model: nn.Module, method: str = "auto", grad_sink=None):
        self._handles: list = []
        self._dummy: torch.Tensor | None = None
        self._grp: Grouping | None = None
        self._summed_entries: set[int] = set()
        self._calls: dict[int, int] = {}
        self._forwarding = False
        self._inputs: dict[int, tuple] = {}  # id(x): (weak reference to x, x.detach()), while x lives: _detached
        super().__init__(model, method=method, allow_loop_fallback=False, grad_sink=grad_sink)

    # the hooked modules of the last plan: which of them ran more than once decides the summed entries
    def _plan(self):
        hooked = super()._plan()
        self._hooked = hooked
        return hooked

    # ------------------------------------------------------------------ recording
    @contextmanager
    def record(self):
        """Install the Tap hooks; the forward pass runs inside. Hooks stay until the subclass removes them or
        clear()."""
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

    def _tap_hook(self, h: Hooked):
        def hook(module, args, kwargs, output):
            if self._forwarding:
                if not torch.is_grad_enabled():
                    raise RuntimeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) ran with "
                                       "gradients disabled inside record() (torch.no_grad or reentrant "
                                       "checkpointing: enable it with use_reentrant=False)")
                self._calls[id(h)] = self._calls.get(id(h), 0) + 1
            elif not torch.is_grad_enabled():
                return None  # a no-grad forward between record() and the gradient pass: not part of the graph
            x = layer_input(h, module, args, kwargs, output)
            return _Tap.apply(output, self._detached(x), self._dummy, self, h)

        return hook

    def _detached(self, x: torch.Tensor) -> torch.Tensor:
        """``x.detach()``, the same one for every hooked module that takes the tensor ``x`` (q/k/v and gate/up
        share their input): one dispatched operator, not one per module. Each detached view is held only as long
        as ``x`` itself lives (a weak reference to ``x`` drops it), so it keeps no memory alive."""
        key = id(x)
        hit = self._inputs.get(key)
        if hit is not None and hit[0]() is x:
            return hit[1]
        xd = x.detach()
        inputs = self._inputs

        def drop(ref):
            if inputs.get(key, (None,))[0] is ref:
                del inputs[key]

        inputs[key] = (weakref.ref(x, drop), xd)
        return xd

    def _remove_hooks(self) -> None:
        for hd in self._handles:
            hd.remove()
        self._handles = []

    def _summed(self) -> set[int]:
        """ids of the entries of modules that ran more than once in the recorded forward (a chunked output layer):
        their contributions go into one per-row sum."""
        summed: set[int] = set()
        for h in self._hooked:
            if self._calls.get(id(h), 0) > 1:
                summed |= {id(e) for e in h.params.values()}
        return summed

    # ------------------------------------------------------------------ what a Tap hands over
    def _take(self, h: Hooked, x: torch.Tensor, g: torch.Tensor) -> None:
        """A Tap's ``(x, g)`` in the engine's pass: the layer's contributions, each summed or kept (:meth:`_keep`)."""
        B = self._B
        check_rows(h.path, x.shape[0], g.shape[0], B)
        g = g.detach() if g.requires_grad else g  # in a backward without create_graph it needs none
        for lname, c in h.rule.fn(h.module, x, g, h.names).items():
            e = h.params[lname]
            if id(e) in self._summed_entries:  # a module called several times (a chunked output layer)
                add_to_row_sum(e, c, B, g.device)
            else:
                self._keep(e, c)

    @abstractmethod
    def _keep(self, e: Entry, c) -> None:
        """What the engine does with contribution ``c`` of entry ``e`` (one not summed)."""

    def clear(self) -> None:
        """Remove the hooks and free the dummy leaf and every stored contribution."""
        self._remove_hooks()
        self._dummy = None
        self._grp = None
        self._calls = {}
        self._inputs = {}
        super().clear()


def add_to_row_sum(e: Entry, c, B: int, device) -> None:
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
