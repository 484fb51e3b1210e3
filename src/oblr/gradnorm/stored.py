"""The engines that keep every layer's contributions (one-pass, recompute): storing them and answering from them.

:class:`StoredBook` is the half of an engine after its backward pass: each layer's contributions are stored per
parameter (:meth:`StoredBook._add`), and ``sq_norms``, ``group_sq_norms``, ``accumulate_grad`` and
``accumulate_grad_with_group_norms`` assemble from them. Parameters are deduplicated by identity, so a tied
embedding sums both owners' contributions and the cross term ``2 <G_emb, G_head>`` is included. Ghost norm or
materialisation is chosen per parameter (:func:`oblr.gradnorm.assembly.sq_norm`); under ``method="auto"`` an Outer
whose per-row gradients take little memory next to its factors is materialised once when stored
(:func:`oblr.gradnorm.assembly.keep_dense`). After the backward pass the parameters whose contribution is one
such per-row gradient are stacked by shape into slabs (:mod:`oblr.gradnorm.slabs`), and each query reduces a slab
with a few operators, not a few per parameter (the layers of a decoder repeat the same shapes). Any grouping can
be queried, any number of times.
"""

from __future__ import annotations

import torch

from .assembly import grouped_sums, keep_dense, materialized_sum, sq_norm
from .book import Book, Entry, add_grad
from .contrib import Dense, Grouping, Outer, regroup_for_products
from .precision import half_factors, tf32_products
from .slabs import RunningSum, Slab, form_slabs, regrouped, slab_norms, slab_sums
from .strips import GramCache
from .windows import trim_windows


