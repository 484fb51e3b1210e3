#!/usr/bin/env bash
# OBLRGRPOTrainer on one GPU (offline machine): install TRL (+ DeepSpeed) from the wheels carried in .whl/,
# then run, on a Qwen3-shaped model of ~0.6B parameters built from a config (no hub download):
#   1. the example's settings, bf16, OBLRGRPOTrainer vs GRPOTrainer alternated (benchmarks/trl_overhead.py);
#   2. OBLRGRPOTrainer under DeepSpeed ZeRO-2 and ZeRO-3 (accelerate launch, 1 process), a few steps;
#   3. vLLM colocate only if vllm is importable (it is not carried: too large); otherwise reported as not run.
# Everything is written under $OUT (default runs/gpu_trl): logs, JSON summaries, peak memory.
# Usage (repository root):  bash benchmarks/gpu/trl_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_trl}; mkdir -p "$OUT"
PY=${PY:-python3}
log() { echo "[trl_gpu] $*" | tee -a "$OUT/steps.log"; }

# ---- install (offline): only what is missing; deepspeed from its sdist without building ops
if ! $PY -c "import trl" 2>/dev/null; then
  $PY -m pip install --no-index --find-links .whl trl==1.16.0 2>&1 | tail -2
fi
if ! $PY -c "import deepspeed" 2>/dev/null; then
  $PY -m pip install --no-index --find-links .whl hjson msgpack py-cpuinfo nvidia-ml-py einops ninja pydantic 2>&1 | tail -1
  DS_BUILD_OPS=0 $PY -m pip install --no-index --no-build-isolation --no-deps .whl/deepspeed-*.tar.gz 2>&1 | tail -1
fi
$PY -m pip install --no-index --no-deps -e . 2>&1 | tail -1
$PY - <<'PY' | tee "$OUT/versions.txt"
import importlib, sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for m in ("transformers", "accelerate", "trl", "peft", "deepspeed", "vllm"):
    try: print(m, importlib.import_module(m).__version__)
    except Exception as e: print(m, "absent", type(e).__name__)
PY

# ---- a Qwen3-shaped ~0.6B model from a config, with the built-in tokenizer (no download)
MODEL="$OUT/qwen3-0.6b-shape"
$PY - "$MODEL" <<'PY'
import sys, torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from oblr.models import load_model_and_tokenizer
_, tok = load_model_and_tokenizer("builtin")   # builds/caches the built-in model + tokenizer (~80 s on first use)
cfg = Qwen3Config(vocab_size=len(tok), hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
m = Qwen3ForCausalLM(cfg)
print("[trl_gpu] parameters:", sum(p.numel() for p in m.parameters()) / 1e6, "M (vocab", len(tok), ")")
m.save_pretrained(sys.argv[1]); tok.save_pretrained(sys.argv[1])
PY

# ---- 1. step-time ratio and peak memory, bf16, one GPU
log "overhead: OBLRGRPOTrainer vs GRPOTrainer, bf16"
$PY benchmarks/trl_overhead.py --model "$MODEL" --bf16 --steps 6 --rounds 2 --prompts 16 --num-generations 8 \
    --max-completion-length 128 --eval-problems 0 --out "$OUT/overhead.json" 2>&1 | tee "$OUT/overhead.log" | grep -v "^{"

# ---- 2. DeepSpeed ZeRO-2 / ZeRO-3 (the DeepSpeed path: TRL's backward with oblr's advantages, lr in a pre-step hook)
for stage in 2 3; do
  cat > "$OUT/ds_zero$stage.json" <<JSON
{"zero_optimization": {"stage": $stage}, "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
JSON
  log "deepspeed zero-$stage"
  ACCELERATE_USE_DEEPSPEED=true ACCELERATE_DEEPSPEED_CONFIG_FILE="$OUT/ds_zero$stage.json" \
  $PY -m accelerate.commands.launch --num_processes 1 --use_deepspeed --deepspeed_config_file "$OUT/ds_zero$stage.json" \
      examples/trl_grpo_oblr.py --model "$MODEL" --bf16 --max-steps 4 --prompts-per-step 8 --num-generations 8 \
      --max-completion-length 128 --eval-problems 20 --output-dir "$OUT/zero$stage" 2>&1 | tail -5 | tee -a "$OUT/steps.log"
done

# ---- 3. vLLM colocate
if $PY -c "import vllm" 2>/dev/null; then
  log "vllm colocate"
  $PY examples/trl_grpo_oblr.py --model "$MODEL" --bf16 --vllm colocate --max-steps 4 --prompts-per-step 8 \
      --num-generations 8 --max-completion-length 128 --eval-problems 20 --output-dir "$OUT/vllm" 2>&1 | tail -5 | tee -a "$OUT/steps.log"
else
  log "vllm: NOT RUN (vllm not installed on this machine and too large to carry in .whl/)"
fi
log "done; results under $OUT"
