"""Checks on a real pretrained checkpoint (default: SmolLM2-135M-Instruct, ``oblr models prepare``).

1. Exact per-sequence squared gradient norms ``w_i = ||grad log pi(o_i|q_i)||^2`` from one batched backward
   (``sequence_grad_sq_norms`` with methods ``ghost``, ``materialize`` and ``auto``, the trainer's default)
   against the reference with one backward per sequence (``loop_sequence_sq_norms``), float32 on CPU, for
   full fine-tuning (every parameter) and for LoRA (rank 8 on every attention and MLP projection; the
   adapters' B matrices set to small random values, as after some training, since peft's zero init of B
   would make every A gradient zero). The batch: the first ``--sequences`` GSM8K test questions in the
   model's chat template, each with the model's own greedy answer (``--response-tokens`` at most).
2. ``oblr eval`` on the first ``--eval-limit`` GSM8K test problems, chat template, greedy pass@1 (run as a
   subprocess; the command is recorded).

Writes ``<out>/summary.json`` and ``<out>/summary.md``. Reproduce (after ``oblr models prepare
smollm2-135m-instruct``)::

    OMP_NUM_THREADS=1 python benchmarks/real_model_check.py --out benchmarks/results/real_model
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
METHODS = ("ghost", "materialize", "auto")


def make_batch(model, tok, n: int, response_tokens: int):
    """``(ids, attention_mask, response_mask, prompts)`` in the project layout ``[pad.. prompt | response ..pad]``:
    chat-formatted GSM8K questions and the model's greedy answers (up to and including its first eos)."""
    from oblr.tasks.loaders import load_benchmark
    from oblr.tasks.templates import render_prompt

    recs = load_benchmark("gsm8k", "test", limit=n)
    prompts = [render_prompt(r.question, kind="gsm8k", template="chat", tokenizer=tok) for r in recs]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=response_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    P = enc["input_ids"].shape[1]
    resp = out[:, P:]
    rm = torch.zeros_like(resp)
    for i in range(len(resp)):
        eos = (resp[i] == tok.eos_token_id).nonzero()
        end = int(eos[0]) + 1 if len(eos) else resp.shape[1]
        rm[i, :end] = 1
    ids = torch.cat([enc["input_ids"], resp * rm + tok.pad_token_id * (1 - rm)], 1)
    am = torch.cat([enc["attention_mask"], rm], 1)
    rmask = torch.cat([torch.zeros_like(enc["input_ids"]), rm], 1)
    return ids, am, rmask, prompts


