"""The memory plan (oblr.train.plan): the planner's choice on constructed shapes, its refusals, and short runs
of the built-in test-sized model with a budget (the plan's line, its summary entry, the same numbers)."""

from __future__ import annotations

import json
import math

import pytest
from signal_task import SIGNAL_TASK

from oblr import memory_model as mm
from oblr.cli import main
from oblr.config import load_config
from oblr.train.plan import (
    GB,
    MEMORY_PLANS,
    PlanError,
    apply_plan,
    choose_plan,
    optimizer_state_bytes,
    predicted_peak,
    resident,
    shape_from_hf_config,
)

S = mm.QWEN3["Qwen3-0.6B"]
# one rank, 4 prompt groups of G = 8, 1024 tokens, bf16, AdamW
RES = resident(S, param_bytes=2, optim_bytes=optimizer_state_bytes("adamw", 0.0, 2))
KW = dict(groups=4, group_size=8, tokens=1024, param_bytes=2, resident_bytes=RES)


def plan(budget_gb, exact=True, allowed=(False, True), **kw):
    return choose_plan(S, budget_bytes=budget_gb * GB, exact_norms=exact, allowed=allowed, **{**KW, **kw})


def peak(ckpt, groups, exact=True):
    return predicted_peak(S, exact_norms=exact, checkpointing=ckpt, sequences=8 * groups, tokens=1024,
                          param_bytes=2, resident_bytes=RES, split=groups < KW["groups"]) / GB


def test_the_constructed_case_orders_the_plans_as_the_tests_assume():
    # one pass > two pass per group here, and the budgets below sit between these peaks
    assert peak(False, 4) < 160 < peak(False, 8)
    assert peak(False, 2) < 110 and peak(False, 3) > 110 and peak(True, 4) < 110
    assert peak(True, 2) < 60 < peak(True, 3) and peak(False, 1) < 60 < peak(False, 2)
    assert peak(True, 1) < 35 < peak(False, 1)


@pytest.mark.parametrize("budget, engine, groups, micro", [
    (160, "one-pass", 4, 0),   # generous: one pass on the whole batch
    (110, "two-pass", 4, 0),   # the one pass would need 2 micro-batches, the two pass fits the whole batch
    (60, "two-pass", 2, 2),    # tighter: a smaller micro-batch
    (35, "two-pass", 1, 1),    # one group at a time; the one pass does not fit at all
])
def test_the_planner_prefers_the_whole_batch_then_no_checkpointing(budget, engine, groups, micro):
    p = plan(budget)
    assert (p.engine, p.groups, p.micro_batch_groups, p.sequences) == (engine, groups, micro, 8 * groups)
    assert p.checkpointing == (engine == "two-pass")
    assert p.peak_bytes <= budget * GB and p.peak_bytes == pytest.approx(peak(p.checkpointing, groups) * GB)
    assert p.line().startswith(f"plan: {engine}, micro-batch {groups} group")
    assert f"of {budget:g} per device" in p.line()


def test_a_budget_no_plan_meets_names_the_smallest_budget_the_planner_then_accepts():
    with pytest.raises(PlanError) as e:
        plan(20)
    msg = str(e.value)
    assert msg.startswith("config key 'algorithm.memory_budget_gb': no plan fits 20 GB per device")
    assert "\n" not in msg and "one-pass" in msg and "two-pass" in msg
    smallest = float(msg.rsplit("the smallest budget that works is ", 1)[1].split()[0])
    assert smallest == math.ceil(peak(True, 1) * 10) / 10  # the two pass at one group, rounded up to 0.1 GB
    p = plan(smallest)  # the property: the named budget is accepted ...
    assert (p.engine, p.groups) == ("two-pass", 1)
    with pytest.raises(PlanError, match="no plan fits"):  # ... and 0.1 GB less is not
        plan(smallest - 0.1)


def test_a_budget_below_the_resident_state_or_not_positive_is_refused():
    with pytest.raises(PlanError, match=r"3 GB per device .* is below the model's own resident size, 3\.58 GB"):
        plan(3)
    with pytest.raises(PlanError, match="must be > 0 GB, got 0"):
        plan(0)


