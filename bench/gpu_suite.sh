#!/usr/bin/env bash
# The GPU checks in one call on a lent card (~8 min on an H100/H200, ~11 with Unsloth; each part has its own time
# limit, and a part that fails or runs out of time is reported and skipped, not fatal):
#   1. Orpheus-3B width (3072, 24 heads / 8 KV heads, MLP 8192) with 4 layers, LoRA, bf16: packed vs padded vs
#      length-sorted batches, a HF Trainer on the same module and LoRA (SDPA, gradient checkpointing), and packed
#      with train.compile: tokens/s, MFU, max_memory_allocated (bench/packing.py)
#   2. Parler-TTS mini-v0.1 shape, bf16: frames/s and MFU (bench/parler_step.py)
#   3. the chunked head loss vs the materialised one at Orpheus' vocabulary (bench/fused_loss.py)
#   4. voxrelay plan's memory prediction vs max_memory_allocated (bench/plan_accuracy.py)
#   5. the blocking time of an async checkpoint save at 3B width, 2 layers (bench/checkpoint_stall.py)
#   6. Unsloth on the same module width, rows, batches and LoRA, under the same HF Trainer, in its own process
#      (bench/unsloth_arm.py; needs `pip install unsloth`, its wheels carried to the card: skipped without)
#   bash bench/gpu_suite.sh [OUT_DIR]        (each part's full output in OUT_DIR, default $OUT or /tmp/gpu_suite)
# Last line: ratio <packed / padded audio-s/s at Orpheus-3B width> (goal >= 1.3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
out=${1:-${OUT:-/tmp/gpu_suite}}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out/card.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/card.txt"

part() {  # part NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E '^ratio ' "$out/$name.log" | tail -1)
  printf '%-16s rc %-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "${last:-no ratio line (see $out/$name.log)}" \
    | tee -a "$out/summary.txt"
}

part orpheus3b_pack 240 "$PY" bench/packing.py --only orpheus --width 3072 --layers 4 --heads 24 --kv-heads 8 \
  --intermediate 8192 --budget 8192 --steps 20 --bf16 --lora --compile --trainer
part parler_mini 90 "$PY" bench/parler_step.py --preset mini-v0.1 --bf16
part fused_loss 60 "$PY" bench/fused_loss.py --hidden 3072
part plan_accuracy 90 "$PY" bench/plan_accuracy.py --tokens 2048 --layers 4
part ckpt_stall 90 "$PY" bench/checkpoint_stall.py --hidden 3072 --layers 2 --repeats 2
part unsloth 180 "$PY" bench/unsloth_arm.py --width 3072 --layers 4 --heads 24 --kv-heads 8 --intermediate 8192 \
  --budget 8192 --steps 20
"$PY" bench/suite_ratios.py "$out" | tee -a "$out/summary.txt"

echo
grep -E '^(arm|bucketed|shuffled|packed|hf_trainer)' "$out/orpheus3b_pack.log" 2>/dev/null
grep -E '^unsloth' "$out/unsloth.log" 2>/dev/null
grep -E 'MFU' "$out/parler_mini.log" 2>/dev/null
grep -E '^ratio ' "$out/orpheus3b_pack.log" | tail -1 || echo "ratio nan"
