"""Step-time ratio OBLR-PO/GRPO from FLOP counts (``oblr.flop_model``): against the committed CPU measurements,
and projected to Qwen3.

    python benchmarks/flop_ratios.py                    # both tables to stdout
    python benchmarks/flop_ratios.py --doc docs/scale.md  # and (re)write its FLOP section in docs/scale.md

Measured side: every ``step_cost.py`` table (a ``**case**`` line, then the ``| method | step time ...``
table) in the files of ``--results`` (default ``benchmarks/results/step_cost/*.md``, not its ``noisy/``
folder of runs too loaded to read a ratio from, and the whole-batch
table of ``docs/performance.md``). The case line names the shape; the rest is ``step_methods.Case``'s
defaults (4 heads, 2 KV heads, MLP 3x hidden) unless it names them. Predicted side: ``flop_model.time_ratio`` for the same shape,
padded length and groups, float32 factors, attention counted over the full square (the CPU kernel with a
padding mask). Nothing is measured here; the script reads committed numbers and needs no torch.

Projection: bf16 activations (the one-pass engine's keep-dense rule compares bytes), causal attention
kernels (half the square), groups of G = 8 responses, T = the response tokens (prompt not added, as in the
memory projection). FLOPs are linear in the micro-batch, so the ratios do not depend on its size.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from oblr import flop_model as fm  # noqa: E402
from oblr import memory_model as mm  # noqa: E402

DEFAULT_RESULTS = [ROOT / "benchmarks/results/step_cost", ROOT / "docs/performance.md"]
BEGIN, END = "<!-- flop_ratios: begin -->", "<!-- flop_ratios: end -->"
CASE_RE = re.compile(r"hidden (\d+), (\d+) layers, vocab (\d+) \((tied|untied)\); T = (\d+)\+(\d+); "
                     r"B = (\d+)x(\d+)(?:; micro-batches of (\d+) sequences)?"
                     r"(?:; heads (\d+)/(\d+) of (\d+), MLP (\d+))?")
TABLE_HEAD = "| method | step time (s, median) | time / GRPO |"
PROJ_G = 8
PROJ_TOKENS = (1024, 4096, 8192)

def reading(rows: list[dict]) -> str:
    """What the comparison shows, with the numbers taken from ``rows``."""
    def span(sel):
        q = [r["measured"] / r["predicted"] for r in rows if sel(r)]
        return f"{min(q):.2f}-{max(q):.2f}" if q else "-"

    whole = lambda r: r["plan"] == "oblr" and "micro-batches" not in r["case"]  # noqa: E731
    ckpt = lambda r: r["plan"].endswith("_ckpt")  # noqa: E731
    micro = [r for r in rows if "micro-batches" in r["case"]]
    pair = [r for r in rows if r["plan"] == "oblr_ckpt" and r["base"] == "grpo_ckpt"]
    rec = [r for r in rows if r["plan"] == "oblr_recompute" and r["base"] == "grpo_ckpt"]
    text = [
        "Reading (measured / model, per row above). The model assumes step time proportional to FLOPs. For the "
        f"one-pass `oblr` step with whole batches measured/model is {span(whole)}: it gets the regimes right "
        "(extra work at T = 32+64, where ghost Grams and per-group products are real extra products; none once T "
        "exceeds the width, where each per-row gradient is kept dense and its product replaces the "
        "weight-gradient product), not every ratio to within noise (+-0.1 on this shared machine). The lowest "
        "row is the one-pass step of the deep, long checkpointing case, which ran faster than GRPO although "
        "the FLOPs are equal: GRPO's products ran at fewer GFLOP/s there (implied throughput column); why "
        "was not profiled.",
        f"With activation checkpointing measured/model is {span(ckpt)}: the model counts every recomputed and "
        "extra product in full, but a CPU step also spends time that is not in products -- log-softmax and its "
        "backward over the vocabulary for every token, RMSNorm, rotary, activations, allocation -- part of which "
        "every plan pays once; that part pulls the measured ratios towards 1.",
    ]
    def at(r):  # "T = 32+992, vocab 4096"
        parts = r["case"].split("; ")
        vocab = next((p.split("vocab ")[1].split(" ")[0] for p in parts if "vocab " in p), None)
        return (parts[1] if len(parts) > 1 else r["case"]) + (f", vocab {vocab}" if vocab else "")

    if pair:
        each = "; ".join(f"{r['predicted']:.2f} predicted, {r['measured']:.2f} measured at {at(r)}" for r in pair)
        text.append(f"The checkpointed OBLR-PO step against the checkpointed GRPO step (`oblr_ckpt` / `grpo_ckpt`): "
                    f"{each}.")
        close = [r for r in pair if abs(r["measured"] / r["predicted"] - 1) <= 0.1]
        if close and len(close) < len(pair):
            text.append("The model over-predicts where the work outside products weighs most (the shorter "
                        "response, the larger vocabulary, whose log-softmax every plan pays) and matches within "
                        "10 % where the products dominate: the measured ratio approaches the FLOP ratio as T "
                        "grows relative to the vocabulary.")
    if rec:
        each = "; ".join(f"{r['predicted']:.2f} predicted, {r['measured']:.2f} measured at {at(r)}" for r in rec)
        text.append(f"The recompute engine against the checkpointed GRPO step (`oblr_recompute` / `grpo_ckpt`): "
                    f"{each} (measured/model {span(lambda r: r in rec)}). Its extra FLOPs are small: the per-row "
                    "products of the one-pass engine replace the weight-gradient products, and its recomputation is "
                    "whole where GRPO's stops before a layer's last product; no second backward. The measured "
                    "ratios follow the FLOP ratio to within the noise of this machine.")
    if micro:
        r = micro[0]
        text.append(f"The micro-batched case goes the other way ({r['measured']:.2f} measured, {r['predicted']:.2f} "
                    "predicted): FLOPs are linear in the batch, so micro-batching costs nothing in the model, "
                    "while on CPU every micro-batch pays per-call overheads and runs smaller, slower products.")
    gpu = {(n, T): (fm.time_ratio(mm.QWEN3[n], "oblr", 4, T, 2, attn_factor=0.5, factor_bytes=2),
                    fm.time_ratio(mm.QWEN3[n], "oblr_recompute", 4, T, 2, base="grpo_ckpt", attn_factor=0.5,
                                  factor_bytes=2))
           for n, T in (("Qwen3-0.6B", 1024), ("Qwen3-4B", 1024), ("Qwen3-4B", 4096))}
    text.append("On one GPU (an H200, bf16, 4 sequences; docs/performance.md) every measured ratio is above the FLOP "
                "model's: the two-pass pair measured 2.1-2.3 at Qwen3-4B shapes (1024 or 4096 tokens; model 1.84); "
                "the recompute engine against the checkpointed GRPO step 1.75 at Qwen3-0.6B and 1.74 at Qwen3-4B "
                f"with 1024 tokens (model {gpu['Qwen3-0.6B', 1024][1]:.2f} and {gpu['Qwen3-4B', 1024][1]:.2f}), "
                f"1.40-1.42 at Qwen3-4B with 4096 (model {gpu['Qwen3-4B', 4096][1]:.2f}); the one-pass step 1.78 "
                f"and 1.88 (model {gpu['Qwen3-0.6B', 1024][0]:.2f} and {gpu['Qwen3-4B', 1024][0]:.2f}). There the "
                "engine's many small operations (per-row products and reductions, launched one by one) and its "
                "float32 products weigh more than their FLOPs; the FLOP ratios below are lower bounds for a GPU.")
    return " ".join(text)


def projection_note(group: int = PROJ_G) -> str:
    kw = dict(attn_factor=0.5, factor_bytes=2)
    ck = [fm.time_ratio(s, "oblr_ckpt", group, t, group, base="grpo_ckpt", **kw)
          for s in mm.QWEN3.values() for t in PROJ_TOKENS]
    rc = [fm.time_ratio(s, "oblr_recompute", group, t, group, base="grpo_ckpt", **kw)
          for s in mm.QWEN3.values() for t in PROJ_TOKENS]
    one = {(n, t): fm.time_ratio(s, "oblr", group, t, group, **kw) for n, s in mm.QWEN3.items() for t in PROJ_TOKENS}
    worst = max(one, key=one.get)
    return (f"The checkpointed OBLR-PO step projects to {min(ck):.2f}-{max(ck):.2f}x a checkpointed GRPO step: one "
            "forward and one activation-only backward more (the norm pass recomputes every layer, the gradient pass "
            "recomputes it again). By FLOPs that is above the 1.5x goal of issue 26 (the CPU cases above measured "
            f"it at or below its FLOP ratio). The recompute engine projects to {min(rc):.2f}-{max(rc):.2f}x a "
            "checkpointed GRPO step (the one-pass engine's extra work below plus a whole recomputation); what it "
            "pays instead is memory, the kept per-row gradients (the memory projection above). Without checkpointing the one-pass engine adds little at long responses; where it "
            "adds more, it is its keep-dense rule in bf16: a per-row gradient is kept dense only when its float32 "
            "size is at most the bf16 factors' (`T >= 2RC/(R+C)`), and below that a weight's per-row norms cost a "
            f"ghost Gram or a second product (largest: {worst[0]} at {worst[1]} tokens, {one[worst]:.2f}x).")


def parse_tables(paths: list[Path]) -> list[dict]:
    """``[{source, case, rows: {method: (median_s, ratio)}}]`` from every step_cost table in ``paths``."""
    files = []
    for p in paths:
        if p.is_dir():
            files += sorted(p.glob("*.md"))
        elif p.is_file():
            files.append(p)
        else:
            raise SystemExit(f"flop_ratios: --results {p}: no such file or folder")
    out = []
    for f in files:
        lines = f.read_text().splitlines()
        case = None
        for i, line in enumerate(lines):
            if line.startswith("**") and CASE_RE.search(line):
                case = CASE_RE.search(line).group(0)
            if line.startswith(TABLE_HEAD):
                if case is None:
                    raise SystemExit(f"flop_ratios: {f}:{i + 1}: a step_cost table with no **case** line before it")
                rows = {}
                for row in lines[i + 2:]:
                    if not row.startswith("|"):
                        break
                    cells = [c.strip() for c in row.strip("|").split("|")]
                    if cells[1] != "-":
                        rows[cells[0]] = (float(cells[1]), float(cells[2]))
                if "grpo" not in rows:
                    raise SystemExit(f"flop_ratios: {f}:{i + 1}: table without a grpo row")
                out.append(dict(source=f.relative_to(ROOT).as_posix() if f.is_relative_to(ROOT) else f.name,
                                case=case, rows=rows))
                case = None
    if not out:
        raise SystemExit(f"flop_ratios: no step_cost tables in {', '.join(map(str, paths))}")
    return out


def case_shape(case: str) -> tuple[mm.Shape, int, int, int]:
    """(shape, rows B, padded tokens T, group G) of a ``step_methods.Case`` name."""
    if "; LoRA" in case:
        raise ValueError(f"{case!r}: the FLOP model counts full fine-tuning, not LoRA; keep LoRA tables out of "
                         "--results")
    m = CASE_RE.fullmatch(case)
    if not m:
        raise ValueError(f"not a step_cost case name: {case!r}")
    h, layers, vocab, tie, p, r, n, g = m.groups()[:8]
    h = int(h)
    heads, kv, hd, inter = (int(x) for x in m.groups()[9:13]) if m.group(10) else (4, 2, h // 4, 3 * h)
    s = mm.Shape(int(layers), h, inter, heads, kv, hd, int(vocab), tie == "tied")
    return s, int(n) * int(g), int(p) + int(r), int(g)


def comparison_rows(tables: list[dict]) -> list[dict]:
    out = []
    for t in tables:
        s, B, T, G = case_shape(t["case"])
        rows = t["rows"]
        pairs = [(p, "grpo") for p in mm.PLANS if p in rows and p != "grpo"]
        pairs += [(p, "grpo_ckpt") for p in ("oblr_ckpt", "oblr_recompute") if p in rows and "grpo_ckpt" in rows]
        for plan, base in pairs:
            measured = rows[plan][0] / rows[base][0]
            pred = fm.time_ratio(s, plan, B, T, G, base=base, device="cpu")  # measured on CPU: the engine's strips
            out.append(dict(source=t["source"], case=t["case"], plan=plan, base=base, measured=measured, predicted=pred,
                            gflops=fm.total_flops(s, plan, B, T, G, device="cpu") / rows[plan][0] / 1e9,
                            base_gflops=fm.total_flops(s, base, B, T, G, device="cpu") / rows[base][0] / 1e9))
    return out


def comparison_table(rows: list[dict]) -> str:
    out = ["| source | case | ratio | measured (CPU) | FLOP model | measured / model | implied GFLOP/s (plan, base) |",
           "|---|---|---|---:|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r['source']} | {r['case']} | {r['plan']} / {r['base']} | {r['measured']:.2f} | "
                   f"{r['predicted']:.2f} | {r['measured'] / r['predicted']:.2f} | "
                   f"{r['gflops']:.1f}, {r['base_gflops']:.1f} |")
    return "\n".join(out)


def projection_table(tokens=PROJ_TOKENS, group: int = PROJ_G) -> str:
    kw = dict(attn_factor=0.5, factor_bytes=2)
    out = ["| model | response tokens | oblr / grpo | grpo_ckpt / grpo | oblr_ckpt / grpo_ckpt | oblr_ckpt / grpo | "
           "oblr_recompute / grpo_ckpt | oblr_recompute / grpo | grpo TFLOP per sequence |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in mm.QWEN3.items():
        for t in tokens:
            r = {p: fm.time_ratio(s, p, group, t, group, **kw) for p in mm.PLANS}
            ck = fm.time_ratio(s, "oblr_ckpt", group, t, group, base="grpo_ckpt", **kw)
            rc = fm.time_ratio(s, "oblr_recompute", group, t, group, base="grpo_ckpt", **kw)
            tf = fm.total_flops(s, "grpo", group, t, group, **kw) / group / 1e12
            out.append(f"| {name} | {t} | {r['oblr']:.2f} | {r['grpo_ckpt']:.2f} | {ck:.2f} | {r['oblr_ckpt']:.2f} "
                       f"| {rc:.2f} | {r['oblr_recompute']:.2f} | {tf:.1f} |")
    return "\n".join(out)


def render(tables: list[dict]) -> str:
    rows = comparison_rows(tables)
    return "\n".join([
        BEGIN,
        "## Step time from FLOP counts (`oblr.flop_model`)", "",
        "Generated by `python benchmarks/flop_ratios.py --doc docs/scale.md` (this section only; "
        "`benchmarks/memory.py --doc` keeps it). FLOPs as `torch.utils.flop_counter` counts them (matrix products "
        "and attention; the model matches the counter on real steps of tiny Qwen3 models for all five plans, "
        "tests/core/test_flop_model.py); a predicted time ratio is a FLOP ratio.", "",
        "### FLOP-predicted against measured step-time ratios (CPU, committed step_cost tables)", "",
        "Measured: median step time of the plan over the base's, from the table named in the first column "
        "(1 thread, float32). Implied GFLOP/s: the model's FLOPs over the measured time.", "",
        comparison_table(rows), "",
        reading(rows), "",
        "### Projection (FLOP model only; the GPU runs are in docs/performance.md)", "",
        f"bf16, causal attention (half the `T x T` square), groups of G = {PROJ_G}, T = the response tokens. "
        "grpo TFLOP per sequence: the model's FLOPs of one GRPO step per sequence.", "",
        projection_table(), "",
        projection_note(),
        END,
    ])


def write_doc(path: Path, block: str) -> None:
    """Replace the block between the markers in ``path`` (append it if absent)."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, nargs="+", default=DEFAULT_RESULTS,
                    help="step_cost markdown files or folders of them (default: benchmarks/results/step_cost "
                         "and docs/performance.md)")
    ap.add_argument("--doc", type=Path, default=None, help="(re)write the FLOP section of this file (docs/scale.md)")
    args = ap.parse_args(argv)
    block = render(parse_tables(args.results))
    print(block)
    if args.doc:
        write_doc(args.doc, block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
