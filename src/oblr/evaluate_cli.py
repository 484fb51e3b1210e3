"""``oblr eval``: its flags (:func:`register_cli`), what ``--model`` names (:func:`resolve_model_arg`: a model
folder, or a run folder's newest intact checkpoint and its task) and the command (:func:`run_cli`: every flag
checked before the model loads, then :func:`oblr.evaluate.evaluate`). The metrics and the benchmark runs are
:mod:`oblr.evaluate`, whose docstring is the command's ``--help`` description."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

import oblr.evaluate
from oblr.evaluate import _check, _parse_benchmarks, evaluate
from oblr.grading import DEFAULT_TIMEOUT
from oblr.tasks.math import EVAL_BENCHMARKS
from oblr.tasks.templates import TEMPLATES


def resolve_model_arg(model: str) -> tuple[str, dict | None]:
    """``(what to load, the run's config or None)`` for ``oblr eval --model``.

    A folder holding ``config.json`` is a saved model (a checkpoint folder is one) and is loaded as it is. A
    run folder of ``oblr train`` (``config.yaml`` + ``checkpoints/``) gives its newest intact checkpoint
    (:func:`oblr.train.checkpoint.latest_checkpoint`, damaged ones passed over with a warning) and its config
    (a dict, read as saved). Any other folder, or a run folder without a complete checkpoint, is refused with
    one line (``FileNotFoundError``) before any model loads. Anything that is not a folder (``builtin``, a
    hub id, a missing path) is passed on to :func:`oblr.models.load_model_and_tokenizer`, which reports it.
    """
    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return model, None
    is_run = (path / "config.yaml").is_file()
    if not is_run or not (path / "checkpoints").is_dir():
        what = "an oblr run folder without checkpoints/ (it saved no checkpoint)" if is_run else \
            "neither a saved model (no config.json) nor an oblr run folder (config.yaml + checkpoints/step_N)"
        raise FileNotFoundError(f"--model {model}: {what}; pass a run folder, one of its checkpoints/step_N, "
                                f"a model folder saved with save_pretrained, 'builtin' or a hub id")
    from oblr.config import read_config_file
    from oblr.train.checkpoint import latest_checkpoint

    run = read_config_file(path / "config.yaml")
    ckpt = latest_checkpoint(path, warn=lambda msg: print(msg, file=sys.stderr))
    if ckpt is None:
        raise FileNotFoundError(f"--model {model}: run folder with no complete checkpoint under "
                                f"{path / 'checkpoints'} (checkpoints/step_N with trainer_state.pt)")
    if not (ckpt / "config.json").is_file():
        lora = (ckpt / "adapter_config.json").is_file()
        raise FileNotFoundError(f"--model {model}: its last checkpoint {ckpt} holds "
                                f"{'LoRA adapters only' if lora else 'no config.json'}; oblr eval loads full models")
    print(f"[eval] run folder {path}: evaluating its checkpoint {ckpt.name}", file=sys.stderr)
    return str(ckpt), run


def _run_task(run: dict) -> tuple[str, dict, int | None, int | None]:
    """``(task name, task options, eval_size, max_new_tokens)`` of a run's config dict (defaults where the
    saved config lacks a key, as :class:`oblr.config.Config` has them)."""
    from oblr.config import RolloutConfig, TaskConfig

    task = run.get("task") or {}
    rollout = run.get("rollout") or {}
    return (task.get("name", TaskConfig.name), dict(task.get("options") or {}),
            task.get("eval_size", TaskConfig.eval_size), rollout.get("max_new_tokens", RolloutConfig.max_new_tokens))


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``oblr eval`` to an argparse sub-parser set; the handler is ``args.func``."""
    p = subparsers.add_parser("eval", help="evaluate a model on math benchmarks (pass@1, avg@k, maj@k)",
                              description=oblr.evaluate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="run folder of oblr train (its newest checkpoint), checkpoint or model directory, hub id, "
                        "or 'builtin'")
    p.add_argument("--benchmarks", default=None,
                   help=f"comma-separated, from: {','.join(EVAL_BENCHMARKS)} or any registered task (`oblr tasks`); "
                        f"default: the task a run folder trained on, else gsm8k,math500")
    p.add_argument("--n", type=int, default=1, help="samples per problem (k of avg@k / maj@k); default 1")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 = sampling")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="default: a run folder's rollout.max_new_tokens on its task, else 1024")
    p.add_argument("--limit", type=int, default=None,
                   help="first L problems of each benchmark (default: all; a run folder's task: its task.eval_size)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate call")
    p.add_argument("--output-dir", default=None, help="default: eval_out/<model>-<time>")
    p.add_argument("--template", default="auto", choices=TEMPLATES,
                   help="prompt style: chat if the tokenizer has a chat template (auto), base, chat, raw")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16; auto: bfloat16 on GPU")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ...; auto: cuda when available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per symbolic check")
    p.add_argument("--engine", default="hf", help="rollout engine (see `oblr tasks`; default hf)")
    p.add_argument("--engine-options", default="{}", metavar="YAML",
                   help="options of the engine's factory, e.g. '{memory_fraction: 0.3}' (see docs/rollout.md)")
    p.set_defaults(func=run_cli)
    return p


