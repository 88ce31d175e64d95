#!/usr/bin/env bash
# Sweep the OpenCL decode kernels' tunables (kernels/decode.cl's #ifndef defaults, passed as -D through
# TLLM_CL_OPTS) and print tg t/s for each, so the defaults can be chosen per device from numbers.
#   bash scripts/tune_gpu.sh MODEL_DIR [BUILD_DIR] [-- "OPTS" "OPTS" ...]
# Without option sets it sweeps a built-in list. Each line: options, tg128 t/s, tg128 t/s at depth 1024.
set -euo pipefail
cd "$(dirname "$0")/.."
M=$1; shift
B=build-static
if [ $# -gt 0 ] && [ "$1" != "--" ]; then B=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
if [ $# -eq 0 ]; then
  set -- "" "-DMV_LWS=64" "-DMV_LWS=128" "-DMV_ITERS=1" "-DMV_ITERS=4" "-DMV_GROUPS_PER_CU=4" \
    "-DMV_GROUPS_PER_CU=64" "-DATT_LWS=64" "-DATT_LWS=256" "-DATT_MAX_SPLIT=8" "-DMV_LWS=128 -DMV_ITERS=1"
fi
tg() { TLLM_CL_OPTS="$1" "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -d "$2" -r 3 -o json 2>/dev/null |
       python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"])'; }
printf "%-36s %10s %14s\n" "TLLM_CL_OPTS" "tg128" "tg128@d1024"
for o in "$@"; do
  printf "%-36s %10s %14s\n" "${o:-(defaults)}" "$(tg "$o" 0)" "$(tg "$o" 1024)"
done
