"""Exact moments of the policy-gradient estimators by enumeration on a tiny softmax policy.

The slow exact reference for :mod:`oblr.estimators` (used by ``tests/test_estimators.py`` and by
``scripts/estimator_variance.py``). Tiny policy: pi(o) = softmax(theta)_o over K outputs, reward F[o];
the score w.r.t. theta is s(o) = e_o - p and w(o) = ||s(o)||^2 (the exact weight of ``oblr``; for this
policy the logit-energy proxy equals it). For a group of G i.i.d. outputs the gradient estimate is

    g = (1/G) sum_i A_i s(o_i)        [K],  A = the method's advantages of the group,

and E[g], tr Cov(g) are computed exactly (float64) as sums over all K^G tuples, or over the
C(G+K-1, K-1) multinomial count vectors (exact for any estimator symmetric in its G outputs, which makes
G = 16 or 64 cheap). Everything here is a pure function.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch

from oblr.estimators import compute_advantages

D = torch.float64


def policy(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(p [K], s [K, K] with s[o] = e_o - p, w [K] = ||s[o]||^2) of pi = softmax(theta), in float64."""
    p = torch.softmax(theta.to(D), 0)
    s = torch.eye(len(p), dtype=D) - p
    return p, s, (s**2).sum(1)


def all_tuples(K: int, G: int) -> tuple[torch.Tensor, None]:
    """Every G-tuple of outputs ([K^G, G]) and no multiplicity (each tuple counted once)."""
    return torch.tensor(list(itertools.product(range(K), repeat=G))), None


def count_tuples(K: int, G: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sorted tuple per count vector ([C(G+K-1, K-1), G]) with its multinomial log-coefficient."""
    rows, logc = [], []
    for cut in itertools.combinations(range(G + K - 1), K - 1):
        edges = (-1,) + cut + (G + K - 1,)
        counts = [edges[k + 1] - edges[k] - 1 for k in range(K)]
        rows.append([k for k in range(K) for _ in range(counts[k])])
        logc.append(math.lgamma(G + 1) - sum(math.lgamma(c + 1) for c in counts))
    return torch.tensor(rows), torch.tensor(logc, dtype=D)


def policy_gradient(theta: torch.Tensor, F: torch.Tensor) -> torch.Tensor:
    """grad J = E[F(o) s(o)] [K]."""
    p, s, _ = policy(theta)
    return (p[:, None] * F.to(D)[:, None] * s).sum(0)


def population_baseline(theta: torch.Tensor, F: torch.Tensor) -> float:
    """b* = E[w F] / E[w], the constant baseline that minimises tr Cov((F - b) s) for one output."""
    p, _, w = policy(theta)
    return float((p * w * F.to(D)).sum() / (p * w).sum())


def exact_moments_of(advantages: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], theta: torch.Tensor,
                     F: torch.Tensor, G: int, *, counts: bool = False):
    """(E[g] [K], tr Cov(g), grad J [K]) for g = (1/G) sum_i A_i s_i, exactly.

    ``advantages(rewards [M, G], weights [M, G]) -> A [M, G]`` for M groups at once (weights = w of the
    outputs). ``counts=True`` enumerates count vectors (requires ``advantages`` symmetric in the G outputs).
    """
    p, s, w = policy(theta)
    K = len(p)
    tup, logc = (count_tuples if counts else all_tuples)(K, G)
    prob = (p.log()[tup].sum(1) + (logc if logc is not None else 0.0)).exp()
    if abs(float(prob.sum()) - 1.0) > 1e-10:
        raise AssertionError(f"enumeration probabilities sum to {float(prob.sum())}, not 1")
    A = advantages(F.to(D)[tup], w[tup])
    g = (A[..., None] * s[tup]).mean(1)  # [M, K]
    mean = (prob[:, None] * g).sum(0)
    trcov = (prob * (g**2).sum(1)).sum() - (mean**2).sum()
    return mean, trcov, policy_gradient(theta, F)


def exact_moments(method: str, theta: torch.Tensor, F: torch.Tensor, G: int, *, counts: bool = False, **options):
    """:func:`exact_moments_of` for the registered estimator ``method`` (weights and lengths = w)."""
    return exact_moments_of(lambda r, w: compute_advantages(method, r, weights=w, lengths=w, **options),
                            theta, F, G, counts=counts)


def exact_moments_constant_baseline(b: float, theta: torch.Tensor, F: torch.Tensor, G: int, *, counts: bool = False):
    """:func:`exact_moments_of` with A_i = F_i - b for a fixed number b (e.g. :func:`population_baseline`)."""
    return exact_moments_of(lambda r, w: r - b, theta, F, G, counts=counts)
