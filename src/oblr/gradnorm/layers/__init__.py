"""Registry of per-layer rules (one small rule per module type, Opacus-style).

Every rule has ONE signature::

    rule(module, x, g, names) -> {param_name: Contribution}

- ``module``: the module whose direct parameters are being assembled;
- ``x``: its first positional input as seen in the forward pass (detached), batch first [B, ...];
- ``g``: the gradient of ``sum_i l_i`` with respect to its output, [B, ...] (same shape as the output);
- ``names``: the local names of its trainable parameters to produce (a subset of the rule's ``params``).

It returns one :class:`~oblr.gradnorm.contrib.Outer` or :class:`~oblr.gradnorm.contrib.Dense` per name,
whose row ``i`` is the contribution of this module call to ``s_i``. Register with
:func:`register_rule` (exact module type; subclasses are NOT matched, because a subclass may change the
forward and a silently wrong norm is worse than an error). Rules for families that are recognised by
structure (Hugging Face ``*RMSNorm`` classes) are registered with :func:`register_structural_rule` and
are numerically verified against autograd once per class before first use.
"""

from . import embedding, linear, norms  # noqa: E402,F401  (register the built-in rules)
from .base import (  # noqa: F401  (the registry and its helpers, re-exported)
    Rule,
    RuleFn,
    register_rule,
    register_structural_rule,
    registered_types,
    rule_for,
    verify_rule,
)
