"""End-to-end trainer tests on a test-sized built-in model: a few steps, tiny settings."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from oblr.cli import main
from oblr.config import load_config
from oblr.tracking import read_metrics
from oblr.train import checkpoint as ckpt
from oblr.train.trainer import Trainer, TrainingError

TINY = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=24", "task.eval_size=8",
        "train.eval_samples=2", "train.threads=1", "task.options={n_train: 200, n_eval: 20}"]

#: logged every step by every OBLR-PO schedule (the SNR rule's S, V and SNR: SNR_KEYS; the kl rule's: KL_KEYS)
SPEC_KEYS = ["snr/lr", "weights/mean", "weights/cv_within_group", "baseline/mean",
             "baseline/std_across_prompts", "adv/var_across_prompts", "baseline/fallback_count", "optim/grad_norm",
             "train/reward_mean", "train/pass_rate", "train/all_equal_share", "train/response_length_mean",
             "train/entropy", "time/generate", "time/score", "time/norms", "time/update"]
SNR_KEYS = ["snr/S", "snr/V", "snr/snr", "snr/factor"]
KL_KEYS = ["policy/step_kl", "kl/target", "kl/skipped", "time/step_kl"]


def _args(model, out, steps, *extra):
    return ["train", f"model.name_or_path={model}", f"train.steps={steps}", *TINY, *extra, "--output-dir", str(out),
            "--quiet"]


@pytest.mark.parametrize("schedule", [[], ["algorithm.lr_schedule=snr"], ["algorithm.track_snr=true"]],
                         ids=["default-kl", "snr", "kl-track-snr"])
def test_train_end_to_end_writes_metrics_summary_plots_checkpoint(small_builtin, tmp_path, schedule):
    out = tmp_path / "run"
    assert main(_args(small_builtin, out, 2, "train.eval_every=1", *schedule)) == 0
    summary = json.loads((out / "summary.json").read_text())
    for k in ("eval_accuracy_initial", "eval_accuracy_final", "eval_accuracy_best", "steps", "wall_seconds"):
        assert k in summary
    assert summary["steps"] == 2
    rows = read_metrics(out)
    train_rows = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    snr = "algorithm.lr_schedule=snr" in schedule
    expect = SPEC_KEYS + (SNR_KEYS if snr or schedule else []) + ([] if snr else KL_KEYS)
    for k in expect:
        assert k in train_rows[0], k
    if not schedule:  # the default kl schedule uses no S and V and does not pay for them
        assert not any(k.startswith("snr/") and k != "snr/lr" for k in train_rows[0])
    for r in train_rows:  # the hf engine's log-probs of its samples are the update's (KV cache vs one forward)
        assert r["rollout/logprob_gap_max"] < 1e-4 and r["rollout/outside_nucleus"] == 0 and r["time/sync"] >= 0
    assert {p.name for p in (out / "plots").glob("*.png")} >= {"reward.png", "lr_snr.png", "eval_accuracy.png",
                                                               "grad_norm.png"}
    ck = out / "checkpoints" / "step_000002"
    assert (ck / "model.safetensors").is_file() and (ck / "tokenizer.json").is_file()
    assert (out / "config.yaml").is_file() and list((out / "samples").glob("eval_step_*.jsonl"))


def test_existing_run_is_never_overwritten(small_builtin, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(small_builtin, out, 1, "train.plots=false")) == 0
    before = (out / "metrics.jsonl").read_bytes()
    assert main(_args(small_builtin, out, 1)) == 2
    assert "already holds a run; pass --resume" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_bytes() == before


def _train_rows(out):
    return {r["step"]: r for r in read_metrics(out) if "train/reward_mean" in r}


def test_resume_reproduces_the_straight_run(small_builtin, tmp_path):
    # the SNR schedule (its EMA state is the checkpoint's subject; the kl schedule's resume:
    # tests/train/test_training_variants.py)
    common = ["train.eval_every=2", "train.save_every=2", "train.plots=false", "algorithm.lr_schedule=snr"]
    a, b = tmp_path / "straight", tmp_path / "resumed"
    assert main(_args(small_builtin, a, 4, *common)) == 0
    assert main(_args(small_builtin, b, 2, *common)) == 0
    # the checkpoint carries the SNR EMA (snr schedule, default snr_ema 0.9): the averages after 2 steps,
    # whose bias-corrected, clamped values are the S and V logged at step 2
    lr_state = ckpt.load_trainer_state(ckpt.latest_checkpoint(b))["lr_controller"]
    assert lr_state["ema"] == 0.9 and lr_state["steps"] == 2
    logged = _train_rows(b)[2]
    assert max(lr_state["s_avg"] / (1 - 0.9**2), 0.0) == pytest.approx(logged["snr/S"], rel=1e-6, abs=1e-12)
    assert max(lr_state["v_avg"] / (1 - 0.9**2), 0.0) == pytest.approx(logged["snr/V"], rel=1e-6, abs=1e-12)
    assert main(_args(small_builtin, b, 4, *common) + ["--resume"]) == 0
    ra, rb = _train_rows(a), _train_rows(b)
    assert sorted(rb) == [1, 2, 3, 4]
    for step in (3, 4):
        for k in ("train/reward_mean", "optim/grad_norm", "snr/lr", "snr/S", "snr/V", "train/response_length_mean"):
            assert rb[step][k] == pytest.approx(ra[step][k], rel=1e-4, abs=1e-7), (step, k)
    sa, sb = json.loads((a / "summary.json").read_text()), json.loads((b / "summary.json").read_text())
    assert sb["eval_accuracy_final"] == pytest.approx(sa["eval_accuracy_final"])


def test_resume_rejects_a_changed_config(small_builtin, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(small_builtin, out, 1, "train.plots=false")) == 0
    assert main(_args(small_builtin, out, 2, "optim.lr=0.5") + ["--resume"]) == 2
    assert "changed keys: optim.lr" in capsys.readouterr().err


def test_interrupt_saves_completed_steps_and_resumes(small_builtin, tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = Trainer.train_step

    def interrupted(self, step):
        if step == 2:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    assert main(_args(small_builtin, out, 5, "train.save_every=0", "train.plots=false")) == 130
    monkeypatch.setattr(Trainer, "train_step", original)
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step_000002"
    assert main(_args(small_builtin, out, 3, "train.save_every=0", "train.plots=false") + ["--resume"]) == 0
    assert sorted(_train_rows(out)) == [1, 2, 3]


def test_sigint_to_a_real_process_leaves_a_loadable_checkpoint(small_builtin, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "oblr.cli", *_args(small_builtin, out, 500, "train.save_every=0",
                                                     "train.eval_every=0", "train.plots=false")]
    from fault_helpers import sigint_default

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ},
                            preexec_fn=sigint_default)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:  # wait for a finished step, not a fixed time
            if (out / "metrics.jsonl").is_file() and len(_train_rows(out)) >= 1:
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=240) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    from oblr.train.checkpoint import latest_checkpoint, load_trainer_state

    ck = latest_checkpoint(out)
    assert ck is not None and load_trainer_state(ck)["step"] >= 1


def test_nan_gradients_skip_steps_then_stop(small_builtin, tmp_path, monkeypatch):
    import oblr.distributed.step as step  # the trainer's update goes through data_parallel_gradient

    real = step.accumulate_policy_gradient

    def poisoned(model, *a, **k):
        res = real(model, *a, **k)
        for p in model.parameters():
            if p.grad is not None:
                p.grad.fill_(float("nan"))
        return res

    monkeypatch.setattr(step, "accumulate_policy_gradient", poisoned)
    cfg = load_config(None, [f"model.name_or_path={small_builtin}", "train.steps=5", "train.max_bad_steps=2",
                             "train.plots=false", f"train.output_dir={tmp_path / 'run'}", *TINY])
    trainer = Trainer(cfg, quiet=True)
    with pytest.raises(TrainingError, match="2 consecutive steps"):
        trainer.run()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    rows = _train_rows(tmp_path / "run")
    assert [r["optim/skipped"] for r in rows.values()] == [1.0, 1.0]
    from oblr.models import load_model_and_tokenizer

    fresh, _ = load_model_and_tokenizer(str(small_builtin))
    for n, p in fresh.named_parameters():  # skipped steps never touched the weights
        assert torch.equal(p, before[n]), n


def test_missing_model_path_fails_before_training(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert main(["train", f"model.name_or_path={missing}", "--output-dir", str(tmp_path / "r"), "--quiet"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_bad_config_fails_with_the_key(capsys):
    assert main(["train", "rollout.group_size=1"]) == 2
    assert "rollout.group_size" in capsys.readouterr().err
    assert main(["train", "optim.lrr=1"]) == 2
    assert "did you mean 'optim.lr'" in capsys.readouterr().err


def test_help_lists_config_keys(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "algorithm.lr_schedule" in capsys.readouterr().out




def test_malformed_data_names_file_and_line_before_model_loads(tmp_path, capsys, monkeypatch):
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?", "answer": "4"\n')
    import oblr.models

    def no_model(*a, **k):
        raise AssertionError("the model must not load before the data is validated")

    monkeypatch.setattr(oblr.models, "load_model_and_tokenizer", no_model)
    rc = main(["train", "task.name=math_data", f"task.options={{train: {data}, eval: {data}}}",
               "rollout.prompts_per_step=2", "--output-dir", str(tmp_path / "run"), "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err


def test_math_task_prompts_use_the_models_chat_template_like_oblr_eval(small_builtin, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    model_dir = tmp_path / "chat-model"
    shutil.copytree(small_builtin, model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    tok.save_pretrained(model_dir)
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"question": "{i}+1?", "answer": "{i + 1}"}}\n' for i in range(4)))
    cfg = load_config(None, [f"model.name_or_path={model_dir}", "task.name=math_data", "rollout.prompts_per_step=2",
                             f"task.options={{train: {data}, eval: {data}, kind: gsm8k}}",
                             f"train.output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg, quiet=True)
    trainer._setup()
    trainer.logger.close()
    assert trainer.task.train[0].prompt.startswith("<|user|>0+1?")
    assert trainer.eval_examples[0].prompt.endswith("<|assistant|>")


@pytest.mark.parametrize("with_template", [True, False])
def test_arithmetic_chat_template_from_the_models_tokenizer_and_one_honest_warning(small_builtin, tmp_path,
                                                                                    monkeypatch, with_template):
    import shutil
    import warnings

    from transformers import AutoTokenizer

    import oblr.tasks.templates as templates

    monkeypatch.setattr(templates, "_warned_no_chat", False)
    model_dir = tmp_path / "chat-model"
    shutil.copytree(small_builtin, model_dir)
    if with_template:
        tok = AutoTokenizer.from_pretrained(model_dir)
        tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
        tok.save_pretrained(model_dir)
    cfg = load_config(None, [f"model.name_or_path={model_dir}", "task.name=arithmetic", "rollout.prompts_per_step=2",
                             "task.options={n_train: 20, n_eval: 4, min_ops: 1, max_ops: 1, style: chat}",
                             f"train.output_dir={tmp_path / 'run'}"])
    trainer = Trainer(cfg, quiet=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer._setup()
    trainer.logger.close()
    fallback = [w for w in caught if "no chat template" in str(w.message)]
    expr = trainer.task.train[0].meta["expression"]
    if with_template:
        # the data check before the model loads renders without a tokenizer: that must not warn
        assert fallback == []
        assert trainer.task.train[0].prompt == f"<|user|>What is {expr}? Answer with the number only.<|assistant|>"
    else:  # a tokenizer without a chat template: warned once, the plain format used
        assert len(fallback) == 1
        assert trainer.task.train[0].prompt == f"User: What is {expr}? Answer with the number only.\nAssistant:"
    assert trainer.task.reward(f"{expr} = {trainer.task.train[0].answer}", trainer.task.train[0]) == 1.0