def epeak(engine, groups, **kw):
    return predicted_peak(S, exact_norms=True, checkpointing=engine, sequences=8 * groups, tokens=1024,
                          param_bytes=2, resident_bytes=RES, split=groups < KW["groups"], **kw) / GB


@pytest.mark.parametrize("lora_rank", [0, 8])
def test_with_three_engines_the_largest_micro_batch_then_the_cheapest_engine(lora_rank):
    """Over budgets from the tightest to the most generous: the plan fits; no engine fits more groups; among
    those fitting as many, the chosen one comes first in one-pass, recompute, two-pass (fewest passes)."""
    engines = ("one_pass", "recompute", "two_pass")
    peaks = {e: [round(epeak(e, g, lora_rank=lora_rank) * GB) for g in range(1, 5)] for e in engines}
    budgets = sorted({p for ps in peaks.values() for p in ps})
    chosen = set()
    for b in budgets + [b + 10**8 for b in budgets]:
        p = choose_plan(S, budget_bytes=b, exact_norms=True, allowed=engines, lora_rank=lora_rank, **KW)
        fits = {e: max((g for g in range(1, 5) if peaks[e][g - 1] <= b), default=0) for e in engines}
        assert p.groups == max(fits.values()) and p.peak_bytes <= b
        want = next(e for e in engines if fits[e] == p.groups)
        assert p.engine == {"one_pass": "one-pass", "two_pass": "two-pass"}.get(want, want), (b, fits)
        assert p.checkpointing == (want != "one_pass")
        assert p.checkpointed_engine == (want if want != "one_pass" else "two_pass")
        chosen.add(want)
    # each engine is the answer somewhere on this shape; with LoRA the recompute engine keeps little (and the
    # other plans are priced for the full model's gradients), so it is never worse than the two-pass one
    assert chosen == ({"one_pass", "recompute"} if lora_rank else set(engines))


def test_lora_prices_the_recompute_engines_kept_gradients_for_the_adapters_only():
    full, lora = epeak("recompute", 1), epeak("recompute", 1, lora_rank=8)
    assert lora < full
    # the kept per-row gradients of a full fine-tuning are at least B x the decoder layers' weights in float32
    kept = mm.kept_bytes(S, 8, 1024, act_bytes=2)
    assert sum(kept.values()) >= 8 * 4 * S.layers * (mm.layer_params(S) - 2 * S.hidden - 2 * S.head_dim) * 0.5
    assert sum(mm.kept_bytes(S, 8, 1024, act_bytes=2, lora_rank=8).values()) < sum(kept.values()) / 100
    # targets the memory model does not know are priced as a full fine-tuning (conservative)
    assert epeak("recompute", 1, lora_rank=8, lora_targets=("mlp",)) == full


def test_one_engine_only_and_a_user_micro_batch_cap():
    assert plan(160, allowed=(True,)).engine == "two-pass"
    p = plan(110, allowed=(False,))
    assert (p.engine, p.groups, p.micro_batch_groups) == ("one-pass", 2, 2)
    p = plan(160, max_groups=3)  # the user's algorithm.micro_batch_groups is an upper bound
    assert (p.engine, p.groups, p.micro_batch_groups) == ("one-pass", 3, 3)
    with pytest.raises(PlanError, match=r"one-pass \d"):
        plan(35, allowed=(False,))


def test_without_exact_norms_only_the_micro_batch_is_chosen():
    p = plan(60, exact=False, allowed=(False,))
    assert not p.checkpointing and p.engine == "checkpointing off (no exact norms)"
    assert peak(False, p.groups, exact=False) <= 60 < peak(False, p.groups + 1, exact=False)
    assert plan(60, exact=False, allowed=(True,)).engine == "checkpointing on (no exact norms)"


