"""Per-row token windows against one cropped span: which is faster, and what ``windows.ROW_DISPATCH_MACS`` decides.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/window_cost.py            # the table (about a minute)
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/window_cost.py --reps 7 --out FILE.md

The one-pass engine skips each row's zero-gradient tokens (padding after a row's end; an output head's prompt)
exactly, in one of two ways (:func:`oblr.gradnorm.windows.trim_windows`): (a) per-row windows, where the ghost
norm and the per-group products loop over rows (each row's tokens only, one set of operators per row), or (b)
one span holding every row's window crops the factors, and every query stays batched over rows (the zero tokens
inside the span are multiplied, the operators are few). (a) saves multiply-adds, (b) saves host dispatch.
The engine keeps (a) where the multiply-adds it saves exceed ``ROW_DISPATCH_MACS`` per row
(:func:`oblr.gradnorm.windows.row_windows_pay`).

Each case is one linear layer's contribution (an Outer of K rows x T tokens, output gradient R wide, input C
wide) whose rows have random windows filling ``fill`` of the span on average; per path, the median time of one
per-row norm query (``sq_norm`` over rows, as ``w_i``) plus one per-group product (``grouped_sums`` over groups
of 8 rows, as the weighted gradient and the group norms), after one warm-up. Both paths give the same numbers
(relative difference printed). Columns: the measured ratio (a)/(b) and the model's choice; a row where the
model picks the slower path by more than 20 % is marked. The last two columns time the searches that find the
windows: every row's window (:func:`oblr.gradnorm.windows.token_windows`, what path (a) needs) and the rows' common
span alone (:func:`oblr.gradnorm.windows.token_span`, all that path (b) needs; the engine uses it where no row's
window could pay), which agree on the span. A ratio on a shared machine: read its direction.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from oblr.gradnorm import windows
from oblr.gradnorm.assembly import grouped_sums, sq_norm
from oblr.gradnorm.contrib import Grouping, Outer

#: (K rows, T tokens, R, C, fill): the built-in model at the paper's 128 x 8 and at the default 16 x 8, then wider
#: layers and longer rows, where the windows' savings grow with R C
CASES = [
    (1024, 24, 128, 128, 0.5), (1024, 24, 512, 128, 0.5), (1024, 24, 32, 128, 0.35),
    (128, 40, 128, 128, 0.5), (128, 40, 512, 128, 0.5),
    (64, 160, 576, 576, 0.5), (64, 160, 1536, 576, 0.5),
    (32, 512, 128, 128, 0.3), (32, 512, 512, 512, 0.3),
]


def make(K: int, T: int, R: int, C: int, fill: float, seed: int = 0) -> tuple[Outer, tuple[list[int], list[int]]]:
    """An Outer whose rows are zero outside random windows (lengths about ``fill`` T, the first row full)."""
    gen = torch.Generator().manual_seed(seed)
    left = torch.randn(K, T, R, generator=gen)
    lens = (torch.rand(K, generator=gen) * 2 * fill * T).clamp(1, T).long()
    lens[0] = T
    starts = (torch.rand(K, generator=gen) * (T - lens + 1)).long()
    first, last = starts.tolist(), (starts + lens).tolist()
    mask = torch.zeros(K, T, dtype=torch.bool)
    for k in range(K):
        mask[k, first[k]:last[k]] = True
    left[~mask] = 0
    return Outer(left, torch.randn(K, T, C, generator=gen), (R, C)), (first, last)


def timed(c: Outer, grp: Grouping, reps: int) -> tuple[float, torch.Tensor]:
    out = None
    times = []
    for i in range(reps + 1):
        t = time.perf_counter()
        w = sq_norm([c], "ghost")
        sq, total = grouped_sums([c], grp)
        if i:
            times.append(time.perf_counter() - t)
        out = torch.cat([w, sq, total.flatten()])
    return statistics.median(times), out


def timed_search(fn, c: Outer, reps: int) -> tuple[float, object]:
    """The median time of ``fn(c)`` over ``reps`` calls after one warm-up, and its result."""
    times, out = [], None
    for i in range(reps + 1):
        t = time.perf_counter()
        out = fn(c)
        if i:
            times.append(time.perf_counter() - t)
    return statistics.median(times), out


def run(reps: int) -> list[str]:
    lines = ["| K | T | R | C | fill | per-row windows (ms) | cropped span (ms) | ratio | model keeps windows | "
             "same numbers (rel. diff) | search: every row's window (ms) | search: the span (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for K, T, R, C, fill in CASES:
        c, win = make(K, T, R, C, fill)
        grp = Grouping.from_groups(torch.randn(K), torch.arange(K) // 8)
        rowwise = Outer(c.left, c.right, c.shape, win)
        t_a, a = timed(rowwise, grp, reps)
        t_b, b = timed(Outer(c.left, c.right, c.shape), grp, reps)
        keep = windows.row_windows_pay(c, *win)
        ratio = t_a / t_b
        wrong = (keep and ratio > 1.2) or (not keep and ratio < 1 / 1.2)
        diff = float((a - b).norm() / b.norm())
        t_w, found = timed_search(windows.token_windows, c, reps)
        t_s, span = timed_search(windows.token_span, c, reps)
        fw, lw = found or ([0] * K, [T] * K)
        live = [k for k in range(K) if lw[k] > fw[k]]
        if span != (min(fw[k] for k in live), max(lw[k] for k in live)):
            raise SystemExit(f"window_cost: token_span {span} is not the span of token_windows (case {K}x{T})")
        lines.append(f"| {K} | {T} | {R} | {C} | {fill} | {1e3 * t_a:.1f} | {1e3 * t_b:.1f} | {ratio:.2f} | "
                     f"{'yes' if keep else 'no'}{' (slower path)' if wrong else ''} | {diff:.1e} | "
                     f"{1e3 * t_w:.2f} | {1e3 * t_s:.2f} |")
        print(lines[-1], flush=True)
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="also write the table as markdown to FILE")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    head = (f"torch {torch.__version__}, {torch.get_num_threads()} thread, ROW_DISPATCH_MACS = "
            f"{windows.ROW_DISPATCH_MACS:,}; ratio = per-row windows / cropped span (> 1: the span is faster)")
    print(head)
    lines = run(args.reps)
    if args.out:
        cmd = "PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/window_cost.py" + (
            f" --reps {args.reps}" if args.reps != 3 else "")
        args.out.write_text(f"# Per-row token windows against a cropped span\n\n    {cmd}\n\n{head}\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
