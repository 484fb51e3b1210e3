"""Same-shaped per-row gradients stacked into slabs (oblr.gradnorm.slabs): a slab's norms and sums are each member's
own (bitwise, on CPU), the engines stack every kept-dense parameter of a repeated shape, their queries and
gradients equal those of the same engine with stacking off, and the assembly's operator count no longer grows
with the depth."""

from __future__ import annotations

import collections

import pytest
import torch
from conftest import tiny_qwen3
from gradnorm_helpers import checkpointed, make_batch

from oblr.gradnorm import BookKeeper, Dense, RecomputeBookKeeper, slabs
from oblr.gradnorm.assembly import grouped_sums, sq_norm
from oblr.gradnorm.contrib import Grouping
from oblr.gradnorm.reference import trainable_parameters
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs

GROUPINGS = {
    "rows": lambda g: Grouping.rows(6),
    "contiguous": lambda g: Grouping.from_groups(torch.randn(6, generator=g), torch.arange(6) // 2),
    "interleaved": lambda g: Grouping.from_groups(torch.randn(6, generator=g), torch.tensor([0, 1, 0, 2, 1, 2])),
    "single": lambda g: Grouping.single(torch.randn(6, generator=g)),
}


@pytest.mark.parametrize("shape", [(12, 8), (8,)])
@pytest.mark.parametrize("grouping", list(GROUPINGS))
def test_a_slabs_norms_and_sums_are_each_members_own(shape, grouping):
    """slab_norms / slab_sums of a stack against assembly.sq_norm / grouped_sums of each member alone (the same
    product per member and group: bitwise equal on CPU)."""
    g = torch.Generator().manual_seed(3)
    zs = [torch.randn(6, *shape, generator=g) for _ in range(5)]
    grp = GROUPINGS[grouping](g)
    z = torch.stack(zs)
    assert torch.equal(slabs.slab_norms(z, grp), torch.stack([sq_norm([Dense(m).regroup(grp)], "auto") for m in zs]))
    sq, total = slabs.slab_sums(z, grp)
    alone = [grouped_sums([Dense(m)], grp) for m in zs]
    assert torch.equal(sq, torch.stack([a[0] for a in alone]))
    assert torch.equal(total, torch.stack([a[1] for a in alone])) and total.shape == (5, *shape)


def _batch(model, resp):
    return make_batch(model.config.vocab_size, [3, 5, 2, 4], [resp, resp - 3, resp - 1, 5], seed=21)


def _book(cls, model, ids, am, rm):
    book = cls(model)
    with book.record():
        book.backward(sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm))
    return book


def _queries(book, model, coeffs, gid, grads_before):
    """Every query's answer and the gradients it forms, from ``.grad`` None and from an existing ``.grad``."""
    params = trainable_parameters(model)
    out = {"w": book.sq_norms(), "gk": book.group_sq_norms(coeffs, gid)}
    for p in params:
        p.grad = None if grads_before is None else grads_before[p].clone()
    out["fused"] = book.accumulate_grad_with_group_norms(coeffs, gid)
    out["fused_grads"] = [p.grad.clone() for p in params]
    out["sq"] = book.accumulate_grad(coeffs)  # onto the fused call's .grad
    out["grads"] = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


@pytest.mark.parametrize("engine", ["one_pass", "recompute"])
@pytest.mark.parametrize("existing_grad", [False, True])
def test_engines_stack_repeated_shapes_and_answer_as_without(engine, existing_grad, monkeypatch):
    """Long rows (every linear kept dense): each slab holds >= 2 parameters of one shape whose stored contribution
    is its view; all kept-dense parameters of a shape that occurs more than once are stacked; gradients equal the
    unstacked engine's bitwise, norms within float32 summation order (the slab's members summed first)."""
    torch.manual_seed(0)
    model = tiny_qwen3(layers=3)
    cls = BookKeeper
    if engine == "recompute":
        model, cls = checkpointed(model), RecomputeBookKeeper
    ids, am, rm = _batch(model, 30)
    coeffs, gid = torch.tensor([0.5, -1.0, 2.0, 0.3]), torch.tensor([0, 0, 1, 1])
    before = {p: torch.randn_like(p) for p in trainable_parameters(model)} if existing_grad else None

    book = _book(cls, model, ids, am, rm)
    assert book._slabs
    by_shape = collections.Counter(tuple(e.param.shape) for e in book._entries)
    stacked = set()
    for s in book._slabs:
        assert len(s.entries) >= 2 and len({tuple(e.param.shape) for e in s.entries}) == 1
        for j, e in enumerate(s.entries):
            (c,) = e.contribs
            assert isinstance(c, Dense) and c.z.data_ptr() == s.z[j].data_ptr()
            stacked.add(id(e))
    assert all(id(e) in stacked for e in book._entries if by_shape[tuple(e.param.shape)] > 1)
    got = _queries(book, model, coeffs, gid, before)

    monkeypatch.setattr(slabs, "SLAB_ELEMS", 0)  # stacking off: every parameter assembled alone
    ref_book = _book(cls, model, ids, am, rm)
    assert not ref_book._slabs
    ref = _queries(ref_book, model, coeffs, gid, before)
    for k in ("fused_grads", "grads"):
        assert all(torch.equal(a, b) for a, b in zip(got[k], ref[k])), k
    for k in ("w", "gk", "fused", "sq"):  # the totals in the entries' order (RunningSum), as without slabs
        assert torch.equal(got[k], ref[k]), (k, got[k], ref[k])