def test_fsdp_shards_the_resident_state_per_rank():
    whole = resident(S, param_bytes=2, optim_bytes=4)
    sharded = resident(S, param_bytes=2, optim_bytes=4, world=8, sharded=True)
    gathered = (2 * mm.layer_params(S) + S.vocab * S.hidden) * 2
    assert sharded == mm.n_params(S) * 6 // 8 + gathered < whole == mm.n_params(S) * 6
    assert resident(S, param_bytes=2, optim_bytes=4, reference=True) == mm.n_params(S) * 8  # KL reference copy
    budget = (whole + sharded) / 2 / GB  # above the sharded state, below the whole one
    with pytest.raises(PlanError, match="below the model's own resident size"):
        plan(budget, groups=1, resident_bytes=whole)
    with pytest.raises(PlanError, match="no plan fits"):  # resident fits; a sequence of 1024 tokens does not
        plan(budget, groups=1, resident_bytes=sharded, world=8, sharded=True)


def test_the_shape_is_read_from_a_hugging_face_config():
    conf = {"num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}
    assert shape_from_hf_config(conf) == mm.QWEN3["Qwen3-4B"]
    llama = {**conf, "head_dim": None, "num_key_value_heads": None, "tie_word_embeddings": False}
    assert shape_from_hf_config(llama) == mm.Shape(36, 2560, 9728, 32, 32, 80, 151936, False)
    with pytest.raises(PlanError, match="lacks num_hidden_layers, hidden_size"):
        shape_from_hf_config({"n_layer": 12})


def test_the_registry_and_an_unset_budget():
    assert MEMORY_PLANS.names() == ["auto", "none", "one_pass", "recompute", "two_pass"]
    cfg = load_config(None, [])
    assert cfg.algorithm.memory_plan == "none" and cfg.algorithm.memory_budget_gb is None
    assert apply_plan(cfg, None) is cfg


def _hf_config():
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)


def _cfg(*extra):
    return load_config(None, ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=32",
                              *extra])


def test_plan_run_shards_the_resident_state_under_fsdp_and_may_choose_the_two_pass_engine():
    from oblr.train.plan import plan_run

    hf = _hf_config()
    shape = shape_from_hf_config(hf.to_dict())
    cfg = _cfg("distributed.strategy=fsdp", "algorithm.memory_plan=auto", "algorithm.memory_budget_gb=1")
    p = fsdp = plan_run(cfg, hf, prompt_len=16, world=2, device="cpu")
    assert (p.engine, p.groups, p.micro_batch_groups, p.tokens) == ("one-pass", 2, 0, 48)  # 4 prompts over 2 ranks
    assert p.resident_bytes == resident(shape, param_bytes=4, optim_bytes=8, world=2, sharded=True)
    p = plan_run(_cfg("distributed.strategy=ddp", "algorithm.memory_plan=auto", "algorithm.memory_budget_gb=1",
                      "algorithm.kl_coef=0.1", "model.dtype=bfloat16", "optim.optimizer=sgd"),
                 hf, prompt_len=16, world=2, device="cpu")
    assert p.resident_bytes == mm.n_params(shape) * 2 * 2  # bf16, the KL reference copy, plain SGD: no state
    # fsdp with checkpointing (the two-pass engine, FSDP2's own backward fills the sharded .grad) is a plan too
    two = plan_run(_cfg("distributed.strategy=fsdp", "algorithm.memory_plan=two_pass", "algorithm.memory_budget_gb=1"),
                   hf, prompt_len=16, world=2, device="cpu")
    assert (two.engine, two.checkpointing, two.groups) == ("two-pass", True, 2) and two.peak_bytes < fsdp.peak_bytes
    rec = plan_run(_cfg("distributed.strategy=fsdp", "algorithm.memory_plan=recompute", "algorithm.memory_budget_gb=1"),
                   hf, prompt_len=16, world=2, device="cpu")
    assert rec.engine == "recompute" and two.peak_bytes < rec.peak_bytes
    mid = (two.peak_bytes + min(rec.peak_bytes, fsdp.peak_bytes)) / 2 / GB  # the whole batch fits two-pass only
    p = plan_run(_cfg("distributed.strategy=fsdp", "algorithm.memory_plan=auto", f"algorithm.memory_budget_gb={mid!r}"),
                 hf, prompt_len=16, world=2, device="cpu")
    assert (p.engine, p.groups) == ("two-pass", 2)
    # a budget too tight for both: the refusal names both engines' needs
    with pytest.raises(PlanError, match=r"needs one-pass [\d.]+ GB, recompute [\d.]+ GB, two-pass [\d.]+ GB; the "):
        plan_run(_cfg("distributed.strategy=fsdp", "algorithm.memory_plan=auto",
                      f"algorithm.memory_budget_gb={(fsdp.resident_bytes + 1000) / GB!r}"),
                 hf, prompt_len=16, world=2, device="cpu")


