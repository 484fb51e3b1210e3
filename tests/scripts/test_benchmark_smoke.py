"""benchmarks/step_cost.py on a very small case: every method runs, computes the OBLR-PO gradient, and the
table has finite ratios (no timing assertions)."""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import step_cost
from step_methods import Case, methods

TINY = {"hidden": 32, "layers": 1, "vocab": 96, "prompt_len": 4, "response_len": 10, "n_prompts": 2, "group_size": 3}
ALL = [m.name for m in methods()]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _has_opacus() -> bool:
    try:
        import opacus  # noqa: F401
    except ImportError:
        return False
    return True


def test_tiny_tied_case_every_method_in_table():
    res = step_cost.run_case(Case(**TINY), repeats=1)
    assert [r.method for r in res.rows] == ALL
    for r in res.rows:
        if r.method == "opacus":  # Opacus ghost clipping rejects tied embeddings: reported, not a number
            assert r.error and not r.times
            continue
        assert r.error is None, (r.method, r.error)
        assert math.isfinite(res.ratio(r.method)) and res.ratio(r.method) > 0
        assert math.isfinite(res.mem_ratio(r.method)) and r.peak_bytes > 0
        if r.method not in ("grpo", "oblr", "grpo_ckpt", "grpo_ckpt_chunk"):  # the one-backward OBLR-PO step's gradient
            assert r.grad_err < 1e-4, (r.method, r.grad_err)
    assert res.ratio("grpo") == 1.0
    table = step_cost.markdown_table(res)
    for name in ALL:
        assert f"| {name} |" in table
    assert "not measured" in table


def test_dense_method_raises_the_keep_dense_slack_only_for_its_own_calls(monkeypatch):
    """oblr_dense keeps per-row gradients dense during its call (the rule sees DENSE_SLACK) and leaves the
    engine's constant as it found it, so the methods after it run the engine's own rule."""
    from oblr.gradnorm import assembly
    import step_methods

    seen = []
    real = assembly.keep_dense
    monkeypatch.setattr(assembly, "keep_dense", lambda c: seen.append(assembly.KEEP_DENSE_SLACK) or real(c))
    import oblr.gradnorm.stored as stored
    monkeypatch.setattr(stored, "keep_dense", assembly.keep_dense)
    res = step_cost.run_case(Case(**TINY), repeats=1, only=["oblr_dense", "oblr"])
    assert res.row("oblr_dense").error is None and res.row("oblr_dense").grad_err < 1e-4
    assert step_methods.DENSE_SLACK in seen and assembly.KEEP_DENSE_SLACK in seen  # both rules were used
    assert assembly.KEEP_DENSE_SLACK == 1.0


@pytest.mark.skipif(not _has_opacus(), reason="opacus not installed (pip install -e '.[bench]')")
def test_tiny_untied_case_opacus_matches():
    res = step_cost.run_case(Case(**TINY, tied=False, micro_batch_groups=1), repeats=1,
                             only=["oblr", "two_backward", "opacus"])
    assert [r.method for r in res.rows] == ["grpo", "oblr", "two_backward", "opacus"]
    for name in ("two_backward", "opacus"):
        r = res.row(name)
        assert r.error is None and r.grad_err < 1e-4 and math.isfinite(res.ratio(name)), (name, r.error)


def test_main_quick_prints_ratio_line_and_markdown(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(step_cost, "QUICK_CASES", [Case(**TINY)])
    out_md = tmp_path / "table.md"
    assert step_cost.main(["--quick", "--repeats", "1", "--methods", "oblr", "--markdown", str(out_md)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"oblr/grpo step-time ratio: \d+\.\d\d", lines[-1])
    md = out_md.read_text()
    assert "| grpo |" in md and "| oblr |" in md and "| loop |" not in md


def test_main_with_a_real_checkpoint_runs_full_and_lora_in_one_run(tmp_path, capsys):
    """--model on the real-checkpoint path at test size (a Llama prepared from a GGUF file, as SmolLM2-135M)."""
    pytest.importorskip("gguf")
    pytest.importorskip("peft")
    from gguf_helpers import prepared_tiny_llama

    model = prepared_tiny_llama(tmp_path)
    out_md = tmp_path / "table.md"
    assert step_cost.main(["--model", str(model), "--shape", "6,5,2,2", "--lora-rank", "2", "--repeats", "1",
                           "--methods", "oblr", "--markdown", str(out_md)]) == 0
    md = out_md.read_text()
    full, lora = md.split("\n\n**")[1:3]
    assert "(full fine-tuning); T = 6+5; B = 2x2" in full and "(LoRA r=2 on q_proj/k_proj/v_proj/o_proj)" in lora
    params = [float(re.search(r"\(([\d.]+)M trainable parameters\)", t).group(1)) for t in (full, lora)]
    assert params[1] < params[0] / 10
    for table in (full, lora):
        assert "| grpo |" in table and "| oblr |" in table and "not measured" not in table
    assert re.fullmatch(r"oblr/grpo step-time ratio: \d+\.\d\d", capsys.readouterr().out.strip().splitlines()[-1])


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        step_cost.main(["--methods", "nope"])
    with pytest.raises(SystemExit):
        step_cost.main(["--repeats", "0"])
    with pytest.raises(SystemExit):
        step_cost.main(["--cases", "99"])
    for bad in (["--shape", "4,4,2"], ["--shape", "4,0,2,2"], ["--lora-rank", "-1"], ["--model", "x", "--quick"]):
        with pytest.raises(SystemExit):
            step_cost.main(bad)


def test_rollout_engines_runs_the_hf_engine_and_tables_it(small_builtin, capsys):
    """benchmarks/rollout_engines.py with the hf engine only (vLLM's side runs in .venv-vllm, docs/rollout.md)."""
    import rollout_engines

    assert rollout_engines.main(["--engines", "hf", "--model", str(small_builtin), "--prompts", "2", "--group-size",
                                 "2", "--max-new-tokens", "4", "--repeats", "1", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| hf \| [0-9.]+ \| [0-9.]+ \|", out, re.M)
