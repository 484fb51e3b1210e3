"""Per-row gradients of same-shaped parameters stacked into slabs, and their norms and sums a slab at a time.

A decoder repeats the same few parameter shapes in every layer (a Qwen3 model: seven linear shapes, two norm
shapes, 28-36 layers). After the backward pass, every parameter whose stored contribution is one
:class:`~oblr.gradnorm.contrib.Dense` per-row gradient ``[B, *shape]`` (a norm weight, or a linear kept dense by
``assembly.keep_dense``) is stacked with the others of its shape into a *slab* ``[L, B, *shape]``
(:func:`form_slabs`; each parameter's contribution becomes a view of it). The queries then reduce a whole slab
with a few operators (:func:`regrouped`, :func:`slab_norms`, :func:`slab_sums`) instead of a few per
parameter: on a GPU a step of small layers is bound by the host dispatching operators
(``benchmarks/op_count.py``), not by the arithmetic, which is the same product per member and group as
``Dense.regroup`` forms for one parameter.

Memory: a slab holds at most :data:`SLAB_ELEMS` elements, so stacking holds at most that much beside the
contributions it replaces (freed once stacked), and a query's working set is bounded by it too; large
parameters (whose operators are long enough not to be launch-bound) are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .contrib import Dense, Grouping, numel

Tensor = torch.Tensor

#: elements one slab may hold (float32: 16 MiB); same-shaped per-row gradients beyond it form further slabs,
#: and one larger than half of it is never stacked
SLAB_ELEMS = 1 << 22


def slab_budget() -> int:
    """:data:`SLAB_ELEMS` as it is at the call (a module that imports this function sees a later change to it; the
    two-pass engine's waiting per-row gradients, :class:`oblr.gradnorm.gram.PendingRows`, keep to it too)."""
    return SLAB_ELEMS


@dataclass(eq=False)  # one slab is one stack: compared by identity
class Slab:
    """Stacked per-row gradients ``z`` [L, K, *shape] float32 of ``entries`` (engine order); entry ``j``'s one
    contribution is ``parts[j]``, a :class:`Dense` view of ``z[j]``."""

    entries: list
    z: Tensor
    parts: list

    def current(self) -> bool:
        """True while every member's stored contribution is still the slab's view (no later backward replaced it)."""
        return all(len(e.contribs) == 1 and e.contribs[0] is d for e, d in zip(self.entries, self.parts))


def slab_groups(entries: list, budget: int | None = None) -> list[list]:
    """The entries to stack, as lists of at least two: those whose contribution is one Dense, by (shape, device,
    parameter dtype) in engine order, each list of at most ``budget`` elements (default :data:`SLAB_ELEMS`, read
    at the call) in its per-row gradients (split into near-equal lists)."""
    budget = SLAB_ELEMS if budget is None else budget
    by_key: dict[tuple, list] = {}
    for e in entries:
        if len(e.contribs) == 1 and isinstance(e.contribs[0], Dense):
            z = e.contribs[0].z
            by_key.setdefault((tuple(z.shape), z.device, e.param.dtype), []).append(e)
    out = []
    for (shape, _, _), members in by_key.items():
        cap = budget // max(1, numel(shape))
        if cap < 2 or len(members) < 2:
            continue
        n = -(-len(members) // cap)  # lists needed; then as even as possible
        size = -(-len(members) // n)
        out += [members[i:i + size] for i in range(0, len(members), size) if len(members[i:i + size]) > 1]
    return out


def form_slabs(entries: list, budget: int | None = None) -> list[Slab]:
    """Stack each :func:`slab_groups` list's contributions into one slab and point every member at its view of it
    (the stacked originals are freed once no one references them: one slab at a time is held twice)."""
    slabs = []
    for members in slab_groups(entries, budget):
        z = torch.stack([e.contribs[0].z for e in members])
        parts = [Dense(v, owned=True) for v in z.unbind(0)]
        for e, d in zip(members, parts):
            e.contribs = [d]
        slabs.append(Slab(members, z, parts))
    return slabs


def regrouped(z: Tensor, grp: Grouping) -> Tensor:
    """``[L, K, n]``: each member's samples of ``grp`` (``Dense.regroup`` of every member at once, the same product
    per member and group): the rows themselves for ``Grouping.rows``, one batched ``[1, M] x [M, n]`` product per
    member and group for contiguous groups, a scatter of the scaled rows otherwise."""
    L, B = z.shape[0], z.shape[1]
    flat = z.view(L, B, -1)
    if grp.index is None:
        return flat
    K, M = grp.index.shape
    if grp.contiguous:
        return torch.matmul(grp.scale.view(1, K, 1, M), flat.view(L, K, M, -1)).view(L, K, -1)
    out = torch.zeros(L, K, flat.shape[2], dtype=torch.float32, device=z.device)
    return out.index_add_(1, grp.row_group, flat * grp.coeff.view(1, B, 1))


def slab_norms(z: Tensor, grp: Grouping) -> Tensor:
    """``||sample k of member l||^2`` [L, K] float32."""
    return torch.linalg.vector_norm(regrouped(z, grp), dim=2).square()


def slab_sums(z: Tensor, grp: Grouping) -> tuple[Tensor, Tensor]:
    """``(sq, total)``: each member's ``||M_k||^2`` [L, K] and ``sum_k M_k`` [L, *shape] (``assembly.grouped_sums``
    of every member at once; ``M_k`` = sample k)."""
    m = regrouped(z, grp)
    return torch.linalg.vector_norm(m, dim=2).square(), m.sum(1).view(z.shape[0], *z.shape[2:])


class RunningSum:
    """``0 + t_0 + t_1 + ...`` over float32 terms of one shape given in order -- each a tensor of its own (:meth:`add`)
    or row ``i`` of a slab's block of results ``[L, *shape]`` (:meth:`add_row`) -- in a few operators whatever their
    number: the terms stacked, put in order by one ``index_select`` and added one after another by one
    ``index_add_``, which on CPU adds its rows in order, so the total is bitwise the running sum ``t = t + term``
    (the order the engines' totals keep: another moved a 2-process FSDP run past its agreement with the two-pass
    engine's). On other devices ``index_add_`` adds atomically in no fixed order, so there the rows are summed
    by one reduction instead: deterministic, in another order."""

    def __init__(self, shape=(), device=None):
        self.shape, self.device = tuple(shape), device
        self._singles: list[Tensor] = []
        self._blocks: list[Tensor] = []
        self._block_of: dict[int, int] = {}
        self._pos: list[tuple[int, int]] = []  # (block or -1 for a single, row)

    def add(self, t: Tensor) -> None:
        self._pos.append((-1, len(self._singles)))
        self._singles.append(t)

    def add_row(self, block: Tensor, i: int) -> None:
        j = self._block_of.setdefault(id(block), len(self._blocks))
        if j == len(self._blocks):
            self._blocks.append(block)
        self._pos.append((j, i))

    def total(self) -> Tensor:
        parts = ([torch.stack(self._singles)] if self._singles else []) + self._blocks
        if not parts:
            return torch.zeros(self.shape, dtype=torch.float32, device=self.device)
        rows = (parts[0] if len(parts) == 1 else torch.cat(parts)).reshape(-1, numel(self.shape))
        start = [len(self._singles)]  # each block's first row in ``rows``
        for b in self._blocks[:-1]:
            start.append(start[-1] + b.shape[0])
        order = [r if j < 0 else start[j] + r for j, r in self._pos]
        if order != list(range(rows.shape[0])):
            rows = rows.index_select(0, torch.tensor(order, device=rows.device))
        if rows.device.type != "cpu":
            return rows.sum(0).view(self.shape)
        out = torch.zeros(1, rows.shape[1], dtype=torch.float32, device=rows.device)
        return out.index_add_(0, torch.zeros(rows.shape[0], dtype=torch.long, device=rows.device), rows).view(self.shape)
