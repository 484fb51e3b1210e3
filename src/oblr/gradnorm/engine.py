"""Book-keeping engine: per-sequence gradient norms, group norms and the weighted gradient from ONE backward.

How it works (see docs/gradnorm.md):

1. ``record()`` plans which modules own trainable parameters and finds a rule for each (an unsupported
   owner raises here, before any forward, naming module path, type and parameter). It sets
   ``requires_grad=False`` on those parameters (restored in ``finally``) and installs forward hooks that
   keep each call's input ``x`` and output ``y``; an output that would not require grad (e.g. the
   input embedding's, whose only trainable input was switched off) is made to require grad.
2. ``backward(seq_obj)`` runs ``torch.autograd.grad(seq_obj.sum(), [y ...])``: one backward pass that
   computes only activation gradients -- no weight gradients, and no parameter's ``.grad`` is touched.
   Because rows are independent, row i of ``dy`` is the gradient of ``seq_obj[i]`` alone, and each
   layer rule turns ``(x, dy)`` into per-row contributions (see :mod:`oblr.gradnorm.contrib`).
3. ``sq_norms``, ``group_sq_norms`` and ``accumulate_grad`` assemble from the stored contributions:
   parameters are deduplicated by identity, so tied embeddings sum both owners' contributions and the
   cross term ``2 <G_emb, G_head>`` is included. Ghost norm or materialisation is chosen per parameter.

``backward(obj, retain_graph=True)`` keeps the records so that a second per-row objective of the same
forward pass can be recorded afterwards (its contributions replace the first ones): the update uses it
when the KL penalty is on, whose per-row coefficients are known before the advantages are.

Methods (registry :data:`NORMS_METHODS`, ``algorithm.norms_method``): ``auto``, ``ghost``,
``materialize`` (one batched backward; how each parameter's norm is assembled) and ``loop``, the slow
exact reference behind the same interface: every trainable parameter gets its per-row gradients from one
backward pass per row (``autograd.grad`` with ``retain_graph``), stored dense.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..logprobs import sequence_logprobs, token_logprobs
from .assembly import grouped_sums, keep_dense, materialized_sum, sq_norm
from .contrib import Dense, Grouping, Outer, regroup_for_products
from .layers import Rule, rule_for
from .methods import CHECKPOINTED_ENGINES, NORMS_METHODS
from .precision import half_factors, tf32_products
from .strips import GramCache
from .windows import token_windows


class UnsupportedModuleError(ValueError):
    """A trainable parameter is owned by a module that has no gradnorm rule."""


@dataclass
class _Entry:
    """One trainable parameter (deduplicated by identity) and its contributions [B or K, *shape]."""

    name: str
    param: nn.Parameter
    owners: list[tuple[str, nn.Module, str]] = field(default_factory=list)  # (module path, module, local name)
    contribs: list = field(default_factory=list)
    fallback: bool = False


@dataclass
class _Hooked:
    path: str
    module: nn.Module
    rule: Rule
    names: frozenset
    params: dict  # local name -> _Entry


@dataclass
class _Record:
    hooked: _Hooked
    x: torch.Tensor
    y: torch.Tensor
    versions: tuple[int, int]


class BookKeeper:
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
        NORMS_METHODS.get(method)  # an unknown name raises, listing the registered ones
        self.model = model
        self.method = method
        self.allow_loop_fallback = allow_loop_fallback
        self._sink = _add_grad if grad_sink is None else grad_sink
        self._recording = False
        self._records: list[_Record] = []
        self._entries: list[_Entry] = []
        self._batch: int | None = None
        self._warned: set[str] = set()
        self._in_backward = False
        self._kept: list[_Record] | None = None  # records kept by backward(retain_graph=True)
        self._plan()  # fail early on unsupported modules

    #: the two-pass engine (oblr.gradnorm.twopass) sets this; the loop method accepts it too (no hooks)
    _accepts_checkpointing = False

    # ------------------------------------------------------------------ planning
    def _plan(self) -> list[_Hooked]:
        ckpt = checkpointing_modules(self.model)
        if ckpt and self.method != "loop" and not self._accepts_checkpointing:
            raise ValueError(f"gradient checkpointing is enabled on '{ckpt[0] or '<root>'}'; the one-pass "
                             "BookKeeper keeps every layer's input anyway: use oblr.gradnorm.TwoPassBookKeeper "
                             "(or make_book), or disable it (model.gradient_checkpointing_disable())")
        entries: dict[int, _Entry] = {}
        for path, mod in self.model.named_modules():
            for lname, p in mod._parameters.items():
                if p is None or not p.requires_grad:
                    continue
                qual = f"{path}.{lname}" if path else lname
                entries.setdefault(id(p), _Entry(qual, p)).owners.append((path, mod, lname))
        if self.method == "loop":  # every parameter through one backward per row; no hooks
            for e in entries.values():
                e.fallback = True
            self._entries = list(entries.values())
            return []
        rules: dict[int, tuple[Rule | None, str | None]] = {}
        bad = []
        for e in entries.values():
            for path, mod, lname in e.owners:
                if id(mod) not in rules:
                    rules[id(mod)] = rule_for(mod)
                rule, reason = rules[id(mod)]
                if rule is not None and lname not in rule.params:
                    rule, reason = None, f"rule {rule.name} does not cover parameter {lname!r}"
                if rule is None:
                    e.fallback = True
                    bad.append(f"module '{path or '<root>'}' ({type(mod).__qualname__}), parameter '{lname}'"
                               f" [{e.name}]: {reason}")
        if bad:
            msg = "trainable parameters without an exact gradnorm rule:\n  " + "\n  ".join(bad)
            if not self.allow_loop_fallback:
                raise UnsupportedModuleError(
                    msg + "\nFreeze them, register a rule (oblr.gradnorm.register_rule), or pass "
                    "allow_loop_fallback=True (one extra backward per sequence for these parameters)."
                )
            if msg not in self._warned:
                self._warned.add(msg)
                warnings.warn(msg + "\nFalling back to one backward per sequence for these parameters.",
                              stacklevel=3)
        hooked: dict[int, _Hooked] = {}
        for e in entries.values():
            if e.fallback:
                continue
            for path, mod, lname in e.owners:
                h = hooked.setdefault(id(mod), _Hooked(path, mod, rules[id(mod)][0], frozenset(), {}))
                h.names = h.names | {lname}
                h.params[lname] = e
        self._entries = list(entries.values())
        return list(hooked.values())

    # ------------------------------------------------------------------ recording
    def _begin_record(self) -> list[_Hooked]:
        """Start of every ``record()``: refuse re-entry, drop the previous record, plan the hooks."""
        if self._recording:
            raise RuntimeError("BookKeeper.record() is not re-entrant")
        self.clear()
        return self._plan()

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

    def _hook(self, h: _Hooked):
        def hook(module, args, kwargs, output):
            if self._batch is not None or self._in_backward:
                return  # a call during/after backward (e.g. recomputation) is not part of the record
            if not torch.is_grad_enabled():
                raise RuntimeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) ran with gradients "
                                   "disabled inside record() (torch.no_grad or reentrant checkpointing)")
            x = args[0] if args else next(iter(kwargs.values()), None)
            if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
                raise TypeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) must take a tensor "
                                f"as first input and return a tensor")
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
            if r.x.shape[0] != B or r.y.shape[0] != B:
                raise ValueError(f"module '{r.hooked.path}': batch dim {r.x.shape[0]}/{r.y.shape[0]} != B={B}; "
                                 "the engine needs batch-first activations with independent rows")
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

    def _add(self, e: _Entry, c) -> None:
        """Store a contribution. Under ``method="auto"`` an Outer whose per-row gradients [B, R, C] take little
        memory next to its factors (``assembly.keep_dense``) is materialised now, once, so that every later
        query is a cheap reduction; dense contributions of one parameter are summed."""
        if self.method == "auto" and keep_dense(c):
            c = Dense(c.regroup(Grouping.rows(c.K)).materialize(), owned=True)
        elif isinstance(c, Outer) and c.right.device.type == "cpu":
            c.win = token_windows(c)  # skip each row's zero-gradient tokens (padding, a head's prompt)
        if isinstance(c, Dense):
            for i, d in enumerate(e.contribs):
                if isinstance(d, Dense):
                    if d.owned:
                        d.z.add_(c.z)
                    else:
                        e.contribs[i] = Dense(d.z + c.z, owned=True)
                    return
        e.contribs.append(c)

    def _fold(self) -> None:
        """Under ``method="auto"``: a parameter that has a dense contribution gets its Outer contributions
        added into it (e.g. the input-embedding part of a tied embedding whose head part was kept dense):
        no extra memory, and the queries then never need a mixed ghost/materialised assembly."""
        if self.method != "auto":
            return
        for e in self._entries:
            dense = [c for c in e.contribs if isinstance(c, Dense)]
            if not dense or len(e.contribs) == 1:
                continue
            d = dense[0] if dense[0].owned else Dense(dense[0].z.clone(), owned=True)
            for c in e.contribs:
                if c is not dense[0]:
                    if isinstance(c, Dense):
                        d.z.add_(c.z)
                    else:
                        with tf32_products(half_factors([c])):
                            c.add_to(d.z)
            e.contribs = [d]

    # ------------------------------------------------------------------ assembly
    def _check(self, coeffs: torch.Tensor | None = None) -> int:
        if self._batch is None:
            raise RuntimeError("call book.backward(seq_obj) inside record() first")
        if coeffs is not None and (coeffs.dim() != 1 or coeffs.shape[0] != self._batch):
            raise ValueError(f"coeffs must be [B] with B={self._batch}, got shape {tuple(coeffs.shape)}")
        return self._batch

    def _assemble(self, grp: Grouping) -> torch.Tensor:
        total = torch.zeros(grp.K, dtype=torch.float32, device=self._device)
        cache = GramCache()  # q/k/v (and gate/up) share their input: its Gram is computed once
        for e in self._entries:
            if e.contribs:
                with tf32_products(half_factors(e.contribs)):
                    total = total + sq_norm([c.regroup(grp) for c in e.contribs], self.method, cache)
        return total

    def sq_norms(self) -> torch.Tensor:
        """w_i = ||s_i||^2 over all trainable parameters. [B] float32."""
        return self._assemble(Grouping.rows(self._check()))

    def group_sq_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """||sum_{i: group_ids[i] = k} coeffs[i] s_i||^2 for each distinct id k (sorted). [K] float32."""
        self._check(coeffs)
        return self._assemble(Grouping.from_groups(coeffs.to(self._device), group_ids.to(self._device)))

    def accumulate_grad(self, coeffs: torch.Tensor) -> torch.Tensor:
        """``p.grad += sum_i coeffs[i] s_i`` for every trainable parameter (``.grad`` created if None).

        Returns ``||sum_i coeffs[i] s_i||^2`` (float32 scalar tensor), the squared norm of what was added.
        """
        self._check(coeffs)
        grp = Grouping.single(coeffs.to(self._device))
        sq = torch.zeros((), dtype=torch.float32, device=self._device)
        for e in self._entries:
            if not e.contribs:
                continue
            with tf32_products(half_factors(e.contribs)):
                inc = materialized_sum([regroup_for_products(c, grp) for c in e.contribs])[0]
            sq = sq + inc.pow(2).sum()
            self._give(e.param, inc)
        return sq

    def accumulate_grad_with_group_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``p.grad += sum_i coeffs[i] s_i`` and the group norms, from one pass over the records.

        Returns ``||sum_{i: group_ids[i] = k} coeffs[i] s_i||^2`` for each distinct id k (sorted), [K] float32:
        the same numbers as :meth:`group_sq_norms` and the same ``.grad`` as :meth:`accumulate_grad`, but the
        weighted gradient is assembled as the sum of the materialised per-group sums, so the group norms
        need no pass of their own (``assembly.grouped_sums``).
        """
        self._check(coeffs)
        grp = Grouping.from_groups(coeffs.to(self._device), group_ids.to(self._device))
        sq = torch.zeros(grp.K, dtype=torch.float32, device=self._device)
        for e in self._entries:
            if not e.contribs:
                continue
            with tf32_products(half_factors(e.contribs)):
                e_sq, inc = grouped_sums(e.contribs, grp)
            sq = sq + e_sq  # in the entries' order: a stack-sum's other order moved a 2-process FSDP step past 1e-4
            self._give(e.param, inc)
        return sq

    def _give(self, p: nn.Parameter, inc: torch.Tensor) -> None:
        """Hand a freshly assembled increment to the sink (the default one keeps it as ``.grad``, uncopied)."""
        if self._sink is _add_grad:
            _add_grad(p, inc, owned=True)
        else:
            self._sink(p, inc)

    def clear(self) -> None:
        """Free every stored activation, gradient and contribution."""
        self._records = []
        self._kept = None
        for e in self._entries:
            e.contribs = []
        self._batch = None

    def parameter_names(self) -> list[str]:
        """Names of the trainable parameters (deduplicated by identity) in assembly order."""
        return [e.name for e in self._entries]


