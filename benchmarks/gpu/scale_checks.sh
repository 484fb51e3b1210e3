#!/usr/bin/env bash
# Issue 26's checks on one GPU, in one command (a lent machine's time is short): the environment, then
#   1. memory_check.py: exactness of the two-pass engine under checkpointing (and with chunked logits) against
#      the loop; measured step peaks against oblr.memory_model at Qwen3-0.6B (every plan) and Qwen3-4B shapes
#      (checkpointed plans), T = 32 + 992, 4 sequences, with interleaved step times and the norm engine's
#      TF32 products against float32;
#   2. memory_check.py at the paper's response length: Qwen3-4B and Qwen3-8B shapes, T = 32 + 4064, the
#      checkpointed plans with whole and chunked logits, peaks and step times;
#   3. fsdp_step.py: FSDP2 (one rank, NCCL) norms against the loop, and OBLR-PO/GRPO step time at Qwen3-0.6B.
# Each step has its own time limit, so one that hangs leaves the others' results. Outputs (JSON and logs) go
# to $OUT (default runs/gpu_scale); benchmarks/gpu/summarize_scale.py turns a folder of such run folders into
# a markdown summary and a plot. On an H200 the three steps took ~4.5 minutes (the 8B timings need LIMIT2 > 150).
# Usage (repository root, a CUDA machine with torch and transformers):  bash benchmarks/gpu/scale_checks.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_scale}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=src PYTHONUNBUFFERED=1
LIMIT1=${LIMIT1:-180} LIMIT2=${LIMIT2:-240} LIMIT3=${LIMIT3:-100}
say() { echo "[scale_checks $(date +%T)] $*" | tee -a "$OUT/log.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY - <<'PY'
import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
PY
} 2>&1 | tee "$OUT/versions.txt"

say "1. memory_check T=1024 (exactness; Qwen3-0.6B, Qwen3-4B)"
timeout "$LIMIT1" $PY benchmarks/gpu/memory_check.py --out "$OUT/memory_check_T1024.json" --time-repeats 3 --fp32-compare \
  2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "2. memory_check T=4096 (Qwen3-4B, Qwen3-8B; checkpointed plans)"
timeout "$LIMIT2" $PY benchmarks/gpu/memory_check.py --skip exactness --models Qwen3-4B,Qwen3-8B \
  --plans grpo_ckpt,oblr_ckpt,grpo_ckpt_chunk,oblr_ckpt_chunk --response-len 4064 --time-repeats 2 \
  --out "$OUT/memory_check_T4096.json" 2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "3. fsdp_step (FSDP2, one rank, Qwen3-0.6B)"
timeout "$LIMIT3" $PY benchmarks/gpu/fsdp_step.py --out "$OUT/fsdp_step.json" 2>&1 | grep -v '^USDT' \
  | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"
