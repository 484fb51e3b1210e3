"""FLOPs of one update step from shapes (pure functions, no torch): GRPO and each OBLR-PO plan, and their ratio.

Counted as ``torch.utils.flop_counter`` counts them: 2 FLOPs per multiply-add of every matrix product
(``mm``/``bmm``) and of attention (``4 B H T^2 d`` forward, 2.5x that backward, the full ``T x T`` square,
``attn_factor`` scales it), nothing for elementwise, reduction, scatter or gather work (softmax, RMSNorm,
the per-row norm reductions, an embedding's backward). For a :class:`~oblr.memory_model.Shape` and a
micro-batch of ``batch`` sequences of ``tokens`` tokens (padded; rows form groups of ``group``; every row
counted at full length, as on a GPU: the one-pass engine's CPU-only token windows, which skip each row's
zero-gradient tokens, make its CPU count smaller):

- ``grpo``: forward, then one backward with activation and weight gradients (``~ 6 P T`` plus attention);
- ``grpo_ckpt``: the same plus one recomputation of every decoder layer in the backward, without the layer's
  last product (``down_proj``): torch's non-reentrant checkpoint stops recomputing once the tensors the
  backward needs exist;
- ``oblr`` (one-pass :class:`oblr.gradnorm.BookKeeper`, method ``auto``): forward, one backward with
  activation gradients only, then per trainable weight what the engine does with its (input ``x`` [T, C],
  output gradient ``g`` [T, R]) factors, decided as the engine decides (:func:`keep_dense`, :func:`use_ghost`
  mirror ``assembly.keep_dense``/``assembly.use_ghost``):

  * kept dense (per-row gradient no larger than its factors): one ``[R, T] x [T, C]`` product per row
    (``2 B T R C``), then ``w_i`` is a reduction and the weighted gradient a ``2 B R C`` regrouping;
  * otherwise ``w_i`` by ghost norm (Grams ``2 B E R`` and ``2 B E C``, the input's Gram shared by
    q/k/v and by gate/up; ``E = T^2`` on a GPU; ``strip_entries(T, "cpu")``, about ``5/8 T^2``, on CPU, where
    the engine forms each Gram's lower-triangle strips)
    or by materialisation (``2 B T R C``), whichever the engine's cost model picks,
    and the weighted gradient with the group norms as one product per group (``2 B T R C``);
  * norm weights are reduced rows (``2 B n`` for the regrouping); a tied embedding's entry holds the
    ``lm_head`` factors and the embedding's token ids (no FLOPs for the ids' side);

- ``oblr_ckpt`` (two-pass :class:`oblr.gradnorm.TwoPassBookKeeper`): forward; norm pass = recomputation of
  every layer in full (the engine's taps save each layer's input, so nothing stops early) + activation
  gradients + per weight a per-group Gram of its per-row gradients (:func:`use_ghost_groups` mirrors
  ``gram._use_ghost``: ghost ``2 K (G T)^2 (R + C)``, or materialised rows ``2 B T R C`` and ``2 B G R C``);
  gradient pass = another full recomputation + an ordinary backward;
- ``oblr_recompute`` (:class:`oblr.gradnorm.RecomputeBookKeeper`, checkpointing on): forward; one
  activation-gradient backward with every layer recomputed in full (the engine's taps save each layer's
  input, as in the two-pass norm pass); per weight what the one-pass engine does with its factors (above:
  kept dense, ghost or materialised, then the weighted gradient with the group norms) -- ``oblr`` plus one
  full recomputation. No gradient pass.

Step time is predicted as proportional to FLOPs. That holds where matrix products dominate and run at one
efficiency; it ignores memory-bound work (log-softmax over the vocabulary, the per-row reductions, scatters),
per-call overheads, and kernel efficiency that differs with matrix shape (``benchmarks/flop_ratios.py``
compares the prediction with the CPU measurements).
"""

from __future__ import annotations

from .memory_model import KEEP_DENSE_SLACK, PLANS, QWEN3, Shape, keep_dense  # noqa: F401 -- re-exported
from .memory_model import linears as _linears

#: mirrors of ``oblr.gradnorm.contrib.MEMORY_COST`` and ``oblr.gradnorm.strips.GRAM_STRIPS`` and ``MIN_STRIP`` (tests
#: check they agree; ``KEEP_DENSE_SLACK`` and ``keep_dense``, the mirror of ``assembly.keep_dense``, are
#: :mod:`oblr.memory_model`'s)
MEMORY_COST = 8
GRAM_STRIPS = 16
MIN_STRIP = 48


