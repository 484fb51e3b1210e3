"""The engines that keep every layer's contributions (one-pass, recompute): storing them and answering from them.

:class:`StoredBook` is the half of an engine after its backward pass: each layer's contributions are stored per
parameter (:meth:`StoredBook._add`), and ``sq_norms``, ``group_sq_norms``, ``accumulate_grad`` and
``accumulate_grad_with_group_norms`` assemble from them. Parameters are deduplicated by identity, so a tied
embedding sums both owners' contributions and the cross term ``2 <G_emb, G_head>`` is included. Ghost norm or
materialisation is chosen per parameter (:func:`oblr.gradnorm.assembly.sq_norm`); under ``method="auto"`` an Outer
whose per-row gradients take little memory next to its factors is materialised once when stored
(:func:`oblr.gradnorm.assembly.keep_dense`). Any grouping can be queried, any number of times.
"""

from __future__ import annotations

import torch

from .assembly import grouped_sums, keep_dense, materialized_sum, sq_norm
from .book import Book, Entry
from .contrib import Dense, Grouping, Outer, regroup_for_products
from .precision import half_factors, tf32_products
from .strips import GramCache
from .windows import token_windows


class StoredBook(Book):
    """Contributions stored per parameter and every query assembled from them (module docstring); the subclasses
    record and run the backward pass that fills them, then call :meth:`_fold`."""

    def _add(self, e: Entry, c) -> None:
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
