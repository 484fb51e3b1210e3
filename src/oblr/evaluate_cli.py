"""``oblr eval``: its flags (:func:`register_cli`), what ``--model`` names (:func:`resolve_model_arg`: a model
folder, or a run folder's newest intact checkpoint and its task; :func:`lora_base`: the base model a LoRA
checkpoint's adapters attach to) and the command (:func:`run_cli`: every flag
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


def resolve_model_arg(model: str, command: str = "eval") -> tuple[str, dict | None]:
    """``(what to load, the run's config or None)`` for ``oblr eval --model`` (and ``oblr export --model``: its
    ``command`` name prefixes the line saying which checkpoint a run folder gives).

    A folder holding ``config.json`` is a saved model (a checkpoint folder is one) and is loaded as it is. A
    run folder of ``oblr train`` (``config.yaml`` + ``checkpoints/``) gives its newest intact checkpoint
    (:func:`oblr.train.checkpoint.latest_checkpoint`, damaged ones passed over with a warning) and its config
    (a dict, read as saved). A LoRA checkpoint (``adapter_config.json``, no ``config.json``) is returned as it is,
    with the config of the run that holds it when it lies in one (``RUN/checkpoints/step_N``): :func:`lora_base`
    finds its base model. Any other folder, or a run folder without a complete checkpoint, is refused with
    one line (``FileNotFoundError``) before any model loads. Anything that is not a folder (``builtin``, a
    hub id, a missing path) is passed on to :func:`oblr.models.load_model_and_tokenizer`, which reports it.
    """
    path = Path(model).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return model, None
    if _is_adapter(path):  # a LoRA checkpoint given directly: the run it belongs to, if any, names its base
        owner = path.parent.parent
        if path.parent.name == "checkpoints" and (owner / "config.yaml").is_file():
            from oblr.config import read_config_file

            return model, read_config_file(owner / "config.yaml")
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
    if not (ckpt / "config.json").is_file() and not _is_adapter(ckpt):
        raise FileNotFoundError(f"--model {model}: its last checkpoint {ckpt} holds neither a model (config.json) "
                                f"nor LoRA adapters (adapter_config.json)")
    print(f"[{command}] run folder {path}: {'evaluating' if command == 'eval' else 'its'} checkpoint {ckpt.name}"
          f"{' (LoRA adapters)' if _is_adapter(ckpt) else ''}", file=sys.stderr)
    return str(ckpt), run


def _is_adapter(path: Path) -> bool:
    """A folder of LoRA adapters only (peft's ``save_pretrained``): ``adapter_config.json``, no ``config.json``."""
    return (path / "adapter_config.json").is_file() and not (path / "config.json").is_file()


def lora_base(adapter_dir: str, run: dict | None, base: str | None = None) -> str:
    """The base model the LoRA adapters in ``adapter_dir`` attach to: ``base`` when given (``--base-model``),
    else the ``model.name_or_path`` of the run that trained them (plain ``builtin`` read as the run's task's
    built-in model, as training read it), else the ``base_model_name_or_path`` peft wrote into
    ``adapter_config.json``. When the run recorded the fingerprint of the weights it started from
    (``code.json``'s ``start_model``) and the base named here is a local folder with other weights, refused
    with one line (adapters trained on one base are wrong on another)."""
    import json

    from oblr.config import ModelConfig, TaskConfig
    from oblr.models.task_builtins import builtin_for_task

    if base is None and run is not None:
        name = (run.get("model") or {}).get("name_or_path", ModelConfig.name_or_path)
        base = builtin_for_task(name, (run.get("task") or {}).get("name", TaskConfig.name))
    if base is None:
        try:
            base = json.loads((Path(adapter_dir) / "adapter_config.json").read_text()).get("base_model_name_or_path")
        except (OSError, ValueError):
            base = None
    if not base:
        raise FileNotFoundError(f"--model {adapter_dir}: LoRA adapters with no base model named (no run config.yaml "
                                f"two folders up, no base_model_name_or_path in adapter_config.json); pass "
                                f"--base-model PATH_OR_ID")
    _check_start_model(adapter_dir, base)
    return str(base)


def _check_start_model(adapter_dir: str, base: str) -> None:
    """Refuse a base whose local weights are not the ones the adapters' run started from (when both are known)."""
    import json

    from oblr.models import resolve_model_path
    from oblr.provenance import model_fingerprint

    code = Path(adapter_dir).parent.parent / "code.json"
    try:
        recorded = (json.loads(code.read_text()).get("start_model") or {}).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return
    if not recorded:
        return
    now = model_fingerprint(resolve_model_path(base))
    if now is not None and now != recorded:
        raise ValueError(f"--model {adapter_dir}: its run started from other weights (fingerprint {recorded[:12]}) "
                         f"than the base model {base} holds now ({now[:12]}); the adapters only fit their own base: "
                         f"pass --base-model with that base")


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
    p.add_argument("--base-model", default=None,
                   help="the base model of a LoRA checkpoint's adapters; default: the model its run trained "
                        "(the run's config.yaml), else the base named in adapter_config.json")
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
    base = None
    if _is_adapter(Path(model_path)):
        base = lora_base(model_path, run, args.base_model)
        print(f"[eval] LoRA adapters {model_path} on the base model {base}", file=sys.stderr)
    elif args.base_model is not None:
        raise ValueError(f"--base-model {args.base_model}: --model {args.model} is not a LoRA checkpoint "
                         f"(only adapters take a base model)")
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
    if _is_adapter(Path(model_path)):
        from oblr.models import load_lora_checkpoint

        model, tokenizer = load_lora_checkpoint(model_path, base, dtype=dtype, device=device)
    else:
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
