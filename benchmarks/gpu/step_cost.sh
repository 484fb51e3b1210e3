#!/usr/bin/env bash
# Issue 41's update-cost cases on one GPU, in one command, under 10 minutes in all. NOT RUN YET: it was written
# in a session without a GPU and has only run on CPU with its cases truncated
# (tests/scripts/test_step_cost_real.py); no number in this repository comes from it until a lent GPU runs it.
#   1. the SmolLM2-135M-shaped case (benchmarks/step_cost.py --cases 7 --methods oblr: 30 layers, hidden 576,
#      N = 2, G = 4, 32 + 128 tokens), GRPO against the one-pass engine, bf16, 3 interleaved repeats;
#   2. the real-micro-batch cases (benchmarks/step_cost_real.py; `--real all`): Qwen3-0.6B- and Qwen3-4B-shaped
#      random-init models, T = 1024 and 4096, 4 and 16 sequences per micro-batch, full fine-tuning and LoRA
#      (r = 16, q/k/v/o), without checkpointing (GRPO against the one-pass engine) and with it (checkpointed
#      GRPO against the engine the planner picks, recompute or two-pass, the output layer in chunks when the whole
#      one would not fit); the micro-batches of 4 first, then those of 16. A case the memory model says would not
#      fit the device is skipped with one line; one whose estimated time exceeds what is left of
#      $BUDGET2 seconds is not started.
# Every result is written as it comes ($OUT/*.json and *.md are rewritten after each case) and each step runs
# under its own `timeout`, so a run cut short keeps what it did. Budget: LIMIT1 (default 90 s) + LIMIT2
# (default 480 s, the cases' own budget BUDGET2 420 s) < 10 minutes; the estimate of all fitting cases is about
# 490 s at 150 TFLOP/s, so on a slower card the costliest 16-sequence cases at T = 4096 are the ones left out.
# Usage (repository root, a CUDA machine with torch, transformers and peft):  bash benchmarks/gpu/step_cost.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_step_cost}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=src PYTHONUNBUFFERED=1
LIMIT1=${LIMIT1:-90} LIMIT2=${LIMIT2:-480} BUDGET2=${BUDGET2:-420} REPEATS=${REPEATS:-2}
say() { echo "[step_cost $(date +%T)] $*" | tee -a "$OUT/log.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
"transformers", transformers.__version__, "cuda", torch.version.cuda)'
  git rev-parse HEAD 2>/dev/null
} 2>&1 | tee "$OUT/versions.txt"

say "1. SmolLM2-135M shape (case 7), grpo against oblr, cuda bf16"
timeout "$LIMIT1" $PY benchmarks/step_cost.py --device cuda --cases 7 --methods oblr --repeats 3 \
  --markdown "$OUT/smollm2_shape.md" 2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "2. real micro-batches (step_cost_real.py, --real all), budget ${BUDGET2}s"
timeout "$LIMIT2" $PY benchmarks/step_cost.py --device cuda --real all --repeats "$REPEATS" --budget-s "$BUDGET2" \
  --json "$OUT/real.json" --markdown "$OUT/real.md" 2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"
say "rc ${PIPESTATUS[0]}"
