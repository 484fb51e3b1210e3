"""Build the three built-in models from their recipes and ship them in the package (src/oblr/models/weights).

    python scripts/ship_builtin_models.py --work runs/builtin-builds            # build all three (1 thread each), ship
    python scripts/ship_builtin_models.py --work runs/builtin-builds --only builtin:tiny-arith
    python scripts/ship_builtin_models.py --work runs/builtin-builds --no-build  # ship builds already in --work

Each model is built by its recipe (:func:`oblr.models.builtin.build_builtin_model`,
:func:`oblr.models.task_builtins.build_task_model`) with one torch thread, then copied with its metadata into
``src/oblr/models/weights/<dirname>`` and recorded in ``MANIFEST.json`` (every file's sha256, the measured start
accuracy, the recipe, the library versions): :func:`oblr.models.shipped.ship`. Shipping new bytes changes every
number measured from them: re-measure the documented results afterwards (docs/builtin.md says which).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True, help="folder for the builds (one sub-folder per model)")
    ap.add_argument("--only", action="append", default=None, help="a built-in name; repeatable (default: all)")
    ap.add_argument("--no-build", action="store_true", help="ship the builds already in --work")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    from oblr.models.builtin import build_builtin_model
    from oblr.models.cli import builtin_entries
    from oblr.models.shipped import ship
    from oblr.models.task_builtins import build_task_model, spec_of

    names = dict(builtin_entries())
    for name in args.only or list(names):
        if name not in names:
            ap.error(f"unknown built-in model {name!r}; built-in models: {', '.join(names)}")
        out = Path(args.work) / names[name]
        if not args.no_build:
            spec = spec_of(name)
            if spec is not None:
                build_task_model(spec.task, out, overwrite=True)
            else:
                build_builtin_model(out, overwrite=True)
        ent = ship(out, names[name])
        print(f"{name}: shipped, weights sha256 {ent['weights_sha256']}, sampled {ent['accuracy_sampled_t1']:.1%}, "
              f"greedy {ent['accuracy_greedy']:.1%}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
