"""Symmetric Grams as lower-triangle strips against one full product, at the ghost path's shapes.

The one-pass engine forms a parameter's own Grams (``x x^T``, ``g g^T``: symmetric) as column strips of their
lower triangle (``oblr.gradnorm.strips.sym_strips``): about ``(n + 1) / (2 n)`` of the multiply-adds, but
narrower products, which BLAS runs at a lower rate. This prints, per shape, the time of the full product
and of the strips for several narrowest-strip widths (``MIN_STRIP``), as a ratio in one run on one machine:
what ``strips.MIN_STRIP`` was chosen from.

    python benchmarks/gram_strips.py                 # ~1 minute, 1 thread
    python benchmarks/gram_strips.py --markdown out.md
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from oblr.gradnorm import strips

#: (samples, tokens, width): one row's window of a SmolLM2-135M-shaped layer (hidden 576, MLP 1536), its tied
#: output layer's logit gradient (vocab 49152), whole rows batched, and long rows
SHAPES = [(1, 133, 576), (1, 133, 1536), (1, 100, 49152), (8, 160, 576), (8, 160, 1536), (1, 480, 576),
          (2, 1024, 128), (2, 1024, 512)]
WIDTHS = [16, 32, 48, 64, 128]


def _time(fn, repeats: int) -> float:
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def run(repeats: int, widths: list[int]) -> list[dict]:
    rows = []
    saved = strips.MIN_STRIP
    try:
        for shape in SHAPES:
            x = torch.randn(*shape)
            full = _time(lambda x=x: torch.bmm(x, x.transpose(1, 2)), repeats)
            row = {"shape": shape, "full_ms": 1e3 * full, "ratios": {}}
            for w in widths:
                strips.MIN_STRIP = w
                row["ratios"][w] = _time(lambda x=x: strips.sym_strips(x), repeats) / full
                row.setdefault("work", {})[w] = strips.strip_entries(shape[1]) / shape[1] ** 2
            rows.append(row)
            print(f"  {shape}: full {1e3 * full:.3f} ms, strips/full "
                  + ", ".join(f"{w}: {r:.2f}" for w, r in row["ratios"].items()), flush=True)
    finally:
        strips.MIN_STRIP = saved
    return rows


def markdown(rows: list[dict], widths: list[int], header: str) -> str:
    out = [header, "",
           "| samples, tokens, width | full product (ms) | " + " | ".join(f"strips >= {w}: time (work)" for w in widths)
           + " |", "|---|---:|" + "---:|" * len(widths)]
    for r in rows:
        cells = " | ".join(f"{r['ratios'][w]:.2f} ({r['work'][w]:.2f})" for w in widths)
        out.append(f"| {r['shape']} | {r['full_ms']:.3f} | {cells} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="narrowest-strip widths to try")
    ap.add_argument("--markdown", help="also write the table as markdown to FILE")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    widths = [int(w) for w in args.widths.split(",")]
    rows = run(args.repeats, widths)
    header = (f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}; GRAM_STRIPS = "
              f"{strips.GRAM_STRIPS}, shipped MIN_STRIP = {strips.MIN_STRIP}. Time of the strips over the full "
              "product's; in brackets the strips' share of the full product's multiply-adds")
    text = markdown(rows, widths, header)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
