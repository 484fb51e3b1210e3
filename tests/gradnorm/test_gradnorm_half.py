"""Half-precision models (bfloat16, float16) in the exact-norm engines: the one-pass, two-pass and recompute
engines' per-row squared norms against a float64 sum over one autograd backward per row of the same half model,
and the engines' float32 sums checked on a layer whose exact per-row gradient is a token count that the half
dtype cannot hold (any half-precision accumulation or rounding of the sums shows as a wrong number)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama, tiny_qwen3
from gradnorm_helpers import checkpointed, make_batch
from torch import nn

from oblr.gradnorm import BookKeeper, RecomputeBookKeeper, TwoPassBookKeeper, loop_per_sequence_grads
from oblr.logprobs import chunked_response_logprobs, sequence_logprobs, token_logprobs

HALF = [torch.bfloat16, torch.float16]
#: unit roundoff of each dtype (2^-p, p significant bits: 8 for bfloat16, 11 for float16)
UNIT = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
ENGINES = {"one_pass": BookKeeper, "two_pass": TwoPassBookKeeper, "recompute": RecomputeBookKeeper}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs()).max())


#: the group norms' coefficients (positive) and groups
COEFFS, GROUPS = torch.linspace(0.5, 1.5, 5), torch.tensor([0, 0, 1, 1, 1])


def _loop_reference(model, ids, am, rm) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_i, ||sum_{i in k} c_i s_i||^2) from one autograd backward per row of the half model: its per-row gradients
    (in the model's dtype, exactly representable in float32) squared, weighted and summed in float64."""
    grads = loop_per_sequence_grads(model, ids, am, rm)
    w = torch.stack([sum(g.double().pow(2).sum() for g in row) for row in grads])
    gk = []
    for k in GROUPS.unique().tolist():
        rows = [i for i in range(len(grads)) if int(GROUPS[i]) == k]
        gk.append(sum(sum(float(COEFFS[i]) * grads[i][j].double() for i in rows).pow(2).sum()
                      for j in range(len(grads[0]))))
    return w, torch.stack(gk)


def _norms(cls, model, ids, am, rm, method, chunk=0) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_i, group norms) from one engine; the group norms as oblr.update takes them, with the weighted gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    book = cls(model, method=method)
    with book.record():
        if chunk:
            seq = sequence_logprobs(chunked_response_logprobs(model, ids, am, rm, chunk=chunk)[0], rm)
        else:
            seq = sequence_logprobs(token_logprobs(model, ids, am), rm)
        book.backward(seq, group_ids=GROUPS)
    w = book.sq_norms()
    gk = book.accumulate_grad_with_group_norms(COEFFS, GROUPS)
    book.clear()
    assert w.dtype == gk.dtype == torch.float32
    assert all(p.grad.dtype == p.dtype for p in params)
    return w, gk


@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("arch", ["qwen3_tied", "llama_biases"])
def test_half_model_norms_match_the_loop_in_every_engine(dtype, arch):
    """Tolerance 2u (u = 2^-8 bf16, 2^-11 fp16): the reference's per-row gradients are autograd's, in the model's
    dtype, i.e. each element rounded once from the float32-accumulated product (relative error at most u), so their
    squared norm is within about (2u + u^2) of the one the engines form in float32 from the same half-precision
    activations and output gradients (measured when written: 4.8e-4 bf16, 5.1e-5 fp16, i.e. u/8 and u/10); the
    group norms of positive coefficients carry the same rounding (measured 3.5e-4, 3.2e-5).
    The engines and their methods do the same float32 sums in different orders (ghost Grams, per-row
    gradients, Grams of per-row gradients), so they agree with each other to float32 precision (1e-5)."""
    model = (tiny_qwen3(seed=3) if arch == "qwen3_tied" else tiny_llama()).to(dtype)
    ids, am, rm = make_batch(model.config.vocab_size, [3, 4, 2, 5, 3], [5, 2, 6, 4, 3], seed=2)
    ref, ref_g = _loop_reference(model, ids, am, rm)
    assert (ref > 0).all()
    got = {("one_pass", m): _norms(BookKeeper, model, ids, am, rm, m) for m in ("auto", "ghost", "materialize")}
    checkpointed(model)  # the same weights: the two checkpointed engines recompute the same half activations
    assert torch.equal(_loop_reference(model, ids, am, rm)[0], ref)
    for name in ("two_pass", "recompute"):
        for m in ("auto", "ghost", "materialize"):
            got[(name, m)] = _norms(ENGINES[name], model, ids, am, rm, m)
        if arch == "qwen3_tied":  # the output layer in chunks: its per-row sum over the chunks' calls
            got[(name, "chunked")] = _norms(ENGINES[name], model, ids, am, rm, "auto", chunk=3)
    first, first_g = got[("one_pass", "auto")]
    for key, (w, gk) in got.items():
        assert _rel(w, ref) < 2 * UNIT[dtype], key
        assert _rel(gk, ref_g) < 2 * UNIT[dtype], key
        assert _rel(w, first) < 1e-5 and _rel(gk, first_g) < 1e-5, key


