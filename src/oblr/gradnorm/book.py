"""What every exact-norm engine shares: the interface, the trainable parameters and their layer rules, the helpers.

An engine (a *book*) computes, for a micro-batch, the exact per-row squared gradient norms ``||s_i||^2``, the
group norms ``||sum_{i in k} c_i s_i||^2`` and the weighted gradient ``sum_i c_i s_i`` of per-row objectives
(``s_i = grad seq_obj[i]``). :class:`Book` is their common base:

- the interface every engine implements: ``record()`` (the forward runs inside), ``backward(seq_obj)``,
  ``sq_norms()``, ``group_sq_norms(coeffs, group_ids)``, ``accumulate_grad(coeffs)``,
  ``accumulate_grad_with_group_norms(coeffs, group_ids)``, ``clear()``, ``parameter_names()``;
- the planning done at construction and at every ``record()``: the trainable parameters deduplicated by identity
  (a tied embedding is one :class:`Entry` with two owners) and the layer rule of every module that owns one
  (:func:`oblr.gradnorm.layers.rule_for`); a parameter without a rule raises :class:`UnsupportedModuleError`
  before any forward, naming module path, type and parameter (or, with ``allow_loop_fallback``, is marked for
  one backward per row);
- the helpers the engines share: the layer-input check of a forward hook (:func:`layer_input`), the batch check of
  what a backward hands a layer (:func:`check_rows`), and handing an increment to ``.grad`` or a sink
  (:func:`add_grad`).

The engines: :mod:`.onepass` (no checkpointing), :mod:`.twopass` and :mod:`.recompute` (activation checkpointing
on), chosen by name in :mod:`.engine`; the one-pass and recompute engines keep contributions and assemble from
them (:mod:`.stored`); the two checkpointed ones tap each layer's output (:mod:`.taps`).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from .layers import Rule, rule_for
from .methods import NORMS_METHODS


class UnsupportedModuleError(ValueError):
    """A trainable parameter is owned by a module that has no gradnorm rule."""


@dataclass
class Entry:
    """One trainable parameter (deduplicated by identity) and its contributions [B or K, *shape]."""

    name: str
    param: nn.Parameter
    owners: list[tuple[str, nn.Module, str]] = field(default_factory=list)  # (module path, module, local name)
    contribs: list = field(default_factory=list)
    fallback: bool = False


@dataclass
class Hooked:
    """A module owning trainable parameters that have a rule: its rule and its parameters' entries."""

    path: str
    module: nn.Module
    rule: Rule
    names: frozenset
    params: dict  # local name -> Entry


