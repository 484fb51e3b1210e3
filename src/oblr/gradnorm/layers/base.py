"""The per-layer rule registry and its machinery (:class:`Rule`, :func:`register_rule`, :func:`rule_for`,
the numerical check of structural rules); the package :mod:`oblr.gradnorm.layers` re-exports it and
registers the built-in rules."""


from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from ..assembly import materialized_sum
from ..contrib import Contribution, Grouping

RuleFn = Callable[[nn.Module, torch.Tensor, torch.Tensor, frozenset], dict[str, Contribution]]


@dataclass(frozen=True)
class Rule:
    name: str
    fn: RuleFn
    params: tuple[str, ...]
    #: optional ``check(module) -> reason or None``: a reason makes the module unsupported
    check: Callable[[nn.Module], str | None] | None = None


_RULES: dict[type, Rule] = {}
_STRUCTURAL: list[tuple[Callable[[nn.Module], bool], Callable[[nn.Module], torch.Tensor], Rule]] = []
_VERIFIED: dict[tuple[type, torch.dtype], str | None] = {}


def register_rule(*module_types: type, params: tuple[str, ...], check=None):
    """Decorator: register ``fn(module, x, g, names)`` for exactly these module types (duplicates rejected)."""

    def deco(fn: RuleFn) -> RuleFn:
        for t in module_types:
            if t in _RULES:
                raise ValueError(f"a gradnorm rule for {t.__qualname__} is already registered ({_RULES[t].name})")
        for t in module_types:
            _RULES[t] = Rule(fn.__name__, fn, tuple(params), check)
        return fn

    return deco


def register_structural_rule(predicate, probe_input, *, params: tuple[str, ...]):
    """Decorator: a rule for modules matched by ``predicate(module)``; verified with ``probe_input(module)``."""

    def deco(fn: RuleFn) -> RuleFn:
        _STRUCTURAL.append((predicate, probe_input, Rule(fn.__name__, fn, tuple(params))))
        return fn

    return deco


def registered_types() -> list[str]:
    return sorted(t.__qualname__ for t in _RULES) + [r.name + " (by structure)" for _, _, r in _STRUCTURAL]


def _probe_param(p: torch.Tensor) -> torch.Tensor:
    """A plain-tensor copy of ``p`` for the probe. A sharded DTensor parameter (FSDP2) is replaced by a
    deterministic random tensor of its global shape: gathering it would be a collective, and the rules
    verified by structure are linear in the weight, so any value tests the formula."""
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        g = torch.Generator().manual_seed(2)
        return torch.randn(p.shape, generator=g).to(device=p.to_local().device, dtype=p.dtype)
    return p.detach().clone()


def verify_rule(module: nn.Module, rule: Rule, x: torch.Tensor) -> float:
    """Max relative error of the rule's summed contributions vs autograd on input ``x`` (a probe)."""
    params = {
        n: _probe_param(getattr(module, n)).requires_grad_(True)
        for n in rule.params
        if isinstance(getattr(module, n, None), torch.Tensor)
    }
    with torch.enable_grad():
        y = functional_call(module, params, (x,))
        r = torch.randn(y.shape, generator=torch.Generator().manual_seed(0)).to(y)
        grads = torch.autograd.grad((y.float() * r.float()).sum(), list(params.values()))
    contribs = rule.fn(module, x.detach(), r, frozenset(params))
    single = Grouping.single(torch.ones(x.shape[0], device=x.device))
    err = 0.0
    for (n, _), ref in zip(params.items(), grads):
        got = materialized_sum([contribs[n].regroup(single)])[0]
        scale = ref.float().abs().max().clamp_min(1e-12)
        err = max(err, float((got - ref.float()).abs().max() / scale))
    return err


def rule_for(module: nn.Module) -> tuple[Rule | None, str | None]:
    """The rule for ``module`` and ``None``, or ``None`` and the reason it is unsupported."""
    rule = _RULES.get(type(module))
    if rule is not None:
        reason = rule.check(module) if rule.check else None
        return (None, reason) if reason else (rule, None)
    for predicate, probe_input, rule in _STRUCTURAL:
        if predicate(module):
            p = next(iter(module.parameters(recurse=False)))
            key = (type(module), p.dtype)
            if key not in _VERIFIED:
                tol = 1e-4 if p.dtype in (torch.float32, torch.float64) else 3e-2
                err = verify_rule(module, rule, probe_input(module))
                _VERIFIED[key] = None if err <= tol else (
                    f"matched rule {rule.name} by structure but its gradient differs from autograd "
                    f"(max relative error {err:.2e} > {tol:g})"
                )
            reason = _VERIFIED[key]
            return (None, reason) if reason else (rule, None)
    return None, f"no gradnorm rule for this module type (known: {', '.join(registered_types())})"