class StoredBook(Book):
    """Contributions stored per parameter and every query assembled from them (module docstring); the subclasses
    record and run the backward pass that fills them, then call :meth:`_fold`."""

    _slabs: list[Slab] | tuple = ()  # the stacked one-Dense parameters of the last backward (:meth:`_fold`)

    def _add(self, e: Entry, c) -> None:
        """Store a contribution. Under ``method="auto"`` an Outer whose per-row gradients [B, R, C] take little
        memory next to its factors (``assembly.keep_dense``) is materialised now, once, so that every later
        query is a cheap reduction; dense contributions of one parameter are summed."""
        self._slabs = []  # a new backward's contributions: the previous slabs are stale
        if self.method == "auto" and keep_dense(c):
            c = Dense(c.regroup(Grouping.rows(c.K)).materialize(), owned=True)
        elif isinstance(c, Outer) and c.right.device.type == "cpu":
            c = trim_windows(c)  # skip each row's zero-gradient tokens (padding, a head's prompt)
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
        """The end of every backward pass. Under ``method="auto"``: a parameter that has a dense contribution gets
        its Outer contributions added into it (e.g. the input-embedding part of a tied embedding whose head part
        was kept dense): no extra memory, and the queries then never need a mixed ghost/materialised assembly.
        Then (every method but the loop reference) the one-Dense parameters are stacked into slabs by shape
        (:func:`oblr.gradnorm.slabs.form_slabs`)."""
        if self.method == "auto":
            self._fold_dense()
        self._slabs = [] if self.method == "loop" else form_slabs(self._entries)

    def _fold_dense(self) -> None:
        """Each parameter with a dense contribution: every other contribution added into it (:meth:`_fold`)."""
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
    def _order(self) -> list[tuple]:
        """The assembly's items in engine order: ``(entry, None)`` for an entry with contributions, ``(slab, i)``
        for the i-th member of a slab at that member's own place. A slab is reduced once, at its first member; its
        members' results are then added into the running totals each at its own place, so the totals are summed in
        the entries' order as without slabs (another order moved a 2-process FSDP run with checkpointing, whose
        engine has no slabs, past its 1e-5 agreement with the run without), in a few operators
        (:class:`oblr.gradnorm.slabs.RunningSum`)."""
        members = {id(e): (s, i) for s in self._slabs if s.current() for i, e in enumerate(s.entries)}
        return [members.get(id(e), (e, None)) for e in self._entries if id(e) in members or e.contribs]

    def _assemble(self, grp: Grouping) -> torch.Tensor:
        total = RunningSum((grp.K,), self._device)  # the entries' order (:meth:`_order`)
        cache = GramCache()  # q/k/v (and gate/up) share their input: its Gram is computed once
        rows: dict[int, torch.Tensor] = {}  # a slab's per-member norms [L, K], formed at its first member
        for e, i in self._order():
            if i is not None:
                if id(e) not in rows:
                    rows[id(e)] = slab_norms(e.z, grp)
                total.add_row(rows[id(e)], i)
                continue
            with tf32_products(half_factors(e.contribs)):
                total.add(sq_norm([c.regroup(grp) for c in e.contribs], self.method, cache))
        return total.total()

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
        sq = RunningSum((), self._device)
        rows: dict[int, torch.Tensor] = {}  # a slab's members' squared norms [L], formed at its first member
        for e, i in self._order():
            if i is not None:
                if id(e) not in rows:
                    m = regrouped(e.z, grp)  # [L, 1, n]: each member's weighted sum
                    rows[id(e)] = m.pow(2).sum(dim=(1, 2))
                    self._give_slab(e.entries, m.view(e.z.shape[0], *e.z.shape[2:]))
                sq.add_row(rows[id(e)], i)
                continue
            with tf32_products(half_factors(e.contribs)):
                inc = materialized_sum([regroup_for_products(c, grp) for c in e.contribs])[0]
            sq.add(inc.pow(2).sum())
            self._give(e.param, inc)
        return sq.total()

    def accumulate_grad_with_group_norms(self, coeffs: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``p.grad += sum_i coeffs[i] s_i`` and the group norms, from one pass over the records.

        Returns ``||sum_{i: group_ids[i] = k} coeffs[i] s_i||^2`` for each distinct id k (sorted), [K] float32:
        the same numbers as :meth:`group_sq_norms` and the same ``.grad`` as :meth:`accumulate_grad`, but the
        weighted gradient is assembled as the sum of the materialised per-group sums, so the group norms
        need no pass of their own (``assembly.grouped_sums``; a slab's members at once, ``slabs.slab_sums``).
        """
        self._check(coeffs)
        grp = Grouping.from_groups(coeffs.to(self._device), group_ids.to(self._device))
        sq = RunningSum((grp.K,), self._device)  # in the entries' order: another moved a 2-process FSDP step past 1e-4
        rows: dict[int, torch.Tensor] = {}  # a slab's per-member group norms [L, K], formed at its first member
        for e, i in self._order():
            if i is not None:
                if id(e) not in rows:
                    rows[id(e)], incs = slab_sums(e.z, grp)
                    self._give_slab(e.entries, incs)
                sq.add_row(rows[id(e)], i)
                continue
            with tf32_products(half_factors(e.contribs)):
                e_sq, inc = grouped_sums(e.contribs, grp)
            sq.add(e_sq)
            self._give(e.param, inc)
        return sq.total()

    def clear(self) -> None:
        """Free every stored contribution and slab."""
        self._slabs = []
        super().clear()

    def _give_slab(self, entries: list[Entry], incs: torch.Tensor) -> None:
        """Hand a slab's increments ``incs`` [L, *shape] (float32, fresh) to its members' ``.grad``, as :meth:`_give`
        does one by one: with the default sink, new ``.grad`` are views of ``incs`` (in the parameters' dtype) and
        existing ones get all their increments in one ``_foreach_add_``; any other sink gets them one by one."""
        params = [e.param for e in entries]
        if self._sink is not add_grad:
            for p, inc in zip(params, incs.unbind(0)):
                self._sink(p, inc)
            return
        grads = [p.grad for p in params]
        dtype = params[0].dtype if grads[0] is None else grads[0].dtype
        if any((g is None) != (grads[0] is None) or (g is not None and g.dtype != dtype) for g in grads):
            for p, inc in zip(params, incs.unbind(0)):  # mixed: one by one
                self._give(p, inc)
            return
        incs = incs if incs.dtype == dtype else incs.to(dtype)
        if grads[0] is None:
            for p, inc in zip(params, incs.unbind(0)):
                p.grad = inc
        else:
            torch._foreach_add_(grads, list(incs.unbind(0)))