class Book(ABC):
    """The exact-norm engines' base (module docstring): plans the trainable parameters and their rules; the
    subclasses record, run the backward and answer the queries.

    Args:
        model: any ``nn.Module``; its parameters with ``requires_grad=True`` (at ``record()`` time) are the
            trainable ones, deduplicated by identity.
        method: a name of :data:`oblr.gradnorm.NORMS_METHODS` (``"auto"``, ``"ghost"``, ``"materialize"``,
            ``"loop"``).
        allow_loop_fallback: for a trainable parameter with no rule, warn and compute its per-row
            gradients with one extra backward per row instead of raising.
        grad_sink: ``sink(param, increment)`` that ``accumulate_grad*`` hand each parameter's increment to
            instead of ``param.grad += increment`` (:func:`add_grad`).
    """

    #: the engine works with activation checkpointing on (its ``record()`` keeps nothing per layer itself)
    checkpointed: ClassVar[bool] = False

    def __init__(self, model: nn.Module, method: str = "auto", allow_loop_fallback: bool = False,
                 grad_sink=None):
        NORMS_METHODS.get(method)  # an unknown name raises, listing the registered ones
        self.model = model
        self.method = method
        self.allow_loop_fallback = allow_loop_fallback
        self._sink = add_grad if grad_sink is None else grad_sink
        self._recording = False
        self._entries: list[Entry] = []
        self._batch: int | None = None
        self._warned: set[str] = set()
        self._plan()  # fail early on unsupported modules

    # ------------------------------------------------------------------ the interface
    @abstractmethod
    def record(self):
        """Context manager: the forward pass whose per-row objectives ``backward`` takes runs inside."""

    @abstractmethod
    def backward(self, seq_obj: torch.Tensor, *, retain_graph: bool = False, group_ids=None) -> None:
        """The backward pass of ``seq_obj`` ([B] per-row objectives) that the queries are answered from."""

    @abstractmethod
    def sq_norms(self) -> torch.Tensor:
        """w_i = ||s_i||^2 over all trainable parameters. [B] float32."""

    @abstractmethod
    def group_sq_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """||sum_{i: group_ids[i] = k} coeffs[i] s_i||^2 for each distinct id k (sorted). [K] float32."""

    @abstractmethod
    def accumulate_grad(self, coeffs: torch.Tensor):
        """``p.grad += sum_i coeffs[i] s_i`` for every trainable parameter."""

    @abstractmethod
    def accumulate_grad_with_group_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``p.grad += sum_i coeffs[i] s_i`` and the group norms of :meth:`group_sq_norms`."""

    # ------------------------------------------------------------------ planning
    def _plan(self) -> list[Hooked]:
        ckpt = checkpointing_modules(self.model)
        if ckpt and self.method != "loop" and not self.checkpointed:
            raise ValueError(f"gradient checkpointing is enabled on '{ckpt[0] or '<root>'}'; the one-pass "
                             "BookKeeper keeps every layer's input anyway: use oblr.gradnorm.TwoPassBookKeeper "
                             "(or make_book), or disable it (model.gradient_checkpointing_disable())")
        entries: dict[int, Entry] = {}
        for path, mod in self.model.named_modules():
            for lname, p in mod._parameters.items():
                if p is None or not p.requires_grad:
                    continue
                qual = f"{path}.{lname}" if path else lname
                entries.setdefault(id(p), Entry(qual, p)).owners.append((path, mod, lname))
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
        hooked: dict[int, Hooked] = {}
        for e in entries.values():
            if e.fallback:
                continue
            for path, mod, lname in e.owners:
                h = hooked.setdefault(id(mod), Hooked(path, mod, rules[id(mod)][0], frozenset(), {}))
                h.names = h.names | {lname}
                h.params[lname] = e
        self._entries = list(entries.values())
        return list(hooked.values())

    def _begin_record(self) -> list[Hooked]:
        """Start of every ``record()``: refuse re-entry, drop the previous record, plan the hooks."""
        if self._recording:
            raise RuntimeError("BookKeeper.record() is not re-entrant")
        self.clear()
        return self._plan()

    # ------------------------------------------------------------------ queries and bookkeeping
    def _check(self, coeffs: torch.Tensor | None = None) -> int:
        if self._batch is None:
            raise RuntimeError("call book.backward(seq_obj) inside record() first")
        if coeffs is not None and (coeffs.dim() != 1 or coeffs.shape[0] != self._batch):
            raise ValueError(f"coeffs must be [B] with B={self._batch}, got shape {tuple(coeffs.shape)}")
        return self._batch

    def _give(self, p: nn.Parameter, inc: torch.Tensor) -> None:
        """Hand a freshly assembled increment to the sink (the default one keeps it as ``.grad``, uncopied)."""
        if self._sink is add_grad:
            add_grad(p, inc, owned=True)
        else:
            self._sink(p, inc)

    def clear(self) -> None:
        """Free every stored contribution."""
        for e in self._entries:
            e.contribs = []
        self._batch = None

    def parameter_names(self) -> list[str]:
        """Names of the trainable parameters (deduplicated by identity) in assembly order."""
        return [e.name for e in self._entries]


def checkpointing_modules(model: nn.Module) -> list[str]:
    """Paths of the modules of ``model`` with Hugging Face gradient checkpointing switched on."""
    return [p for p, m in model.named_modules() if getattr(m, "gradient_checkpointing", False) is True]


def layer_input(h: Hooked, module: nn.Module, args: tuple, kwargs: dict, output) -> torch.Tensor:
    """The input ``x`` a forward hook of ``h`` sees (first positional argument, else first keyword argument);
    a module that does not take a tensor first and return a tensor raises ``TypeError`` naming it."""
    x = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(x, torch.Tensor) or not isinstance(output, torch.Tensor):
        raise TypeError(f"gradnorm: module '{h.path}' ({type(module).__qualname__}) must take a tensor "
                        f"as first input and return a tensor")
    return x


def check_rows(path: str, a: int, b: int, B: int) -> None:
    """Raise when a layer's recorded tensors have batch dims ``a``/``b`` other than the objective's ``B``."""
    if a != B or b != B:
        raise ValueError(f"module '{path}': batch dim {a}/{b} != B={B}; "
                         "the engine needs batch-first activations with independent rows")


def add_grad(p: nn.Parameter, inc: torch.Tensor, owned: bool = False) -> None:
    """``p.grad += inc`` (created if None), in the parameter's dtype. ``owned``: nothing else holds ``inc``,
    so a new ``.grad`` may be ``inc`` itself rather than a copy."""
    if p.grad is None:
        g = inc if inc.dtype == p.dtype else inc.to(p.dtype)
        g = g if g.shape == p.shape else g.reshape(p.shape)
        p.grad = g if owned and g.is_contiguous() else g.clone()
    else:
        g = inc if inc.dtype == p.grad.dtype else inc.to(p.grad.dtype)
        p.grad.add_(g if g.shape == p.shape else g.reshape(p.shape))