def test_plan_run_without_exact_norms_keeps_the_checkpointing_setting():
    from oblr.train.plan import plan_run

    for ckpt in (False, True):
        cfg = _cfg("algorithm.baseline=grpo", "algorithm.lr_schedule=constant", "algorithm.memory_plan=auto",
                   "algorithm.memory_budget_gb=1", f"model.activation_checkpointing={str(ckpt).lower()}")
        p = plan_run(cfg, _hf_config(), prompt_len=16, world=1, device="cpu")
        assert not p.exact_norms and p.checkpointing == ckpt and p.groups == 4
    cfg = _cfg("algorithm.memory_plan=auto", "algorithm.memory_budget_gb=1", "model.activation_checkpointing=true")
    p = plan_run(cfg, _hf_config(), prompt_len=16, world=1, device="cpu")
    assert p.checkpointing and p.engine == "recompute"  # auto obeys it: a checkpointed engine (the tiny model's
    assert apply_plan(cfg, p).algorithm.checkpointed_engine == "recompute"  # kept gradients are small: recompute)
    cfg = _cfg("algorithm.memory_plan=two_pass", "algorithm.memory_budget_gb=1")
    p = plan_run(cfg, _hf_config(), prompt_len=16, world=1, device="cpu")
    assert p.engine == "two-pass" and apply_plan(cfg, p).algorithm.checkpointed_engine == "two_pass"
    # norms_method ghost / materialize keep every weight's factors, which the model does not price: no recompute
    cfg = _cfg("algorithm.memory_plan=auto", "algorithm.memory_budget_gb=1", "model.activation_checkpointing=true",
               "algorithm.norms_method=ghost")
    assert plan_run(cfg, _hf_config(), prompt_len=16, world=1, device="cpu").engine == "two-pass"


def test_plan_run_on_cuda_without_a_budget_takes_the_free_memory(monkeypatch):
    import torch

    from oblr.train.plan import plan_run

    cfg = _cfg("algorithm.memory_plan=auto")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(3e9), int(80e9)))
    p = plan_run(cfg, _hf_config(), prompt_len=16, world=1, device=torch.device("cuda", 0))
    assert p.budget_bytes == int(3e9) and p.budget_source == "free CUDA memory"
    assert "of 3 per device (free CUDA memory;" in p.line()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1000, int(80e9)))
    with pytest.raises(PlanError, match=r"1e-06 GB per device \(free CUDA memory\) is below the model's own"):
        plan_run(cfg, _hf_config(), prompt_len=16, world=1, device=torch.device("cuda", 0))


# ------------------------------------------------------------------------------- runs of the tiny model
TINY = [f"task.name={SIGNAL_TASK}", "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16", "task.eval_size=0",
        "train.threads=1", "train.plots=false", "train.save_every=0", "train.steps=1"]


