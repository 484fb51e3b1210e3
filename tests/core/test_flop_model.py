"""oblr.flop_model against torch's FLOP counter on real steps of tiny Qwen3 models, and its limit properties."""

import sys
from pathlib import Path

import pytest
import torch

from oblr import flop_model as fm
from oblr import memory_model as mm

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

# relative tolerance of predicted vs counted FLOPs: the model leaves out a few tiny products of the estimator
# and of group_sq_norms' einsum (tens of FLOPs in 1e7..1e8)
TOL = 1e-5


class _NoModuleTracker:
    """FlopCounterMode's per-module tracker installs backward hooks that refuse ``autograd.grad(inputs=...)``
    (the engines' backward); counting under the "Global" key alone needs no tracker."""

    parents = ("Global",)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _counter(track_modules: bool):
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    fc = FlopCounterMode(display=False)
    aten = torch.ops.aten
    # the CPU flash-attention kernel has no formula registered; it computes what the GPU kernels do
    fc.flop_registry[aten._scaled_dot_product_flash_attention_for_cpu] = \
        flop_registry[aten._scaled_dot_product_flash_attention]
    fc.flop_registry[aten._scaled_dot_product_flash_attention_for_cpu_backward] = \
        flop_registry[aten._scaled_dot_product_flash_attention_backward]
    if not track_modules:
        fc.mod_tracker = _NoModuleTracker()
    return fc


def _counted(case, plans):
    from step_methods import Ctx, build_batch, build_model, methods

    torch.manual_seed(0)
    model = build_model(case)
    batch, rewards = build_batch(case)
    ctx = Ctx(model, batch, rewards, max_len=case.response_len, micro_batch_groups=case.micro_batch_groups)
    ms = {m.name: m for m in methods()}
    out = {}
    for plan in plans:
        m = ms[plan]
        if m.setup:
            m.setup(ctx)
        try:
            for p in ctx.params():
                p.grad = None
            fc = _counter(track_modules=plan == "grpo")  # GRPO: FlopCounterMode exactly as shipped
            with fc:
                m.fn(ctx)
            out[plan] = fc.get_total_flops()
        finally:
            if m.teardown:
                m.teardown(ctx)
    return out