def run_cli(args: argparse.Namespace) -> int:
    from oblr.checks import check_options
    from oblr.distributed.env import resolve_device
    from oblr.models import load_model_and_tokenizer
    from oblr.rollout import ENGINES, check_engine, make_engine
    from oblr.safe_load import load_yaml

    # every flag is checked before the model loads: numbers, device, dtype, benchmarks, engine and its options
    _check(args.n, args.temperature, args.top_p, 1024 if args.max_new_tokens is None else args.max_new_tokens,
           args.limit, args.batch_size, args.template, args.seed, args.timeout)
    if not re.fullmatch(r"auto|(cpu|cuda|mps)(:\d+)?", args.device):
        raise ValueError(f"--device {args.device!r} is not auto, cpu, cuda, cuda:N or mps")
    device = str(resolve_device(args.device))  # e.g. cuda on a machine without CUDA: one line, here
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    model_path, run = resolve_model_arg(args.model)
    limit, max_new_tokens, task_options = args.limit, args.max_new_tokens or 1024, None
    if args.benchmarks is None and run is not None:  # the task the run trained on, as its evaluation saw it
        name, options, eval_size, run_tokens = _run_task(run)
        names, task_options = _parse_benchmarks([name]), {name: options}
        limit = eval_size if limit is None and eval_size else limit
        max_new_tokens = args.max_new_tokens or run_tokens
        print(f"[eval] task {name} of the run (options {options or '{}'}), first {limit} held-out problems, "
              f"max_new_tokens {max_new_tokens}", file=sys.stderr)
    else:
        names = _parse_benchmarks(args.benchmarks or "gsm8k,math500")
    check_engine(args.engine)  # unknown, or missing its package: fails here with one line, before the model loads
    options = load_yaml(args.engine_options, "--engine-options")
    if not isinstance(options, dict):
        raise ValueError(f"--engine-options: expected a mapping like '{{memory_fraction: 0.3}}', got "
                         f"{args.engine_options!r}")
    options = check_options(ENGINES, args.engine, options, "--engine-options")
    out = args.output_dir
    if out is None:
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(args.model).rstrip("/").split("/")[-1]) or "model"
        out = Path("eval_out") / f"{tag}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    model, tokenizer = load_model_and_tokenizer(model_path, dtype=dtype, device=device)
    engine = make_engine(args.engine, model, tokenizer, **{"batch_size": args.batch_size, **options})
    try:
        evaluate(model, tokenizer, names, n=args.n, temperature=args.temperature, top_p=args.top_p,
                 max_new_tokens=max_new_tokens, limit=limit, batch_size=args.batch_size, output_dir=out,
                 template=args.template, seed=args.seed, timeout=args.timeout, engine=engine,
                 task_options=task_options)
    finally:
        engine.close()
    return 0