def _run(model, out, capsys, *extra):
    rc = main(["train", f"model.name_or_path={model}", *TINY, *extra, "--output-dir", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    return cap.out, [r for r in rows if "train/reward_mean" in r], json.loads((out / "summary.json").read_text())


def _numbers(row):
    return {k: v for k, v in row.items() if k != "time" and not k.startswith("time/")}


def test_a_run_with_a_budget_logs_its_plan_once_and_trains_as_without(small_builtin, tmp_path, capsys):
    out, rows, summary = _run(small_builtin, tmp_path / "plan", capsys, "algorithm.memory_plan=auto",
                              "algorithm.memory_budget_gb=2")
    lines = [ln for ln in out.splitlines() if "plan:" in ln]
    assert len(lines) == 1 and lines[0].startswith("[oblr] plan: one-pass, micro-batch 4 groups (16 sequences of ")
    assert "of 2 per device (algorithm.memory_budget_gb" in lines[0]
    assert summary["memory_plan"]["engine"] == "one-pass" and summary["memory_plan"]["micro_batch_groups"] == 0
    saved = load_config(tmp_path / "plan" / "config.yaml")  # the config as written, not as planned
    assert saved.algorithm.memory_plan == "auto" and saved.algorithm.micro_batch_groups == 0
    # the plan resolved to the run's own settings: the same numbers as the unplanned run, bit for bit
    out0, rows0, summary0 = _run(small_builtin, tmp_path / "none", capsys)
    assert "plan:" not in out0 and "memory_plan" not in summary0
    assert _numbers(rows[0]) == _numbers(rows0[0]) and rows[0]["optim/grad_norm"] > 0


def test_a_tight_budget_runs_the_two_pass_engine_on_smaller_micro_batches(small_builtin, tmp_path, capsys):
    from transformers import AutoConfig, AutoTokenizer

    from oblr.tasks import get_task
    from oblr.tasks.base import task_accepts
    from oblr.train.plan import prompt_tokens

    shape = shape_from_hf_config(AutoConfig.from_pretrained(small_builtin).to_dict())
    tok = AutoTokenizer.from_pretrained(small_builtin)
    task = get_task(SIGNAL_TASK, **({"tokenizer": tok} if task_accepts(SIGNAL_TASK, "tokenizer") else {}))
    tokens = prompt_tokens(tok, [ex.prompt for ex in task.train]) + 16
    res = resident(shape, param_bytes=4, optim_bytes=8)
    two = [predicted_peak(shape, exact_norms=True, checkpointing=True, sequences=4 * g, tokens=tokens, param_bytes=4,
                          resident_bytes=res) for g in (1, 2)]
    budget = (two[0] + two[1]) / 2 / GB  # one group fits, two do not
    out, rows, summary = _run(small_builtin, tmp_path / "tight", capsys, "algorithm.memory_plan=two_pass",
                              f"algorithm.memory_budget_gb={budget!r}")
    p = summary["memory_plan"]
    assert (p["engine"], p["groups"], p["micro_batch_groups"], p["checkpointing"], p["tokens"]) == \
        ("two-pass", 1, 1, True, tokens)
    assert "[oblr] plan: two-pass, micro-batch 1 group (4 sequences" in out
    assert rows[0]["optim/grad_norm"] > 0
    # the plan's settings are the ones the step ran with: the same numbers as setting them by hand
    out0, rows0, _ = _run(small_builtin, tmp_path / "hand", capsys, "model.activation_checkpointing=true",
                          "algorithm.micro_batch_groups=1")
    assert _numbers(rows[0]) == _numbers(rows0[0])


# ----------------------------------------------------------------------------- refusals before the model
class ModelReached(Exception):
    pass


@pytest.fixture
def no_model(monkeypatch):
    import oblr.models

    def reached(*a, **k):
        raise ModelReached

    monkeypatch.setattr(oblr.models, "load_model_and_tokenizer", reached)


def _refused(capsys, model, tmp_path, *extra) -> str:
    rc = main(["train", f"model.name_or_path={model}", *TINY, *extra, "--output-dir", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("oblr: error: "), f"rc {rc}:\n{err[-3000:]}"
    return lines[0]


@pytest.mark.parametrize("extra, needle", [
    (["algorithm.memory_plan=auto", "algorithm.memory_budget_gb=0.001"],
     "'algorithm.memory_budget_gb': 0.001 GB per device (algorithm.memory_budget_gb) is below the model's own "
     "resident size"),
    (["algorithm.memory_plan=two_pass", "algorithm.memory_budget_gb=0.0095"], "no plan fits 0.0095 GB per device"),
    (["algorithm.memory_plan=auto"], "algorithm.memory_plan 'auto' on cpu needs a budget"),
])
def test_budget_refusals_are_one_line_before_the_model(small_builtin, no_model, capsys, tmp_path, extra, needle):
    line = _refused(capsys, small_builtin, tmp_path, *extra)
    assert needle in line, line


def test_checkpointing_a_model_that_cannot_is_one_line_before_the_model(small_builtin, no_model, capsys,
                                                                         tmp_path, monkeypatch):
    from transformers import Qwen3ForCausalLM

    monkeypatch.setattr(Qwen3ForCausalLM, "supports_gradient_checkpointing", False)
    for extra in (["model.activation_checkpointing=true"],
                  ["algorithm.memory_plan=two_pass", "algorithm.memory_budget_gb=1"]):
        line = _refused(capsys, small_builtin, tmp_path, *extra)
        assert ("config key 'model.activation_checkpointing': Qwen3ForCausalLM does not support activation "
                "checkpointing") in line, line
    # auto leaves the two pass out for such a model: the one pass is chosen
    from transformers import AutoConfig

    from oblr.train.plan import plan_run

    cfg = load_config(None, ["algorithm.memory_plan=auto", "algorithm.memory_budget_gb=1", *TINY])
    p = plan_run(cfg, AutoConfig.from_pretrained(small_builtin), prompt_len=30, world=1, device="cpu")
    assert p.engine == "one-pass"


def test_chunked_logits_bring_the_papers_long_responses_under_80_gb():
    """Qwen3-4B, one process, bf16 AdamW, a group of 8 sequences of 256 + 4096 tokens: refused with whole
    logits (145 GB with the earlier micro-batches' gradients), planned two-pass with the output layer in chunks; chunking does not pay at short lengths
    for OBLR-PO (its float32 per-row sum of the output layer's gradient, 8 x vocab x hidden)."""
    s4 = mm.QWEN3["Qwen3-4B"]
    res = resident(s4, param_bytes=2, optim_bytes=optimizer_state_bytes("adamw", 0.0, 2))
    kw = dict(budget_bytes=80 * GB, exact_norms=True, allowed=(True,), groups=8, group_size=8, tokens=4352,
              param_bytes=2, resident_bytes=res)
    with pytest.raises(PlanError, match=r"two-pass 145 GB; the smallest budget that works is [\d.]+ GB \(with the output "
                       r"layer in chunks, model.logit_chunk_tokens=512, two-pass needs [\d.]+ GB: docs/scale.md\)$"):
        choose_plan(s4, **kw)
    with pytest.raises(PlanError, match=r"the smallest budget that works is [\d.]+ GB$"):  # no hint: chunks are on
        choose_plan(s4, **dict(kw, budget_bytes=30 * GB), logit_chunk=512)
    # the hint names the engine it priced: the recompute engine alone (memory_plan=recompute) gets its own figure
    with pytest.raises(PlanError, match=r"model.logit_chunk_tokens=512, recompute needs [\d.]+ GB: docs/scale.md\)$"):
        choose_plan(s4, **dict(kw, allowed=("recompute",)))
    p = choose_plan(s4, **kw, logit_chunk=256)
    assert (p.engine, p.logit_chunk) == ("two-pass", 256) and p.groups >= 1 and p.peak_bytes <= 80 * GB
    assert "output layer in chunks of 256 positions, predicted peak" in p.line()
    lora = choose_plan(s4, **kw, logit_chunk=256, head_trainable=False)
    # no per-row sum when the output layer is frozen: a smaller peak, or room for more groups
    assert lora.groups > p.groups or (lora.groups == p.groups and lora.peak_bytes < p.peak_bytes)
    short = dict(kw, tokens=1280)
    assert (choose_plan(s4, **short, logit_chunk=1024).peak_bytes > choose_plan(s4, **short).peak_bytes)
    # GRPO: no per-row sum, chunking only removes logits
    def grpo(tokens, chunk):
        return predicted_peak(s4, exact_norms=False, checkpointing=True, sequences=8, tokens=tokens, param_bytes=2,
                              resident_bytes=res, logit_chunk=chunk)

    assert grpo(4352, 256) < grpo(1280, 0) and grpo(1280, 256) < grpo(1280, 0)


def test_plan_run_with_chunked_logits_plans_checkpointed_engines_only():
    from oblr.train.plan import plan_run

    cfg = _cfg("algorithm.memory_plan=auto", "algorithm.memory_budget_gb=100", "model.logit_chunk_tokens=8")
    p = plan_run(cfg, _hf_config(), prompt_len=16, world=1, device="cpu")
    assert (p.engine, p.checkpointing, p.logit_chunk) == ("recompute", True, 8)  # a tie: the one backward
    assert apply_plan(cfg, p).model.activation_checkpointing


def _by_hand_peaks(groups: int) -> dict[str, int]:
    """Qwen3-0.6B, bf16, a later micro-batch of ``groups`` groups of 8 sequences of 1024 tokens, the earlier
    micro-batches' bf16 gradients held (``2 P`` bytes from the start): the memory model written out by hand.

    One-pass: activations ``(L (10h + 5q + 4kv + 4I) + 4h + T)`` per token; then the larger of the start of its
    backward (4 float32 logit-sized tensors, no gradient formed, plus the held gradients) and its assembly (the held
    gradients, and for the largest entry, the tied embedding ``V x h`` kept as factors, one group's float32 sum and
    the float32 running total, plus the total in bf16: ``10 V h``). Two-pass: the layer inputs ``L h`` and ``4h + T``
    per token; then the start of the backward (5 logit-sized tensors, the output layer's gradient an increment into
    the held one) with the held gradients, which beats the recomputed layer with every gradient, the tied sum and
    the norm pass (4 logit-sized tensors) on this shape."""
    L, h, q, kv, i, V, T = 28, 1024, 16 * 128, 8 * 128, 3072, 151936, 1024
    B, P = 8 * groups, mm.n_params(S)
    held = 2 * P
    one_pass = B * T * (L * (10 * h + 5 * q + 4 * kv + 4 * i) + 4 * h + T) * 2
    one_pass += max(4 * B * T * V * 4 + held, held + 10 * V * h)
    layer = B * T * (6 * h + 7 * q + 6 * kv + 4 * i) * 2
    two_pass = B * T * (L * h + 4 * h + T) * 2
    two_pass += max(5 * B * T * V * 4 + held, layer + held, held + 2 * V * h * 2, 4 * B * T * V * 4 + layer + held)
    return {"one-pass": RES + one_pass, "two-pass": RES + two_pass}


def test_a_capped_micro_batch_is_priced_with_the_earlier_micro_batches_gradients_held():
    """The user's cap (algorithm.micro_batch_groups=3 of the rank's 4 groups) splits the batch, so the 3-group
    micro-batch after the first runs with the first one's gradients held: its peak is the by-hand model with those
    gradients (``_by_hand_peaks``), 2 P bytes (1.19 GB) above the same micro-batch as a whole batch. At 115 GB the
    one-pass engine on 3 groups therefore does not fit (115.5 GB; 114.3 GB without the held gradients) and the
    two-pass engine runs the 3 groups; at 116 GB it fits and, at equal groups, the cheaper one-pass engine is chosen
    -- where the uncapped plan is the two-pass engine on the whole batch: the cap changes the engine."""
    want = _by_hand_peaks(3)
    assert want["one-pass"] - mm.n_params(S) * 2 < 115 * GB < want["one-pass"] < 116 * GB
    p = plan(115, max_groups=3)
    assert (p.engine, p.groups, p.micro_batch_groups, p.sequences) == ("two-pass", 3, 3, 24)
    assert p.peak_bytes == want["two-pass"]
    p = plan(116, max_groups=3)
    assert (p.engine, p.groups, p.micro_batch_groups, p.sequences) == ("one-pass", 3, 3, 24)
    assert p.peak_bytes == want["one-pass"]
    for budget in (115, 116):  # without the cap: the two-pass engine on the whole batch (nothing held)
        p = plan(budget)
        assert (p.engine, p.groups, p.micro_batch_groups) == ("two-pass", 4, 0)
    # a cap at or above the rank's groups is no cap: the whole batch, nothing held, micro_batch_groups 0
    for cap in (4, 6):
        p = plan(300, max_groups=cap)
        assert (p.engine, p.groups, p.micro_batch_groups, p.sequences) == ("one-pass", 4, 0, 32)
        assert p.peak_bytes == plan(300).peak_bytes