def checkpointing_modules(model: nn.Module) -> list[str]:
    """Paths of the modules of ``model`` with Hugging Face gradient checkpointing switched on."""
    return [p for p, m in model.named_modules() if getattr(m, "gradient_checkpointing", False) is True]


def make_book(model: nn.Module, method: str = "auto", grad_sink=None, engine: str = "two_pass") -> BookKeeper:
    """The engine for ``model``: with activation checkpointing on (and ``method`` not the loop reference)
    :class:`~oblr.gradnorm.twopass.TwoPassBookKeeper` (``engine="two_pass"``: nothing kept per layer, a second
    backward) or :class:`~oblr.gradnorm.recompute.RecomputeBookKeeper` (``engine="recompute"``: each layer's
    contributions kept, no second backward); else the one-pass :class:`BookKeeper` (``engine`` ignored)."""
    CHECKPOINTED_ENGINES.get(engine)  # an unknown name raises, listing the registered ones
    if checkpointing_modules(model) and method != "loop":
        if engine == "recompute":
            from .recompute import RecomputeBookKeeper

            return RecomputeBookKeeper(model, method=method, grad_sink=grad_sink)
        from .twopass import TwoPassBookKeeper

        return TwoPassBookKeeper(model, method=method, grad_sink=grad_sink)
    return BookKeeper(model, method=method, grad_sink=grad_sink)


def _add_grad(p: nn.Parameter, inc: torch.Tensor, owned: bool = False) -> None:
    """``p.grad += inc`` (created if None), in the parameter's dtype. ``owned``: nothing else holds ``inc``,
    so a new ``.grad`` may be ``inc`` itself rather than a copy."""
    if p.grad is None:
        g = (inc if inc.dtype == p.dtype else inc.to(p.dtype)).reshape(p.shape)
        p.grad = g if owned and g.is_contiguous() else g.clone()
    else:
        p.grad.add_((inc if inc.dtype == p.grad.dtype else inc.to(p.grad.dtype)).reshape(p.shape))


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