def _shape(case) -> mm.Shape:
    return mm.Shape(case.layers, case.hidden, 3 * case.hidden, case.heads, case.kv_heads,
                    case.hidden // case.heads, case.vocab, case.tied)


CASES = [
    # T < hidden-ish: ghost Grams for the MLP and the tied head, q/k/v/o kept dense
    dict(hidden=64, layers=2, vocab=512, prompt_len=8, response_len=24, n_prompts=2, group_size=2),
    # untied head and embedding, longer than wide: nearly everything kept dense; groups of 4
    dict(hidden=32, layers=2, vocab=256, prompt_len=8, response_len=56, n_prompts=2, group_size=4, tied=False),
    # short and wide, micro-batches of one group: ghost everywhere in the one pass
    dict(hidden=128, layers=1, vocab=1024, prompt_len=4, response_len=12, n_prompts=2, group_size=2,
         micro_batch_groups=1),
]


@pytest.mark.parametrize("kw", CASES, ids=["tied-ghost-mlp", "untied-dense", "wide-short-microbatch"])
def test_flops_match_torch_counter(kw, monkeypatch):
    from step_methods import Case

    from oblr.gradnorm import windows

    # the model counts full-length rows, as on a GPU: the one-pass engine's CPU-only token windows (each row's
    # zero-gradient tokens skipped, windows.token_windows) are switched off here
    monkeypatch.setattr(windows, "TRIM_MIN_FRACTION", 2.0)
    case = Case(**kw)
    counted = _counted(case, mm.PLANS)
    s, B, T = _shape(case), case.n_prompts * case.group_size, case.prompt_len + case.response_len
    for plan in mm.PLANS:
        pred = fm.total_flops(s, plan, B, T, case.group_size, device="cpu")
        assert abs(pred - counted[plan]) <= TOL * counted[plan], (plan, pred, counted[plan])
    # GRPO is forward + a backward of twice the products: the ~6 P T rule plus attention, exactly
    P_prod = fm._products(s)
    assert counted["grpo"] == 6 * B * T * P_prod + 3.5 * fm.attention_forward(s, B, T)


def test_mirrored_constants_and_decisions_agree_with_the_engine():
    from oblr.gradnorm import assembly, contrib, strips
    from oblr.gradnorm.contrib import Outer

    assert fm.KEEP_DENSE_SLACK == assembly.KEEP_DENSE_SLACK and fm.MEMORY_COST == contrib.MEMORY_COST
    assert (fm.GRAM_STRIPS, fm.MIN_STRIP) == (strips.GRAM_STRIPS, strips.MIN_STRIP)
    for T in (1, 2, 15, 16, 17, 31, 33, 64, 65, 100, 160, 1024):
        for dev in ("cpu", "cuda"):
            assert fm.strip_entries(T, dev) == strips.strip_entries(T, dev)
        assert fm.strip_entries(T, "cuda") == T * T
    for T in (2, 7, 16, 40):
        for R in (3, 16, 50):
            for C in (4, 16, 33):
                for dtype, nbytes in ((torch.float32, 4), (torch.bfloat16, 2)):
                    o = Outer(torch.zeros(1, T, R, dtype=dtype), torch.zeros(1, T, C, dtype=dtype), (R, C))
                    assert fm.keep_dense(R, C, T, nbytes) == assembly.keep_dense(o)
                    ids = Outer(torch.zeros(1, T, dtype=torch.long), torch.zeros(1, T, C, dtype=dtype), (R, C))
                    assert fm.keep_dense(R, C, T, nbytes, index=True) == assembly.keep_dense(ids)
                o = Outer(torch.zeros(1, T, R), torch.zeros(1, T, C), (R, C))
                ids = Outer(torch.zeros(1, T, dtype=torch.long), torch.zeros(1, T, C), (R, C))
                assert fm.use_ghost([(R, C, False)], T, "cpu") == assembly.use_ghost([o], "auto")
                assert fm.use_ghost([(R, C, False), (R, C, True)], T, "cpu") == assembly.use_ghost([o, ids], "auto")
                # any other device (meta here, as CUDA): whole Grams, no strips
                om = Outer(torch.zeros(1, T, R, device="meta"), torch.zeros(1, T, C, device="meta"), (R, C))
                idm = Outer(torch.zeros(1, T, dtype=torch.long, device="meta"), torch.zeros(1, T, C, device="meta"), (R, C))
                assert fm.use_ghost([(R, C, False)], T, "cuda") == assembly.use_ghost([om], "auto")
                assert fm.use_ghost([(R, C, False), (R, C, True)], T, "cuda") == assembly.use_ghost([om, idm], "auto")


def test_micro_batching_and_batch_size_do_not_change_the_ratio():
    s = mm.QWEN3["Qwen3-0.6B"]
    for plan in mm.PLANS:
        one = fm.total_flops(s, plan, 4, 512, 4)
        assert fm.total_flops(s, plan, 16, 512, 4) == pytest.approx(4 * one, rel=1e-12)


def test_one_pass_bounds_and_long_sequence_limit():
    # never more than GRPO plus one more pass of every weight product (the engine picks the cheaper way)
    for h, T in ((64, 8), (64, 512), (512, 64), (1024, 1024), (2560, 300)):
        s = mm.Shape(4, h, 3 * h, 8, 4, h // 8, 4096, True)
        grpo = fm.total_flops(s, "grpo", 8, T, 8)
        oblr = fm.total_flops(s, "oblr", 8, T, 8)
        assert grpo - 2 * 8 * T * fm._products(s) < oblr <= grpo + 2 * 8 * T * fm._products(s)
    # long responses: every per-row gradient is kept dense, the norms cost what GRPO's weight gradient costs,
    # and the excess over GRPO (the dense regrouping, 2 B R C per weight) falls like 1/T
    s = mm.QWEN3["Qwen3-4B"]
    ratios = [fm.time_ratio(s, "oblr", 8, T, 8, factor_bytes=2) for T in (16384, 32768, 65536)]
    assert ratios[0] > ratios[1] > ratios[2] > 1.0 and ratios[2] - 1 < 1e-3


def test_checkpointed_plans():
    for name, s in mm.QWEN3.items():
        for T in (256, 1024, 8192):
            grpo, gck = fm.total_flops(s, "grpo", 8, T, 8), fm.total_flops(s, "grpo_ckpt", 8, T, 8)
            ock = fm.total_flops(s, "oblr_ckpt", 8, T, 8)
            assert grpo < gck < 4 / 3 * grpo + 1, name  # at most one more forward
            # the two-pass engine: one more recomputation and one activation-only backward than grpo_ckpt
            assert gck + fm.step_flops(s, "grpo", 8, T, 8)["forward"] < ock < 2 * gck, name
            # the recompute engine: the one-pass engine's count plus one full recomputation of every layer
            # (forward minus the output layer), between the checkpointed GRPO step and the two-pass one
            rec, one = fm.step_flops(s, "oblr_recompute", 8, T, 8), fm.step_flops(s, "oblr", 8, T, 8)
            fwd = fm.step_flops(s, "grpo", 8, T, 8)["forward"]
            assert rec["recompute"] == fwd - 2 * 8 * T * s.vocab * s.hidden
            assert {k: v for k, v in rec.items() if k != "recompute"} == {k: v for k, v in one.items() if k != "recompute"}
            assert gck < sum(rec.values()) < ock, name


def test_bad_input():
    s = mm.QWEN3["Qwen3-0.6B"]
    with pytest.raises(ValueError, match="unknown plan 'nope'"):
        fm.step_flops(s, "nope", 4, 8)
    with pytest.raises(ValueError, match="group >= 1 dividing batch"):
        fm.step_flops(s, "oblr_ckpt", 6, 8, 4)
    with pytest.raises(ValueError, match="tokens >= 2"):
        fm.step_flops(s, "grpo", 4, 1)