class _OnesLayer(nn.Module):
    """One half-precision ``Linear(C, R)`` applied to all-ones inputs ``[B, T, C]``, whole or ``chunk`` tokens per
    call (a module called several times, like a chunked output layer)."""

    def __init__(self, R: int, C: int, dtype: torch.dtype, chunk: int = 0):
        super().__init__()
        self.lin = nn.Linear(C, R, bias=False).to(dtype)
        self.chunk = chunk

    def forward(self, x):
        if not self.chunk:
            return self.lin(x)
        return torch.cat([self.lin(x[:, s:s + self.chunk]) for s in range(0, x.shape[1], self.chunk)], 1)


#: per-row token counts a half dtype cannot hold (257 and 259 need 9 significant bits, bfloat16 has 8;
#: 2049 and 2051 need 12, float16 has 11): a per-row gradient rounded to it is off by 1 in 257 (2049)
COUNTS = {torch.bfloat16: (257, 259), torch.float16: (2049, 2051)}


@pytest.mark.parametrize("chunk", [0, 64], ids=["one_call", "chunked"])
@pytest.mark.parametrize("method", ["auto", "ghost", "materialize"])
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
def test_norm_sums_are_float32_where_half_precision_would_round(dtype, engine, method, chunk):
    """By hand: x = 1 on every token, and row i's objective sums its layer outputs over its first n_i tokens, so
    every output gradient is 1 there and 0 after, the per-row gradient is n_i in every one of the R x C elements,
    w_i = R C n_i^2, and the one group of both rows with coefficients 1 has ||s_1 + s_2||^2 = R C (n_1 + n_2)^2.
    With n_i not representable in the model's dtype, a gradient, Gram or sum formed or accumulated in that dtype
    comes out wrong by at least 1/n_i (0.4 % bf16, 0.05 % fp16; here 2049 -> 2048, 257 -> 256) where float32 is
    exact. The weighted gradient itself lands in the parameter's dtype: n_1 + n_2 rounded once."""
    R, C = 2, 3
    n = COUNTS[dtype]
    T = max(n)
    model = _OnesLayer(R, C, dtype, chunk)
    x = torch.ones(len(n), T, C, dtype=dtype)
    mask = (torch.arange(T)[None, :] < torch.tensor(n)[:, None]).float()
    gid = torch.zeros(len(n), dtype=torch.long)
    ones = torch.ones(len(n))
    model.lin.weight.grad = None
    book = ENGINES[engine](model, method=method)
    with book.record():
        y = model(x)
        book.backward((y.float() * mask[..., None]).sum((1, 2)), group_ids=gid)
    w = book.sq_norms()
    gk = book.accumulate_grad_with_group_norms(ones, gid)
    book.clear()
    want_w = torch.tensor([R * C * k * k for k in n], dtype=torch.float64)
    want_g = torch.tensor([R * C * sum(n) ** 2], dtype=torch.float64)
    assert w.dtype == gk.dtype == torch.float32
    assert _rel(w, want_w) < 1e-6, (w.tolist(), want_w.tolist())
    assert _rel(gk, want_g) < 1e-6, (gk.tolist(), want_g.tolist())
    g = model.lin.weight.grad
    assert g.dtype == dtype and torch.equal(g, torch.full((R, C), float(sum(n))).to(dtype))
