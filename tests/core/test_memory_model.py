"""oblr.memory_model on hand-computable shapes, and benchmarks/memory.py's measure-vs-predict machinery."""

import sys
from pathlib import Path

import pytest

from oblr import memory_model as mm

TINY = mm.Shape(layers=2, hidden=8, intermediate=24, heads=2, kv_heads=1, head_dim=4, vocab=10, tied=True)


def test_param_count_by_hand():
    # layer: q 8*8 + k,v 2*8*4 + o 8*8 + mlp 3*8*24 + norms 2*8 + q/k norm 2*4 = 64+64+64+576+16+8 = 792
    assert mm.layer_params(TINY) == 792
    assert mm.n_params(TINY) == 10 * 8 + 2 * 792 + 8
    untied = mm.Shape(2, 8, 24, 2, 1, 4, 10, False)
    assert mm.n_params(untied) == mm.n_params(TINY) + 80


def test_activation_counts_by_hand():
    # h=8, q=8, kv=4, I=24
    assert mm.act_per_token_layer(TINY, "grpo") == 6 * 8 + 7 * 8 + 6 * 4 + 4 * 24 == 224
    assert mm.act_per_token_layer(TINY, "oblr") == 10 * 8 + 5 * 8 + 4 * 4 + 4 * 24 == 232
    assert mm.act_per_token_layer(TINY, "oblr_ckpt") == 8
    # 3 sequences of 5 tokens, 2 bytes: 3*5*(2*224 + 4*8 + 5)*2 (the last: the [B, 1, T, T] attention mask)
    assert mm.activation_bytes(TINY, "grpo", 3, 5, act_bytes=2) == 3 * 5 * 485 * 2


def test_step_peak_by_hand():
    b, t, P = 3, 5, mm.n_params(TINY)
    logits = 15 * 10 * 4  # one B*T*V float32 tensor
    # GRPO: activations 15 tokens * 485 elements * 4 bytes + 5 logit-sized tensors + lm_head's gradient (V*h)
    grpo = 15 * 485 * 4 + 5 * logits + 80 * 4
    assert mm.step_peak_bytes(TINY, "grpo", b, t) == grpo
    # one pass: 15 * (2*232 + 32 + 5) * 4 + 4 logit-sized tensors, no gradient at the peak
    assert mm.step_peak_bytes(TINY, "oblr", b, t) == 15 * 501 * 4 + 4 * logits
    # checkpointed: layer inputs 2*8 + 4*8 outside + the mask; then max(5 logits + head grad, one layer 224 + grads)
    kept = 15 * 53 * 4
    ckpt = kept + max(5 * logits + 80 * 4, 15 * 224 * 4 + P * 4)
    assert mm.step_peak_bytes(TINY, "grpo_ckpt", b, t) == ckpt
    # two-pass norm pass: 4 logit-sized tensors (tied) + one recomputed layer
    assert mm.phase_bytes(TINY, "oblr_ckpt", b, t)["norm_pass"] == 4 * logits + 15 * 224 * 4
    assert mm.step_peak_bytes(TINY, "oblr_ckpt", b, t) == kept + max(ckpt - kept, 4 * logits + 15 * 224 * 4)
    sharded = mm.phase_bytes(TINY, "grpo_ckpt", b, t, grad_shards=8)["recompute"]
    assert sharded == 15 * 224 * 4 + P * 4 // 8


def test_micro_batch_and_budget():
    s = mm.QWEN3["Qwen3-4B"]
    per = mm.per_sequence_bytes(s, "grpo", 1024)
    budget = mm.resident_bytes(s) + 3.5 * per
    assert mm.max_micro_batch(s, "grpo", 1024, budget) == 3
    assert mm.max_micro_batch(s, "grpo", 1024, mm.resident_bytes(s) - 1) == 0
    # checkpointing keeps less per sequence; the two one-pass/GRPO layer counts differ by 4h - 2q - 2kv
    assert mm.per_sequence_bytes(s, "grpo_ckpt", 4096) < mm.per_sequence_bytes(s, "grpo", 4096)
    diff = mm.per_sequence_bytes(s, "oblr", 4096) - mm.per_sequence_bytes(s, "grpo", 4096)
    layer = 4 * 2560 - 2 * 4096 - 2 * 1024
    assert diff == 4096 * 36 * layer * 2 - 4096 * 151936 * 4


