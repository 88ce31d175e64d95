#!/usr/bin/env bash
# One command for the GPU measurement (issue 7): checks the OpenCL path on the GPU against the
# reference fixtures, synthesizes a full-size Qwen2.5-0.5B 4-bit checkpoint and runs tllm bench on it.
#   bash scripts/bench_gpu.sh [BUILD_DIR]
# BUILD_DIR defaults to build-static (made by `cmake -B build-static -DTLLM_STATIC_DEPS=ON`, so the
# binary needs only libOpenCL on the GPU machine, which has no json-c/pcre2/utf8proc headers); when it
# is missing, the script builds with cmake. Results go to $OUT (or ./gpu-results).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-static}
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
if [ ! -x "$B/tllm" ]; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release && cmake --build "$B" -j"$(nproc)" --target tllm-cli test_opencl tllm-cl-floor
fi
# NVIDIA's OpenCL is installed without an ICD file on the lent machines: register it
if [ -e /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 ] || ldconfig -p | grep -q libnvidia-opencl; then
  mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
fi
"$B/tllm" devices | tee "$OUT/devices.txt"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true
# correctness on this GPU: every small fixture, token by token, against transformers' logits
"$B/tests/test_opencl" tests/data/models/* > "$OUT/test_opencl.txt" 2>&1 && echo "test_opencl: pass" || { echo "test_opencl: FAIL"; tail -20 "$OUT/test_opencl.txt"; }
# the same with one launch per kernel (the default on a GPU is the persistent `token` kernel, which
# CI's PoCL cannot run)
TLLM_CL_PERSISTENT=0 "$B/tests/test_opencl" tests/data/models/* > "$OUT/test_opencl_launches.txt" 2>&1 &&
  echo "test_opencl (one launch per kernel): pass" || { echo "test_opencl (one launch per kernel): FAIL"; tail -20 "$OUT/test_opencl_launches.txt"; }
# and with small attention spans in few slots (several ATT_LWS blocks a span: the online softmax
# across blocks; per-layer partials that are not whole cache lines unless padded)
TLLM_CL_OPTS="-DMV_LWS=64 -DATT_LWS=64 -DATT_MAX_SPLIT=1" "$B/tests/test_opencl" tests/data/models/* > "$OUT/test_opencl_spans.txt" 2>&1 &&
  echo "test_opencl (ATT_LWS 64, one span a head): pass" || { echo "test_opencl (ATT_LWS 64, one span a head): FAIL"; tail -20 "$OUT/test_opencl_spans.txt"; }
# what launches and grid barriers cost on this device, without the model
[ -x "$B/tllm-cl-floor" ] && "$B/tllm-cl-floor" | tee "$OUT/cl_floor.txt"
M=/tmp/tllm-synth-qwen2.5-0.5b-q4
[ -f "$M/model.safetensors" ] || "$B/tllm" synth --config configs/qwen2.5-0.5b-instruct.json --out "$M" --tokenizer tests/data/tokenizer
T=$(nproc)
"$B/tllm" bench -m "$M" --device opencl -p 512 -n 128 -r 5 -t "$T" | tee "$OUT/bench_opencl.md"
"$B/tllm" bench -m "$M" --device opencl -p 512 -n 128 -r 5 -t "$T" -o json > "$OUT/bench_opencl.json"
# decode deeper into the context (attention's share grows), and where a token's time goes per kernel
"$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -d 0,1024,4096 -r 3 -t "$T" | tee "$OUT/bench_opencl_depth.md"
TLLM_CL_PROFILE=phases "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -r 3 -t "$T" 2>&1 | grep -A12 "opencl profile" | tee "$OUT/profile.txt"
TLLM_CL_PROFILE=host "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -r 3 -t "$T" 2>&1 | grep "opencl host" | tee -a "$OUT/profile.txt"
TLLM_CL_PERSISTENT=0 "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -r 3 -t "$T" | tee "$OUT/bench_opencl_launches.md"
TLLM_CL_PERSISTENT=0 TLLM_CL_PROFILE=host "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -r 3 -t "$T" 2>&1 | grep "opencl host" | tee -a "$OUT/profile.txt"
"$B/tllm" bench -m "$M" --device cpu -p 512 -n 128 -r 3 -t "$T" | tee "$OUT/bench_cpu.md"