def strip_entries(T: int, device: str) -> int:
    """``strips.strip_entries``: entries of a symmetric ``[T, T]`` Gram formed as lower-triangle strips on
    ``device``'s type (CPU; one full product, ``T^2``, elsewhere)."""
    if device != "cpu":
        return T * T
    w = max(MIN_STRIP, -(-T // GRAM_STRIPS))
    return sum((T - s) * min(w, T - s) for s in range(0, T, w))


def _norm_sizes(s: Shape) -> list[int]:
    """Norm weights' sizes: per layer q_norm, k_norm, input and post-attention norms; then the final norm."""
    return [s.head_dim, s.head_dim, s.hidden, s.hidden] * s.layers + [s.hidden]


def use_ghost(contribs: list[tuple[int, int, bool]], T: int, device: str = "cuda") -> bool:
    """``assembly.use_ghost`` for Outer contributions ``(R, C, is_index)`` of one parameter, ``T`` tokens."""
    ghost = sum((strip_entries(T, device) if i == j else T * T) * ((1 if ai or bi else ar) + ac + MEMORY_COST)
                for i, (ar, ac, ai) in enumerate(contribs) for j, (_, _, bi) in enumerate(contribs))
    mat = sum(T * c * (1 if ix else r) + MEMORY_COST * r * c for r, c, ix in contribs)
    return ghost < mat


def use_ghost_groups(contribs: list[tuple[int, int, bool]], T: int, M: int) -> bool:
    """``gram._use_ghost`` (method auto) for groups of ``M`` rows of ``T`` tokens."""
    ghost = sum((M * T) ** 2 * ((1 if ai or bi else ar) + ac + MEMORY_COST)
                for ar, ac, ai in contribs for _, _, bi in contribs)
    mat = sum(M * (T * c * (1 if ix else r) + MEMORY_COST * r * c) for r, c, ix in contribs)
    R, C = contribs[0][0], contribs[0][1]
    return ghost < mat + M * M * R * C


def _check(s: Shape, plan: str, batch: int, tokens: int, group: int) -> None:
    if plan not in PLANS:
        raise ValueError(f"unknown plan {plan!r}; known: {', '.join(PLANS)}")
    if batch < 1 or tokens < 2 or group < 1 or batch % group:
        raise ValueError(f"need batch >= 1, tokens >= 2 and group >= 1 dividing batch; got batch={batch}, "
                         f"tokens={tokens}, group={group}")


def _products(s: Shape) -> int:
    """Multiply-adds per token of every weight product (layers and ``lm_head``)."""
    return s.layers * sum(r * c for _, r, c, _ in _linears(s)) + s.vocab * s.hidden


def attention_forward(s: Shape, batch: int, tokens: int, attn_factor: float = 1.0) -> float:
    """All layers' attention forward: ``q k^T`` and ``p v``, ``4 B H T^2 d`` per layer."""
    return attn_factor * 4 * s.layers * batch * s.heads * tokens * tokens * s.head_dim


def _one_pass_norms(s: Shape, B: int, T: int, factor_bytes: int, device: str) -> tuple[int, int]:
    """(w_i work, weighted-gradient + group-norm work) of the one-pass engine under ``auto``."""
    norms = assembly = 0
    E = strip_entries(T, device)  # a parameter's own Grams: lower-triangle strips on CPU, whole elsewhere
    cached = None  # GramCache: the last input whose Gram was formed
    # the embedding entry comes first (tied: lm_head's factors and the ids; untied: the ids alone)
    h, V = s.hidden, s.vocab
    if s.tied:
        if keep_dense(V, h, T, factor_bytes):
            norms += 2 * B * T * V * h  # lm_head's part materialised once; the ids' part is a scatter into it
            assembly += 2 * B * V * h
        else:
            c = [(V, h, False), (V, h, True)]
            if use_ghost(c, T, device):  # (head, head): left and right Grams; (head, ids), (ids, ids): right Grams
                norms += 2 * B * E * V + 2 * 2 * B * E * h + 2 * B * T * T * h
                cached = "emb_out"
            else:
                norms += 2 * B * T * V * h
            assembly += 2 * B * T * V * h
    else:
        if keep_dense(V, h, T, factor_bytes, index=True):
            assembly += 2 * B * V * h
        else:
            if use_ghost([(V, h, True)], T, device):
                norms += 2 * B * E * h
                cached = "emb_out"
    for layer in range(s.layers):
        for _, R, C, key in _linears(s):
            if keep_dense(R, C, T, factor_bytes):
                norms += 2 * B * T * R * C
                assembly += 2 * B * R * C
                continue
            if use_ghost([(R, C, False)], T, device):
                norms += 2 * B * E * R
                if cached != (layer, key):
                    norms += 2 * B * E * C
                    cached = (layer, key)
            else:
                norms += 2 * B * T * R * C
            assembly += 2 * B * T * R * C
    assembly += sum(2 * B * n for n in _norm_sizes(s))
    if not s.tied:  # lm_head's own entry comes last (after the final norm)
        if keep_dense(V, h, T, factor_bytes):
            norms += 2 * B * T * V * h
            assembly += 2 * B * V * h
        else:
            if use_ghost([(V, h, False)], T, device):
                norms += 2 * B * E * V + 2 * B * E * h  # its input (the final norm's output) is new
            else:
                norms += 2 * B * T * V * h
            assembly += 2 * B * T * V * h
    return norms, assembly


def _group_gram(contribs: list[tuple[int, int, bool]], B: int, T: int, M: int) -> int:
    """FLOPs of ``gram.group_gram`` for one parameter's contributions, groups of ``M`` rows."""
    K = B // M
    R, C = contribs[0][0], contribs[0][1]
    if use_ghost_groups(contribs, T, M):
        out = 0
        for i, (ar, ac, ai) in enumerate(contribs):
            for br, bc, bi in contribs[i:]:
                out += 2 * K * (M * T) ** 2 * ac + (0 if ai or bi else 2 * K * (M * T) ** 2 * ar)
        return out
    return sum(0 if ix else 2 * B * T * r * c for r, c, ix in contribs) + 2 * B * M * R * C


def _two_pass_grams(s: Shape, B: int, T: int, M: int) -> int:
    h, V = s.hidden, s.vocab
    out = _group_gram([(V, h, False), (V, h, True)] if s.tied else [(V, h, True)], B, T, M)
    if not s.tied:
        out += _group_gram([(V, h, False)], B, T, M)
    out += s.layers * sum(_group_gram([(R, C, False)], B, T, M) for _, R, C, _ in _linears(s))
    out += sum(2 * B * M * n for n in _norm_sizes(s))
    return out


def step_flops(s: Shape, plan: str, batch: int, tokens: int, group: int | None = None, *,
               attn_factor: float = 1.0, factor_bytes: int = 4, device: str = "cuda") -> dict[str, float]:
    """FLOPs of one step of ``plan`` on one micro-batch, by part: ``forward``, ``backward`` (activation
    and, where formed by autograd, weight gradients), ``recompute`` (checkpointed plans), ``norms`` (the
    engine's per-row norm work), ``assembly`` (weighted gradient and group norms). ``group``: rows per
    prompt group (default: the whole micro-batch); ``factor_bytes``: element size of the activations the
    one-pass engine keeps (its keep-dense rule compares bytes: 4 float32, 2 bf16); ``device``: the device type
    the step runs on (``cpu``: a parameter's own Grams as strips, :func:`strip_entries`; default ``cuda``)."""
    group = batch if group is None else group
    _check(s, plan, batch, tokens, group)
    B, T = batch, tokens
    lin = 2 * B * T * _products(s)
    layer_lin = 2 * B * T * s.layers * sum(r * c for _, r, c, _ in _linears(s))
    head = 2 * B * T * s.vocab * s.hidden
    att = attention_forward(s, B, T, attn_factor)
    out = {"forward": lin + att, "backward": 0.0, "recompute": 0.0, "norms": 0.0, "assembly": 0.0}
    if plan == "grpo":
        out["backward"] = 2 * lin + 2.5 * att
    elif plan == "grpo_ckpt":
        out["backward"] = 2 * lin + 2.5 * att
        out["recompute"] = layer_lin - 2 * B * T * s.layers * s.hidden * s.intermediate + att
    elif plan in ("oblr", "oblr_recompute"):
        out["backward"] = lin + 2.5 * att
        out["norms"], out["assembly"] = _one_pass_norms(s, B, T, factor_bytes, device)
        if plan == "oblr_recompute":
            out["recompute"] = layer_lin + att
    else:  # oblr_ckpt: norm pass (head dX, layers dX) + gradient pass (head dW+dX, layers dW+dX)
        out["backward"] = (head + layer_lin + 2.5 * att) + (2 * head + 2 * layer_lin + 2.5 * att)
        out["recompute"] = 2 * (layer_lin + att)
        out["norms"] = _two_pass_grams(s, B, T, group)
    return out


def total_flops(s: Shape, plan: str, batch: int, tokens: int, group: int | None = None, **kw) -> float:
    """Sum of :func:`step_flops`."""
    return sum(step_flops(s, plan, batch, tokens, group, **kw).values())


def time_ratio(s: Shape, plan: str, batch: int, tokens: int, group: int | None = None, base: str = "grpo",
               **kw) -> float:
    """Predicted step-time ratio ``plan / base`` (FLOPs over FLOPs) for the same micro-batch."""
    return total_flops(s, plan, batch, tokens, group, **kw) / total_flops(s, base, batch, tokens, group, **kw)
