#!/usr/bin/env bash
# Issue 38 item 5: the paper-regime grid (N = 128 prompts x G = 8 samples a step) of ONE task on one GPU, in
# one command under 10 minutes. Prepared on CPU; not yet run on a GPU (say so until it has been).
#
#   1. the grid, one seed (benchmarks/paper_regime.py grids --seeds $SEEDS --tasks $TASK --optimizers $OPTS):
#      GRPO, RLOO and the OBLR-PO baseline at fixed rates by half-decades, the SNR rule (current batch and EMA)
#      over three decades of eta_max, auto at four guesses; $STEPS steps each (default 100);
#   2. `oblr compare --jobs $JOBS model.device=cuda train.threads=1`: several tiny-model runs share the GPU
#      (each process generates its 1024 sequences a step in one batch); finished runs are reused when the
#      command is run again with the same $OUT, so a second lease continues the first's grid;
#   3. the report: benchmarks/paper_regime_report.py writes the tables, verdicts and plot to $OUT/report
# The built-in models ship with the package (src/oblr/models/weights): nothing is built or downloaded.
# Every run's summary.json is written when it ends, so a time-out keeps the finished runs.
# Usage (repository root, a CUDA machine with torch and transformers):
#   TASK=arithmetic OPTS="sgd adamw" bash benchmarks/gpu/paper_regime.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_paper_regime}; mkdir -p "$OUT"
PY=${PY:-python3}
TASK=${TASK:-arithmetic}
OPTS=${OPTS:-sgd adamw}
SEEDS=${SEEDS:-0}
STEPS=${STEPS:-100}
JOBS=${JOBS:-8}
LIMIT=${LIMIT:-540}
export PYTHONPATH=src PYTHONUNBUFFERED=1
say() { echo "[paper_regime $(date +%T)] $*" | tee -a "$OUT/log.txt"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
} 2>&1 | tee "$OUT/versions.txt"

$PY benchmarks/paper_regime.py grids --out "$OUT/grids" --steps "$STEPS" --seeds $SEEDS --tasks "$TASK" \
  --optimizers $OPTS | tee -a "$OUT/log.txt"
start=$(date +%s)
for opt in $OPTS; do
  left=$(( LIMIT - ($(date +%s) - start) ))
  [ "$left" -gt 30 ] || { say "no time left for $opt"; break; }
  say "grid $TASK/$opt, $left s left"
  timeout "$left" $PY -m oblr compare --config "$OUT/grids/$TASK/grid-$opt.yaml" --out "$OUT/$TASK-$opt" \
    --jobs "$JOBS" model.device=cuda train.threads=1 2>&1 | tee -a "$OUT/log.txt"
  say "rc ${PIPESTATUS[0]}"
done
say "finished runs: $(find "$OUT" -name summary.json | wc -l)"
# the grid's tables, verdicts and accuracy-against-rate plot (finished runs; unfinished ones listed as such)
runs=$(for opt in $OPTS; do [ -d "$OUT/$TASK-$opt" ] && echo "$OUT/$TASK-$opt"; done)
[ -n "$runs" ] && $PY benchmarks/paper_regime_report.py --runs $runs --out "$OUT/report" 2>&1 | tail -n 40 | tee -a "$OUT/log.txt"
