"""Rollout engines side by side in one run: completions per second, and the whole training step with each.

    python benchmarks/rollout_engines.py                                  # CPU, built-in model, every engine here
    .venv-vllm/bin/python benchmarks/rollout_engines.py --markdown t.md   # HF and vLLM (vLLM's environment)
    python benchmarks/rollout_engines.py --device cuda --dtype bfloat16 --model qwen3-0.6b --max-new-tokens 512

Models: ``builtin`` (the built-in tiny model, prompts of its arithmetic task), ``qwen3-0.6b`` (Qwen3-0.6B's
config -- 28 layers, hidden 1024, 16/8 heads of 128, vocabulary 151936, tied embeddings -- random init, a
word-level tokenizer over that vocabulary, prompts of ``--prompt-tokens`` random words; a random model
seldom samples EOS, so responses run to ``--max-new-tokens``), or a checkpoint directory.

Per engine (``--engines``, default: those installed here), on the same prompts and settings:

- **setup**: seconds to build the engine (vLLM: engine start and the first weight push);
- **generate**: ``engine.generate(N prompts, G samples, temperature, top_p, seed=r)``, median over
  ``--repeats`` calls after one warm-up call: completions per second and response tokens per second;
- **step**: the whole training step as the trainer runs it -- generate, 0/1 rewards (random, fixed seed:
  scoring costs nothing next to the rest), the update (``oblr.update.accumulate_policy_gradient``; default
  OBLR-PO with exact norms and SNR statistics), ``AdamW.step`` and ``engine.sync_weights`` -- median over ``--steps``
  steps after one warm-up step, with its phases.

The last line is ``vllm/hf generation throughput ratio (completions per second): X.XX`` when both ran. Timings are wall-clock on whatever
else the machine is doing: compare engines within one run only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
import yaml

from oblr.rollout import ENGINES, check_engine, make_engine
from oblr.update import UpdateSettings, accumulate_policy_gradient

QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
             "rope_theta": 1_000_000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer over ``<pad> <eos> <unk> w3 ... w{V-1}`` (whitespace-separated words)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   padding_side="left")


def load(name: str, device: str, dtype: str, n_prompts: int, prompt_tokens: int, seed: int):
    """``(model, tokenizer, prompts, description)``."""
    from oblr.models import load_model_and_tokenizer

    if name == "qwen3-0.6b":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch.manual_seed(seed)
        cfg = Qwen3Config(**QWEN3_06B, pad_token_id=0, eos_token_id=1, bos_token_id=None)
        with torch.device(device):
            model = Qwen3ForCausalLM(cfg).to(getattr(torch, dtype))
        tok = word_tokenizer(cfg.vocab_size)
        g = torch.Generator().manual_seed(seed)
        words = torch.randint(3, cfg.vocab_size, (n_prompts, prompt_tokens), generator=g)
        prompts = [" ".join(f"w{int(i)}" for i in row) for row in words]
        params = sum(p.numel() for p in model.parameters()) / 1e9
        return model, tok, prompts, f"Qwen3-0.6B config, random init ({params:.2f}B parameters), {dtype}"
    model, tok = load_model_and_tokenizer(name, dtype=dtype, device=device)
    from oblr.models.builtin import BUILTIN_TASK
    from oblr.tasks import get_task

    prompts = [ex.prompt for ex in get_task("arithmetic", **BUILTIN_TASK).train[:n_prompts]]
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return model, tok, prompts, f"{name} ({params:.2f}M parameters), {dtype}, arithmetic prompts"


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_engine(name: str, model, tok, prompts: list[str], args) -> dict:
    """Setup, generate and step timings of one engine (see the module docstring)."""
    t0 = time.perf_counter()
    opts = {"batch_size": len(prompts) * args.group_size, **(yaml.safe_load(args.engine_options) or {}).get(name, {})}
    engine = make_engine(name, model, tok, **opts)
    out = {"engine": name, "setup_s": time.perf_counter() - t0}
    kw = dict(num_samples=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
              top_p=args.top_p)
    try:
        gen_times, tokens = [], []
        for r in range(args.repeats + 1):
            _sync(args.device)
            t0 = time.perf_counter()
            batch = engine.generate(prompts, seed=args.seed + r, **kw)
            _sync(args.device)
            if r:  # the first call is a warm-up
                gen_times.append(time.perf_counter() - t0)
                tokens.append(int(batch.response_lengths.sum()))
        med = statistics.median(gen_times)
        rows = len(prompts) * args.group_size
        out.update(generate_s=med, completions_per_s=rows / med,
                   tokens_per_s=statistics.median(tokens) / med, mean_length=statistics.median(tokens) / rows)
        out.update(train_step(engine, model, prompts, args, kw))
    finally:
        engine.close()
    return out


def train_step(engine, model, prompts: list[str], args, kw: dict) -> dict:
    """Median whole-step time and its phases over ``args.steps`` steps (after one warm-up step)."""
    settings = UpdateSettings(baseline=args.baseline, max_len=args.max_new_tokens, need_snr=args.baseline == "oblr",
                              micro_batch_groups=args.micro_batch_groups)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    g = torch.Generator().manual_seed(args.seed)
    phases: dict[str, list[float]] = {"step_s": [], "step_generate_s": [], "step_update_s": [], "step_sync_s": []}
    for s in range(args.steps + 1):
        _sync(args.device)
        t0 = time.perf_counter()
        model.eval()
        with torch.no_grad():
            batch = engine.generate(prompts, seed=10_000 + s, **kw)
        _sync(args.device)
        t1 = time.perf_counter()
        rewards = torch.randint(0, 2, (len(prompts), args.group_size), generator=g).float().to(args.device)
        model.train()
        opt.zero_grad(set_to_none=True)
        accumulate_policy_gradient(model, batch, rewards, settings)
        opt.step()
        _sync(args.device)
        t2 = time.perf_counter()
        engine.sync_weights(model)
        _sync(args.device)
        t3 = time.perf_counter()
        if s:
            for k, v in (("step_s", t3 - t0), ("step_generate_s", t1 - t0), ("step_update_s", t2 - t1),
                         ("step_sync_s", t3 - t2)):
                phases[k].append(v)
    model.eval()
    return {k: statistics.median(v) for k, v in phases.items()}


def table(results: list[dict], header: str) -> str:
    lines = [header, "", "| engine | setup (s) | generate (s) | completions/s | tokens/s | mean length | "
             "step (s) | step: generate / update / sync (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['engine']} | {r['setup_s']:.1f} | {r['generate_s']:.2f} | {r['completions_per_s']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {r['mean_length']:.1f} | {r['step_s']:.2f} | "
                     f"{r['step_generate_s']:.2f} / {r['step_update_s']:.2f} / {r['step_sync_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default=None, help="comma-separated (default: every engine that can run here)")
    p.add_argument("--model", default="builtin", help="builtin | qwen3-0.6b | a checkpoint directory")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prompts", type=int, default=16, help="N prompts per call")
    p.add_argument("--group-size", type=int, default=8, help="G samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=32, help="qwen3-0.6b: words per prompt")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3, help="timed generate calls per engine")
    p.add_argument("--steps", type=int, default=2, help="timed training steps per engine")
    p.add_argument("--baseline", default="oblr", help="estimator of the update (oblr: exact norms + SNR stats)")
    p.add_argument("--micro-batch-groups", type=int, default=0, help="prompt groups per backward (0 = all)")
    p.add_argument("--engine-options", default="{vllm: {memory_fraction: 0.3}}", metavar="YAML",
                   help="options per engine, as rollout.engine_options")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = leave as is)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--markdown", default=None, help="also write the table to this file")
    p.add_argument("--json", default=None, help="also write the raw results to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.engines.split(",") if args.engines else ENGINES.names()
    runnable = []
    for name in names:
        try:
            check_engine(name)
            runnable.append(name)
        except ValueError as e:
            if args.engines:  # asked for by name: say why not, and stop
                print(f"rollout_engines: {e}", file=sys.stderr)
                return 2
            print(f"[skip] {name}: {e}", file=sys.stderr)
    model, tok, prompts, desc = load(args.model, args.device, args.dtype, args.prompts, args.prompt_tokens,
                                     args.seed)
    results = []
    for name in runnable:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        results.append(bench_engine(name, model, tok, prompts, args))
    header = (f"{desc}; device {args.device}, torch threads {torch.get_num_threads()}; N={args.prompts} prompts x "
              f"G={args.group_size}, max_new_tokens={args.max_new_tokens}, temperature={args.temperature}, "
              f"top_p={args.top_p}; medians of {args.repeats} generate calls and {args.steps} training steps")
    text = table(results, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "model": desc, "results": results}, f, indent=1)
    by = {r["engine"]: r for r in results}
    if "hf" in by and "vllm" in by:
        print(f"vllm/hf generation throughput ratio (completions per second): "
              f"{by['hf']['generate_s'] / by['vllm']['generate_s']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
