#!/usr/bin/env bash
# A short verl 0.9.1 job on one GPU: GRPO (verl's own estimator and loss) vs OBLR-PO (oblr's recipe:
# python -m oblr.integrations.verl.recipe), same model, data, batch, steps and rollout engine.
#   model: a small Qwen3 (default Qwen/Qwen3-0.6B from the Hugging Face cache; MODEL=/path to override);
#   data:  GSM8K-format parquet made from oblr's word_problems generator (verl's gsm8k reward reads "#### n");
#   both runs use verl's legacy trainer (trainer.use_v1=False, the one the recipe subclasses), FSDP2, vLLM.
# Needs: a Python with verl 0.9.1 and the verl extra (constraints/verl.txt) plus vLLM for the GPU, and the
# model available offline. Nothing is downloaded here; a missing piece stops the script with one line.
# Writes under $OUT (default runs/gpu_verl): data/, grpo.log, oblr.log, summary.txt (validation scores).
# NOT RUN: no GPU with verl and vLLM has been lent (docs/verl.md).
# Usage (repository root):  bash benchmarks/gpu/verl_oblr_vs_grpo.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_verl}; mkdir -p "$OUT/data"
PY=${PY:-python3}
MODEL=${MODEL:-Qwen/Qwen3-0.6B}
STEPS=${STEPS:-40}
log() { echo "[verl_gpu] $*" | tee -a "$OUT/steps.log"; }

$PY - <<'PY' || exit 1
import importlib, sys
missing = [m for m in ("verl", "vllm", "ray", "pandas", "pyarrow", "oblr") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"verl_oblr_vs_grpo: missing {', '.join(missing)} in {sys.executable} "
             f"(pip install -e '.[verl]' -c constraints/verl.txt, then vllm for this GPU)")
import torch, verl
if not torch.cuda.is_available():
    sys.exit("verl_oblr_vs_grpo: no CUDA device (verl's trainer needs a GPU)")
print("torch", torch.__version__, "verl", verl.__version__, torch.cuda.get_device_name(0))
PY
$PY -c "from transformers import AutoConfig; AutoConfig.from_pretrained('$MODEL')" 2>/dev/null \
  || { echo "verl_oblr_vs_grpo: model '$MODEL' is not available offline (set MODEL=/path/to/Qwen3-0.6B)"; exit 1; }

# ---- data: word_problems in verl's RL parquet layout (prompt as chat messages, ground truth for gsm8k)
$PY - "$OUT/data" <<'PY'
import sys
import pandas as pd
from oblr.tasks import get_task
out = sys.argv[1]
task = get_task("word_problems", n_train=2048, n_eval=256)
instr = 'Let\'s think step by step and output the final answer after "####".'
for split, rows in (("train", task.train), ("test", task.eval)):
    recs = [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "user", "content": f"{ex.meta['question']} {instr}"}],
             "reward_model": {"style": "rule", "ground_truth": str(ex.meta["value"])},
             "extra_info": {"split": split, "index": i}} for i, ex in enumerate(rows)]
    pd.DataFrame(recs).to_parquet(f"{out}/{split}.parquet")
    print(split, len(recs))
PY

COMMON=(
  trainer.use_v1=False trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.logger=console
  trainer.total_training_steps=$STEPS trainer.total_epochs=1 trainer.test_freq=10 trainer.save_freq=-1
  trainer.val_before_train=True trainer.balance_batch=False trainer.project_name=oblr-verl
  data.train_files=$OUT/data/train.parquet data.val_files=$OUT/data/test.parquet
  data.train_batch_size=32 data.max_prompt_length=256 data.max_response_length=512
  actor_rollout_ref.model.path=$MODEL actor_rollout_ref.model.use_remove_padding=True
  actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.actor.ppo_mini_batch_size=32
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.ppo_epochs=1
  actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.entropy_coeff=0
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 algorithm.use_kl_in_reward=False
)

log "GRPO (verl's estimator and loss, lr 1e-6 as verl's GSM8K example)"
$PY -m verl.trainer.main_ppo "${COMMON[@]}" trainer.experiment_name=grpo algorithm.adv_estimator=grpo \
  actor_rollout_ref.actor.optim.lr=1e-6 > "$OUT/grpo.log" 2>&1
log "grpo exit $?"

log "OBLR-PO (oblr's recipe: exact w_i, the oblr estimator and loss, SNR lr with eta_max 1e-5)"
$PY -m oblr.integrations.verl.recipe "${COMMON[@]}" trainer.experiment_name=oblr algorithm.adv_estimator=oblr \
  actor_rollout_ref.actor.policy_loss.loss_mode=oblr actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm \
  actor_rollout_ref.actor.loss_scale_factor=512 actor_rollout_ref.actor.optim.lr=1e-5 \
  +actor_rollout_ref.oblr.lr_schedule=snr +actor_rollout_ref.oblr.snr_ema=0.9 > "$OUT/oblr.log" 2>&1
log "oblr exit $?"

# ---- validation scores (verl prints val-core/... metrics at each test) and step times
$PY - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import re, sys
out = sys.argv[1]
for run in ("grpo", "oblr"):
    text = open(f"{out}/{run}.log", errors="replace").read()
    vals = re.findall(r"val-core/[^:\s]+/(?:acc|reward)/mean@1[:=]\s*([0-9.eE+-]+)", text)
    steps = re.findall(r"timing_s/step[:=]\s*([0-9.eE+-]+)", text)
    print(run, "val mean@1 over tests:", vals or "none found (see the log)",
          "| mean s/step:", round(sum(map(float, steps)) / len(steps), 1) if steps else "n/a")
PY
