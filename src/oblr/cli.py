"""Command line: ``oblr train | eval | export | compare | report | proxy-study | models | tasks``.

Each subcommand's options live beside its implementation (``oblr eval``: :mod:`oblr.evaluate_cli`; ``export``:
:mod:`oblr.export_cli`; ``compare``,
``report``, ``proxy-study``: :mod:`oblr.experiments.runner`; ``models``: :mod:`oblr.models.cli`); this
module assembles the parser, defines ``train`` and ``tasks``, loads plugins (``--plugin MODULE`` and the
``oblr.plugins`` entry points, :mod:`oblr.plugins`) before anything is parsed or validated, and turns bad
input into one line on stderr with exit status 2. ``key=value`` overrides may be given before or after
options; every one of them is validated, and the problems of all of them are reported together. ``--help``,
``oblr tasks`` and every config refusal answer before torch is imported (the registries load without it;
``oblr train`` imports the trainer once the config is valid): tests/core/test_fast_cli.py,
benchmarks/cli_startup.py.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from oblr import __version__


def _train_parser(sub) -> None:
    from oblr.config import config_help
    from oblr.plugins import add_plugin_option

    p = sub.add_parser(
        "train", help="train a policy with OBLR-PO (or any baseline/schedule) from a config",
        description="Train with OBLR-PO. With no arguments: the built-in arithmetic task and tiny model on CPU.\n"
                    "Settings come from --config FILE (YAML) and then dotted overrides key=value.",
        epilog="config keys (override with section.key=value):\n" + config_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides, e.g. optim.lr=1e-3")
    p.add_argument("--config", help="YAML config file (see configs/)")
    p.add_argument("--output-dir", help="run folder (same as train.output_dir=...)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint "
                   "(refused when there is none)")
    p.add_argument("--resume-or-start", action="store_true",
                   help="resume if --output-dir holds a checkpoint, else start from step 0 (for schedulers that requeue)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--nproc", type=int, metavar="K",
                   help="train with K processes on this machine: starts `python -m torch.distributed.run --standalone "
                        "--nproc_per_node K -m oblr.cli train ...` with the other arguments; distributed.strategy "
                        "none becomes ddp; OMP_NUM_THREADS=1 unless set (docs/distributed.md)")
    add_plugin_option(p)
    p.set_defaults(func=_cmd_train)


def _cmd_train(args) -> int:
    from oblr.config import load_config
    from oblr.launch import exec_torchrun, saved_config, strategy_under_torchrun

    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"train.output_dir={args.output_dir}")
    if args.nproc is not None:
        return exec_torchrun(args, overrides)
    cfg = strategy_under_torchrun(load_config(args.config or saved_config(args), overrides),
                                  lambda more: load_config(args.config or saved_config(args), [*overrides, *more]))
    from oblr.train import train  # torch, transformers: only once the config is valid

    train(cfg, resume=args.resume, quiet=args.quiet, or_start=args.resume_or_start)
    return 0


def _tasks_parser(sub) -> None:
    from oblr.plugins import add_plugin_option

    p = sub.add_parser("tasks", help="list the registered names of every choice (tasks, estimators, schedules, ...)")
    add_plugin_option(p)
    p.set_defaults(func=_cmd_tasks)


def _cmd_tasks(args) -> int:
    from oblr.config import choice_fields

    for key, kind, names in choice_fields():
        print(f"{key:<24} {kind + ':':<24} {', '.join(names)}")
    return 0


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<[^`>]*>)?`")  # :func:`~a.b`, :ref:`text <target>`
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)


def plain_text(text: str | None) -> str | None:
    """reStructuredText of a docstring as plain text for ``--help``: ``:func:`x.y``` -> ``x.y`` (``~x.y`` ->
    ``y``), double-backquoted literals -> their text."""
    if not text:
        return text

    def role(m: re.Match) -> str:
        target = m.group(2)
        return target.rsplit(".", 1)[-1] if m.group(1) else target

    return _LITERAL.sub(r"\1", _ROLE.sub(role, text))


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """:func:`plain_text` on the description, epilog and every help line of ``parser`` and its subcommands."""
    parser.description, parser.epilog = plain_text(parser.description), plain_text(parser.epilog)
    for action in parser._actions:
        if action.help not in (None, argparse.SUPPRESS):
            action.help = plain_text(action.help)
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:  # the one-line help of each subcommand
                choice.help = plain_text(choice.help)
            for sub in set(action.choices.values()):
                _plain_help(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oblr", description="OBLR-PO: RL post-training of LLMs with verifiable "
                                     "rewards: a gradient-weighted leave-one-out baseline from exact per-sequence "
                                     "gradient norms and a learning rate set by the gradient SNR.")
    parser.add_argument("--version", action="version", version=f"oblr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _train_parser(sub)
    for modname in ("oblr.evaluate_cli", "oblr.export_cli", "oblr.experiments.runner", "oblr.models.cli"):
        try:
            mod = __import__(modname, fromlist=["register_cli"])
        except ModuleNotFoundError as e:
            if e.name != modname:
                raise
            continue
        mod.register_cli(sub)
    _tasks_parser(sub)
    _plain_help(parser)  # subcommands take docstrings as descriptions: no reST markup in --help
    return parser


def main(argv: list[str] | None = None) -> int:
    from oblr.config import ConfigError
    from oblr.plugins import PluginError, load_plugins, plugins_in_argv

    try:  # before the parser exists: `--help` and validation see the plugins' names
        load_plugins(plugins_in_argv(sys.argv[1:] if argv is None else argv))
    except PluginError as e:
        print(f"oblr: error: {e}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # key=value overrides may come after options (`oblr train a=1 --quiet b=2`): all of them are kept, in
        # order, and validated; anything else unknown is refused (argparse's usage line and exit status 2)
        if hasattr(args, "overrides") and all("=" in a and not a.startswith("-") for a in extra):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "func", None):
        parser.print_help()
        return 0 if argv is None and len(sys.argv) <= 1 else 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        # bad input: one clear line (set OBLR_DEBUG=1 for the traceback)
        if os.environ.get("OBLR_DEBUG"):
            raise
        print(f"oblr: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a run that stopped (a full disk, non-finite steps): what and what is intact
        trainer = sys.modules.get("oblr.train.trainer")  # not imported here: `oblr --help` stays fast
        if trainer is None or not isinstance(e, trainer.TrainingError) or os.environ.get("OBLR_DEBUG"):
            raise
        print(f"oblr: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the machine, not the input: a full disk, a read-only or vanished folder, a quota
        if os.environ.get("OBLR_DEBUG"):
            raise
        where = f" ({e.filename})" if e.filename and str(e.filename) not in str(e) else ""
        print(f"oblr: error: {e}{where} (OBLR_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM during a run (oblr.train.interrupts.Terminated)
        import signal

        if argv is None:  # the process is ending: another Ctrl-C must not cut its exit short with a traceback
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)
        terminated = type(e).__name__ == "Terminated"
        print(f"oblr: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130


def _exit(code: int) -> None:
    """Exit with ``code``; a distributed worker (it initialised a process group) ends through
    :func:`oblr.distributed.env.exit_worker`, which avoids a rare SIGABRT in torch's teardown at exit."""
    env = sys.modules.get("oblr.distributed.env")  # imported only if this process trained
    if env is not None and env.initialised_here():
        env.exit_worker(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