def test_a_later_backward_replaces_the_slabs():
    """backward(retain_graph=True) then a second objective: the queries answer for the second one (the first
    backward's slabs are stale and not read)."""
    model = tiny_qwen3()
    ids, am, rm = _batch(model, 30)
    book = BookKeeper(model)
    with book.record():
        lp = sequence_logprobs(gather_logprobs(forward_logits(model, ids, am), ids), rm)
        book.backward(lp, retain_graph=True)
        first = book._slabs
        book.backward(2.0 * lp)
    assert book._slabs and all(s not in first for s in book._slabs) and not any(s.current() for s in first)
    twice = book.sq_norms()
    once = _book(BookKeeper, model, ids, am, rm).sq_norms()
    assert torch.allclose(twice, 4.0 * once, rtol=1e-5)


def _assembly_ops(layers: int) -> int:
    model = tiny_qwen3(layers=layers)
    ids, am, rm = _batch(model, 30)
    book = _book(BookKeeper, model, ids, am, rm)
    coeffs, gid = torch.tensor([0.5, -1.0, 2.0, 0.3]), torch.tensor([0, 0, 1, 1])
    book.sq_norms(), book.accumulate_grad_with_group_norms(coeffs, gid)  # warm-up: .grad exists afterwards
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        book.sq_norms()
        book.accumulate_grad_with_group_norms(coeffs, gid)
    return sum(1 for e in prof.events() if e.name.startswith("aten::")
               and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))


def test_the_assemblys_operator_count_does_not_grow_with_the_depth():
    """Every entry kept dense: 2 and 5 layers dispatch the same number of top-level operators in sq_norms and
    accumulate_grad_with_group_norms, the totals summed in the entries' order included (before slabs: about 18
    more per parameter, 11 parameters per layer; with a running sum's two per member per query: 4)."""
    assert _assembly_ops(5) == _assembly_ops(2)


@pytest.mark.parametrize("singles,blocks", [(3, ()), (0, (4,)), (2, (3, 5)), (5, (1, 2))])
def test_running_sum_is_the_running_sum_in_the_given_order(singles, blocks):
    """RunningSum against ``t = t + term`` in the given order, bitwise on CPU, for terms interleaved from singles and
    slab blocks, the first one 1e8 and the others 3-4 (float32 keeps none of those after it: another order gives
    another total, so the test tells the order); and no terms: zeros."""
    g = torch.Generator().manual_seed(len(blocks) + singles)
    terms = [("s", 3.0 + torch.rand(3, generator=g)) for _ in range(singles)]
    made = [3.0 + torch.rand(n, 3, generator=g) for n in blocks]
    terms += [("b", (b, i)) for b in made for i in range(b.shape[0])]
    order = torch.randperm(len(terms), generator=g).tolist()
    kind, t = terms[order[0]]
    (t if kind == "s" else t[0][t[1]]).mul_(1e8 / 3.5)

    def value(j):
        kind, t = terms[j]
        return t if kind == "s" else t[0][t[1]]

    rs, want = slabs.RunningSum((3,)), torch.zeros(3)
    for j in order:
        kind, t = terms[j]
        rs.add(t) if kind == "s" else rs.add_row(*t)
        want = want + value(j)
    assert torch.equal(rs.total(), want)
    other = torch.zeros(3)
    for j in order[::-1]:
        other = other + value(j)
    assert not torch.equal(other, want)  # the order shows
    assert torch.equal(slabs.RunningSum((2,)).total(), torch.zeros(2))