def compare(model, ids, am, rm) -> dict:
    """The loop reference and every batched method: values, max relative error, seconds."""
    from oblr.gradnorm import loop_sequence_sq_norms, sequence_grad_sq_norms

    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    ref = loop_sequence_sq_norms(model, ids, am, rm)
    row = {"trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "w_loop": [float(x) for x in ref], "loop_seconds": round(time.perf_counter() - t, 2), "methods": {}}
    for method in METHODS:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        w = sequence_grad_sq_norms(model, ids, am, rm, method=method)
        sec = time.perf_counter() - t
        err = float(((w - ref).abs() / ref.abs().clamp_min(1e-30)).max())
        row["methods"][method] = {"w": [float(x) for x in w], "max_rel_err": err, "seconds": round(sec, 2)}
    model.zero_grad(set_to_none=True)
    return row


def run_eval(model: str, limit: int, max_new_tokens: int, batch_size: int) -> dict:
    """``oblr eval`` on the first ``limit`` GSM8K problems (chat template, greedy) in a subprocess."""
    with tempfile.TemporaryDirectory() as out:
        args = ["eval", "--model", model, "--benchmarks", "gsm8k", "--limit", str(limit), "--template", "chat",
                "--max-new-tokens", str(max_new_tokens), "--batch-size", str(batch_size), "--device", "cpu"]
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "oblr.cli", *args, "--output-dir", out],
                             capture_output=True, text=True)
        wall = time.perf_counter() - t
        if res.returncode != 0:
            raise SystemExit(f"oblr eval failed (exit {res.returncode}): {res.stderr.strip()[-2000:]}")
        results = json.loads((Path(out) / "results.json").read_text())
        rows = [json.loads(line) for line in (Path(out) / "gsm8k.jsonl").read_text().splitlines() if line.strip()]
    table = [ln for ln in res.stdout.splitlines() if ln.strip() and not ln.startswith("samples and results")]
    return {"command": "oblr " + shlex.join(args), "wall_seconds": round(wall, 1), "results": results,
            "printed_table": table, "examples": rows[:3]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="prepared:smollm2-135m-instruct")
    ap.add_argument("--out", default="benchmarks/results/real_model")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--response-tokens", type=int, default=48)
    ap.add_argument("--lora-rank", type=int, default=8)
    ap.add_argument("--eval-limit", type=int, default=50)
    ap.add_argument("--eval-max-new-tokens", type=int, default=256)
    ap.add_argument("--eval-batch-size", type=int, default=25)
    ap.add_argument("--skip-eval", action="store_true")
    args = ap.parse_args(argv)

    import transformers

    from oblr.models import load_model_and_tokenizer, wrap_lora

    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(args.model)
    ids, am, rm, prompts = make_batch(model, tok, args.sequences, args.response_tokens)
    summary = {
        "model": args.model, "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
        "batch": {"sequences": int(ids.shape[0]), "width": int(ids.shape[1]),
                  "prompt_tokens": am.sum(1).sub(rm.sum(1)).tolist(), "response_tokens": rm.sum(1).tolist()},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "threads": torch.get_num_threads(),
    }
    print(f"[check] batch {tuple(ids.shape)}; full fine-tuning", file=sys.stderr, flush=True)
    summary["full"] = compare(model, ids, am, rm)
    print("[check] LoRA", file=sys.stderr, flush=True)
    lora = wrap_lora(model, rank=args.lora_rank, alpha=2 * args.lora_rank, targets=LORA_TARGETS)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.copy_(1e-3 * torch.randn(p.shape, generator=g))
    summary["lora"] = {"rank": args.lora_rank, "targets": LORA_TARGETS, "lora_B_init": "N(0, 1e-3^2)",
                       **compare(lora, ids, am, rm)}
    del lora, model
    if not args.skip_eval:
        print("[check] oblr eval gsm8k", file=sys.stderr, flush=True)
        summary["eval"] = run_eval(args.model, args.eval_limit, args.eval_max_new_tokens, args.eval_batch_size)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(render_md(summary))
    print(render_md(summary))
    return 0


def render_md(s: dict) -> str:
    lines = [f"# Real-model check: {s['model']}", "",
             f"{s['parameters'] / 1e6:.1f}M parameters, float32, CPU ({s['threads']} thread(s)); torch "
             f"{s['versions']['torch']}, transformers {s['versions']['transformers']}. Written by "
             f"`benchmarks/real_model_check.py`.", "",
             "## Exact per-sequence w_i against the loop reference (one backward per sequence)", "",
             f"Batch: {s['batch']['sequences']} GSM8K test questions (chat template) with the model's greedy answers; "
             f"prompt tokens {s['batch']['prompt_tokens']}, response tokens {s['batch']['response_tokens']}.", "",
             "| setting | trainable params | method | max relative error | seconds (loop: s) |",
             "|---|---:|---|---:|---:|"]
    for key in ("full", "lora"):
        row = s[key]
        name = "full fine-tuning" if key == "full" else f"LoRA r={row['rank']}"
        for m, r in row["methods"].items():
            lines.append(f"| {name} | {row['trainable_parameters']:,} | {m} | {r['max_rel_err']:.2e} | "
                         f"{r['seconds']} ({row['loop_seconds']}) |")
    lines += ["", "w_i (loop): full " + ", ".join(f"{x:.4g}" for x in s["full"]["w_loop"]) + "; LoRA "
              + ", ".join(f"{x:.4g}" for x in s["lora"]["w_loop"]), ""]
    if "eval" in s:
        e = s["eval"]
        lines += ["## GSM8K slice", "", f"`{e['command']}` ({e['wall_seconds']} s):", "", "```",
                  *e["printed_table"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
