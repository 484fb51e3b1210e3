#!/usr/bin/env bash
# Issue 26's checks on one GPU, in one command (a lent machine's time is short): the environment, then
#   1. memory_check.py: exactness of the two-pass and the recompute engines under checkpointing (and with
#      chunked logits) against the loop; measured step peaks against oblr.memory_model at Qwen3-0.6B (every
#      plan) and Qwen3-4B shapes (checkpointed plans), T = 32 + 992, 4 sequences, with interleaved step times;
#   2. memory_check.py at the paper's response length: $MODELS2 (default Qwen3-4B,Qwen3-8B), T = 32 + 4064,
#      the checkpointed plans (two-pass, recompute) with whole and chunked logits, peaks and step times;
#   3. the same with LoRA adapters (rank 16, attention projections) at Qwen3-4B, T = 32 + 4064: the recompute
#      engine against GRPO, both checkpointed;
#   4. train_check.py: `oblr train` on CUDA with each engine, LoRA, and the planner on the free device memory;
#      the first step's numbers compared across engines;
#   5. fsdp_step.py: FSDP2 (one rank, NCCL) norms against the loop, and OBLR-PO/GRPO step time at Qwen3-0.6B
#      (SKIP_FSDP=1 leaves it out).
# Each step has its own time limit, so one that hangs leaves the others' results. Outputs (JSON and logs) go
# to $OUT (default runs/gpu_scale); benchmarks/gpu/summarize_scale.py turns a folder of such run folders into
# a markdown summary and a plot. Step 4 builds the built-in tiny model on first use (~80 s) unless
# $OBLR_CACHE_DIR holds it (a copy of ~/.cache/oblr/models/tiny-arith-v1 carried along). On an H200 steps 1-3
# took 73, 70 and 46 s (MODELS2=Qwen3-4B), and step 4's runs ~20 s each (2.5 minutes for the six).
# Usage (repository root, a CUDA machine with torch, transformers and peft):  bash benchmarks/gpu/scale_checks.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_scale}; mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONPATH=src PYTHONUNBUFFERED=1
LIMIT1=${LIMIT1:-180} LIMIT2=${LIMIT2:-240} LIMIT3=${LIMIT3:-120} LIMIT4=${LIMIT4:-180} LIMIT5=${LIMIT5:-100}
MODELS2=${MODELS2:-Qwen3-4B,Qwen3-8B}
say() { echo "[scale_checks $(date +%T)] $*" | tee -a "$OUT/log.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY - <<'PY'
import sys, torch, transformers
print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__,
      "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
PY
} 2>&1 | tee "$OUT/versions.txt"

say "1. memory_check T=1024 (exactness; Qwen3-0.6B, Qwen3-4B)"
timeout "$LIMIT1" $PY benchmarks/gpu/memory_check.py --out "$OUT/memory_check_T1024.json" --time-repeats 3 \
  2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "2. memory_check T=4096 ($MODELS2; checkpointed plans)"
timeout "$LIMIT2" $PY benchmarks/gpu/memory_check.py --skip exactness --models "$MODELS2" \
  --plans grpo_ckpt,oblr_ckpt,oblr_recompute,grpo_ckpt_chunk,oblr_ckpt_chunk,oblr_recompute_chunk --response-len 4064 \
  --time-repeats 2 --out "$OUT/memory_check_T4096.json" 2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "3. memory_check T=4096, LoRA rank 16 (Qwen3-4B; GRPO and the recompute engine, checkpointed)"
timeout "$LIMIT3" $PY benchmarks/gpu/memory_check.py --skip exactness --models Qwen3-4B --lora-rank 16 \
  --plans grpo_ckpt,oblr_recompute,grpo_ckpt_chunk,oblr_recompute_chunk --response-len 4064 --time-repeats 3 \
  --out "$OUT/memory_check_T4096_lora.json" 2>&1 | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

say "4. train_check (oblr train on CUDA: engines, LoRA, the planner on free memory)"
timeout "$LIMIT4" $PY benchmarks/gpu/train_check.py --device cuda --steps 3 --out "$OUT/train_check" 2>&1 \
  | grep -v '^USDT' | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"

if [ "${SKIP_FSDP:-0}" != 1 ]; then
  say "5. fsdp_step (FSDP2, one rank, Qwen3-0.6B)"
  timeout "$LIMIT5" $PY benchmarks/gpu/fsdp_step.py --out "$OUT/fsdp_step.json" 2>&1 | grep -v '^USDT' \
    | tee -a "$OUT/log.txt"; say "rc ${PIPESTATUS[0]}"
fi
