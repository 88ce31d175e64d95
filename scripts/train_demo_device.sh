#!/usr/bin/env bash
# Run on the lent GPU machine (the `device` tool): train the demo model on the dataset made here by
# scripts/man_dataset.py, quantize it with tllm (4-bit, group 64, as mlx-lm), try it, and leave what
# comes back in $OUT (the safetensors in 15 MB parts: the tool returns files of at most 16 MiB).
#   carry: build/mandemo, build-static/tllm    (cmake -S . -B build-static -DTLLM_STATIC_DEPS=ON)
#   usage: OUT=... EPOCHS=12 bash scripts/train_demo_device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-build/mandemo}
TLLM=${TLLM:-build-static/tllm}
EPOCHS=${EPOCHS:-12}
WORK=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
PYTHONUNBUFFERED=1 python3 scripts/train_demo_model.py --data "$DATA" --out "$WORK/bf16" --epochs "$EPOCHS" \
  2>&1 | tee "$OUT/train.log"
cp models/tllm-man-demo/tokenizer.json models/tllm-man-demo/tokenizer_config.json "$WORK/bf16/"
"$TLLM" quantize "$WORK/bf16" "$WORK/q4" --bits 4 --group-size 64
ls -l "$WORK/bf16" "$WORK/q4"
cp "$WORK/q4/config.json" "$WORK/bf16/train_log.json" "$WORK/q4/generation_config.json" "$OUT/"
split -b 15M -d "$WORK/q4/model.safetensors" "$OUT/model.safetensors.part"
for q in "What does grep do?" "How do I compare files line by line?" "What does ls -l do?"; do
  "$TLLM" generate -m "$WORK/q4" --device cpu --chat -p "$q" -n 80 --temp 0 2>/dev/null | tee -a "$OUT/samples.txt"
  echo | tee -a "$OUT/samples.txt"
done
