"""Wall time of the command line's quick answers, next to the time of ``import torch`` on the same machine.

``oblr --help``, ``oblr train --help`` and a config refusal (``oblr train optim.lr=inf``) answer without
importing torch (tests/core/test_fast_cli.py checks that); this measures how long they take, each in a
fresh interpreter, median of ``--repeats`` runs, with ``python -c "import torch"`` timed in the same run.
On a shared, noisy machine the ratio to the torch import is the figure to compare.

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = [
    ("python -m oblr --help", ["-m", "oblr", "--help"], 0),
    ("python -m oblr train --help", ["-m", "oblr", "train", "--help"], 0),
    ("python -m oblr train optim.lr=inf", ["-m", "oblr", "train", "optim.lr=inf"], 2),
    ('python -c "import torch"', ["-c", "import torch"], 0),
]


def wall_time(args: list[str], expect: int) -> float:
    """Seconds from start to exit of ``python args`` (its exit status must be ``expect``)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != expect:
        raise SystemExit(f"python {' '.join(args)} exited {r.returncode}, expected {expect}: "
                         f"{r.stderr.strip()}")
    return dt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="runs per command (the median is reported)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    times = {label: [] for label, _, _ in COMMANDS}
    for _ in range(args.repeats):  # interleaved, so a burst of load on the machine touches every command
        for label, cmd, expect in COMMANDS:
            times[label].append(wall_time(cmd, expect))
    torch_s = statistics.median(times[COMMANDS[-1][0]])
    print(f"{'command':<38} {'median s':>9} {'min s':>7} {'/ import torch':>15}")
    for label, _, _ in COMMANDS:
        med = statistics.median(times[label])
        print(f"{label:<38} {med:>9.2f} {min(times[label]):>7.2f} {med / torch_s:>15.2f}")
    print(f"({args.repeats} runs each, {os.cpu_count()} CPU cores, Python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