def test_qwen3_param_counts_match_published_sizes():
    # published totals: 0.6B (0.60B with embeddings), 1.7B, 4.0B, 8.2B
    got = {k: mm.n_params(s) / 1e9 for k, s in mm.QWEN3.items()}
    assert got["Qwen3-0.6B"] == pytest.approx(0.60, abs=0.02)
    assert got["Qwen3-1.7B"] == pytest.approx(1.72, abs=0.03)
    assert got["Qwen3-4B"] == pytest.approx(4.02, abs=0.03)
    assert got["Qwen3-8B"] == pytest.approx(8.19, abs=0.03)


def test_bad_input_one_line():
    with pytest.raises(ValueError, match="unknown plan 'nope'"):
        mm.step_peak_bytes(TINY, "nope", 1, 4)
    with pytest.raises(ValueError, match="batch >= 1"):
        mm.step_peak_bytes(TINY, "grpo", 0, 4)
    with pytest.raises(ValueError, match="Shape.hidden"):
        mm.Shape(2, 0, 24, 2, 1, 4, 10, True)


def test_quick_machinery_measures_within_band():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import memory

    rows = memory.measure(memory.case_of(64, 2, 128, vocab=1024))
    assert {r["plan"] for r in rows} == set(mm.PLANS)
    for r in rows:
        assert r["measured"] > 0 and 0.8 <= r["ratio"] <= 1.2, (r["plan"], r["ratio"])
    table = memory.measured_table(rows)
    assert "measured/predicted" in table and table.count("\n") == 1 + len(rows)


def test_chunked_output_layer_terms():
    """model.logit_chunk_tokens: logit-sized tensors over one chunk; the two-pass norm pass holds the per-row
    sum of the output layer's gradient (not with a frozen output layer) and the larger of one chunk's four
    logit-sized tensors and one recomputed layer; a chunk at least as long as the sequence changes nothing."""
    s, b, t, c = mm.QWEN3["Qwen3-4B"], 8, 4352, 512
    assert mm.logits_bytes(s, "grpo_ckpt", b, t, c) == 5 * b * c * s.vocab * 4
    assert mm.logits_bytes(s, "grpo_ckpt", b, t, t) == mm.logits_bytes(s, "grpo_ckpt", b, t)  # one chunk
    ph = mm.phase_bytes(s, "oblr_ckpt", b, t, 2, 2, 1, c)
    rec = mm.recompute_bytes(s, b, t, 2)
    assert ph["norm_pass"] == b * s.vocab * s.hidden * 4 + max(4 * b * c * s.vocab * 4, rec)
    frozen = mm.phase_bytes(s, "oblr_ckpt", b, t, 2, 2, 1, c, head_trainable=False)
    assert frozen["norm_pass"] == max(4 * b * c * s.vocab * 4, rec)
    whole = mm.step_peak_bytes(s, "oblr_ckpt", b, t, 2, 2)
    assert mm.step_peak_bytes(s, "oblr_ckpt", b, t, 2, 2, logit_chunk=c) < whole / 2
    assert mm.max_micro_batch(s, "oblr_ckpt", 4096, 80e9, logit_chunk=c) > mm.max_micro_batch(s, "oblr_ckpt", 4096, 80e9)


def test_chunked_rows_measure_within_band():
    """benchmarks/memory.py's chunked methods against the model on a small case with several chunks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import memory

    rows = memory.measure(memory.case_of(128, 2, 512, vocab=4096), list(memory.CHUNK_PLANS))
    assert {r["plan"] for r in rows} == {"grpo"} | set(memory.CHUNK_PLANS)
    for r in rows:
        assert r["measured"] > 0 and 0.8 <= r["ratio"] <= 1.25, (r["plan"], r["ratio"])
