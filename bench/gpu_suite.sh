#!/usr/bin/env bash
# The GPU checks in one call on a lent card (each part under its own time limit, ~8 min in all; a part that fails
# or runs out of time is reported and skipped, not fatal):
#   1. Orpheus-3B width (3072, 24 heads / 8 KV heads, MLP 8192) with 4 layers, LoRA, bf16: packed vs padded vs
#      length-sorted batches and a HF Trainer on the same module and LoRA (SDPA, gradient checkpointing): tokens/s,
#      MFU, max_memory_allocated (bench/packing.py)
#   2. Parler-TTS mini-v0.1 shape, bf16, the recipe's 3 x 30 s micro-batch: frames/s and MFU (bench/parler_step.py)
#   3. the chunked head loss vs the materialised one at Orpheus' vocabulary and width (bench/fused_loss.py)
#   4. voxrelay plan's memory prediction vs max_memory_allocated, 4 strategies (bench/plan_accuracy.py)
#   5. the blocking time of an async checkpoint save of a 3B-width state held on the GPU (device -> host copy)
#      vs a synchronous save, to a local folder (bench/checkpoint_stall.py)
#   6. packed with train.compile vs packed, the same width (bench/packing.py --compile): last, compiles take time
#   7. Unsloth on the same module width, rows, batches and LoRA, under the same HF Trainer, in its own process
#      (bench/unsloth_arm.py), only when `import unsloth` works there (its wheels carried)
# Before the parts: PYTHONPATH=src, the hub offline (the card has no network; every part builds its models
# locally), and the wheels of .gpu-wheels/ installed when voxrelay does not import (`bash bench/gpu_wheels.sh`
# here, then carry ".gpu-wheels"). PY: .venv/bin/python where it runs, else python3 (the card's, with torch).
#   bash bench/gpu_suite.sh [OUT_DIR]        (each part's full output in OUT_DIR, default $OUT or /tmp/gpu_suite)
#   GPU_SUITE_SMOKE=1 bash bench/gpu_suite.sh DIR   the same parts at tiny sizes on a CPU (the compile part without
#   compiling: train.compile has its own tests): that each starts and ends
# Last line: ratio <packed / padded audio-s/s at Orpheus-3B width> (goal >= 1.3).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  PY=python3
  .venv/bin/python -c "import torch" >/dev/null 2>&1 && PY=.venv/bin/python
fi
out=${1:-${OUT:-/tmp/gpu_suite}}
mkdir -p "$out"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$out/card.txt"
date -u +%Y-%m-%dT%H:%MZ | tee -a "$out/card.txt"
# one interpreter: its Python and torch, the device the parts run on, and that voxrelay imports (last line "ok")
probe='import sys, torch
print(sys.version.split()[0], "torch", torch.__version__)
print("device", "cuda" if torch.cuda.is_available() else "cpu")
import voxrelay.config, voxrelay.train.build
print("ok")'
"$PY" -c "$probe" > "$out/probe.txt" 2>&1
if [ "$(tail -1 "$out/probe.txt")" != ok ] && [ -d .gpu-wheels ]; then
  "$PY" -m pip install -q --no-index --no-deps .gpu-wheels/*.whl 2>&1 | tail -3 | tee -a "$out/card.txt"
  "$PY" -c "$probe" > "$out/probe.txt" 2>&1
fi
tail -4 "$out/probe.txt" | tee -a "$out/card.txt"
device=$(sed -n 's/^device //p' "$out/probe.txt")

part() {  # part NAME SECONDS COMMAND...  (the limit x $limit_scale)
  local name=$1 limit=$(($2 * limit_scale))
  shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -E '^ratio ' "$out/$name.log" | tail -1)
  printf '%-16s rc %-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - t0))" "${last:-no ratio line (see $out/$name.log)}" \
    | tee -a "$out/summary.txt"
}

limit_scale=1
if [ -n "${GPU_SUITE_SMOKE:-}" ]; then  # tiny sizes: every part starts, runs and prints its ratio line on a CPU
  limit_scale=4  # a shared CPU host, not a card: room for a slow one
  bf16=()  # bf16 matmuls on a CPU are slow and test nothing the card's would
  compile=()  # a CPU compile takes a minute and proves nothing about the card's
  orpheus=(--width 32 --layers 1 --heads 2 --kv-heads 1 --intermediate 64 --budget 1500 --steps 4 --rows 60)
  parler=(--preset tiny --steps 2 --repeats 1 --batch 2 --frames 40)
  fused=(--hidden 32 --vocab 5000 --tokens 256 --repeats 1)
  plan=(--tokens 64 --layers 1)
  stall=(--hidden 64 --layers 2 --repeats 1)
else
  orpheus=(--width 3072 --layers 4 --heads 24 --kv-heads 8 --intermediate 8192 --budget 8192 --steps 20 --rows 300)
  parler=(--preset mini-v0.1 --steps 4 --repeats 2 --batch 3 --frames 2580)
  fused=(--hidden 3072 --repeats 3)
  plan=(--tokens 2048 --layers 4)
  stall=(--hidden 3072 --layers 2 --repeats 1)
  bf16=(--bf16)
  compile=(--compile)
fi
part orpheus3b_pack 170 "$PY" bench/packing.py --only orpheus "${orpheus[@]}" "${bf16[@]}" --lora --trainer
part parler_mini 60 "$PY" bench/parler_step.py "${parler[@]}" "${bf16[@]}"
part fused_loss 30 "$PY" bench/fused_loss.py "${fused[@]}" --frozen-only
part plan_accuracy 100 "$PY" bench/plan_accuracy.py --cuda-only "${plan[@]}" \
  --only ddp,ddp_lora_gc,fsdp,ddp_lora_gc_act_offload
part ckpt_stall 60 "$PY" bench/checkpoint_stall.py "${stall[@]}" --local --device "${device:-cpu}"
part orpheus3b_compile 80 "$PY" bench/packing.py --only orpheus "${orpheus[@]}" "${bf16[@]}" --lora --arms packed \
  "${compile[@]}"
if "$PY" -c "import unsloth" >/dev/null 2>&1; then
  part unsloth 120 "$PY" bench/unsloth_arm.py "${orpheus[@]}"
else
  echo "unsloth          skipped: \`import unsloth\` fails here (carry its wheels to run it)" | tee -a "$out/summary.txt"
fi
"$PY" bench/suite_ratios.py "$out" | tee -a "$out/summary.txt"

echo
grep -E '^(arm|bucketed|shuffled|packed|hf_trainer)' "$out/orpheus3b_pack.log" 2>/dev/null
grep -E '^packed\+compile' "$out/orpheus3b_compile.log" 2>/dev/null
grep -E '^unsloth' "$out/unsloth.log" 2>/dev/null
grep -E 'MFU' "$out/parler_mini.log" 2>/dev/null
grep -E '^ratio ' "$out/orpheus3b_pack.log" | tail -1 || echo "ratio nan"
