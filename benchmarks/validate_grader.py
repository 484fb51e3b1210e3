"""Full grader validation: every gold answer / gold solution of every built-in set vs its reference.

    python benchmarks/validate_grader.py [--workers 2] [--timeout 5] [--json out.json]

Prints agreement per benchmark and every miss; the numbers in docs/grading.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from oblr.grading import GraderPool
from oblr.grading.validate import REQUIRED, run_validation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--benchmarks", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    pool = GraderPool(args.workers)
    t0 = time.perf_counter()
    res = run_validation(args.benchmarks.split(",") if args.benchmarks else None, timeout=args.timeout, pool=pool)
    total = time.perf_counter() - t0
    print(f"{'benchmark':<15}{'type':<14}{'cases':>7}{'correct':>9}{'agreement':>11}")
    for name, r in res.items():
        for t, (n, c) in sorted(r["by_type"].items()):
            print(f"{name:<15}{t:<14}{n:>7}{c:>9}{100 * c / n:>10.2f}%")
    for name, r in res.items():
        req = [(n, c) for t, (n, c) in r["by_type"].items() if t in REQUIRED]
        n, c = sum(x[0] for x in req), sum(x[1] for x in req)
        print(f"{name:<15} required (gold vs reference): {c}/{n} = {100 * c / n:.2f}%   all: "
              f"{100 * r['agreement']:.2f}%   {r['seconds']:.1f}s")
    print(f"total {total:.1f}s, {args.workers} worker(s), timeout {args.timeout}s, worker restarts {pool.restarts}, "
          f"{platform.processor() or platform.machine()}")
    for name, r in res.items():
        for what, line, tail, ref, status in r["misses"]:
            print(f"MISS {name} {what} line {line} [{status}] ref={ref!r} response=...{tail!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"total_seconds": total, "results": res}, f, indent=1, default=str)
    pool.close()


if __name__ == "__main__":
    main()
