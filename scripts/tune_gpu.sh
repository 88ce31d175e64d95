#!/usr/bin/env bash
# Sweep the OpenCL decode kernels' tunables (kernels/opencl/*.cl's #ifndef defaults, passed as -D through
# TLLM_CL_OPTS) and print tg t/s for each, so the defaults can be chosen per device from numbers.
#   bash scripts/tune_gpu.sh MODEL_DIR [BUILD_DIR] [--np B] [-- "OPTS" "OPTS" ...]
# Without option sets it sweeps a built-in list. Each line: options, tg128 t/s, the one-launch kernel's
# work-groups (the compiler's register use can lower them), tg128 t/s at depth 1024. With --np B the
# scheduler's path instead (the prompt kernels: gemm_few's FEW_TN, FEW_U, flash's FL_SPAN ...): S_TG of
# B sequences, 128-token prompts, 64 tokens each, two rounds, the option sets alternating.
set -euo pipefail
cd "$(dirname "$0")/.."
M=$1; shift
B=build-static
NP=
if [ $# -gt 0 ] && [ "$1" != "--" ] && [ "$1" != "--np" ]; then B=$1; shift; fi
if [ $# -gt 1 ] && [ "$1" = "--np" ]; then NP=$2; shift 2; fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
if [ -n "$NP" ]; then
  [ $# -eq 0 ] && set -- "" "-DFEW_U=2" "-DFEW_U=4" "-DFEW_TN=1" "-DFL_SPAN=128"
  printf "%-44s %10s %10s\n" "TLLM_CL_OPTS" "S_TG B=$NP" "round 2"
  declare -A r1
  for round in 1 2; do
    for o in "$@"; do
      v=$(TLLM_CL_OPTS="$o" "$B/tllm" bench -m "$M" --device opencl -np "$NP" -p 128 -n 64 -r 3 -o json 2>/dev/null |
        python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["speed_tg"], end="")' || echo "-")
      if [ $round = 1 ]; then r1["x$o"]=$v; else printf "%-44s %10s %10s\n" "${o:-(defaults)}" "${r1["x$o"]}" "$v"; fi
    done
  done
  exit 0
fi
if [ $# -eq 0 ]; then
  set -- "" "-DMV_ITERS=1" "-DMV_ITERS=4" "-DMV_MAX_ITERS=2" "-DMV_TAIL=0" "-DMV_PIPE=0" "-DSTAGE_FUSED=0" \
    "-DPHASE_PREFETCH=0" "-DMV_GROUPS_PER_CU=4" "-DMV_GROUPS_PER_CU=64" "-DATT_MAX_SPLIT=8" \
    "-DMV_LWS=128 -DATT_LWS=128 -DPERSIST_GROUPS_PER_CU=4"
fi
# tg OPTS DEPTH: "t/s groups" (groups of the one-launch kernel, "-" when a step is one launch per
# kernel; a build failure falls back to the CPU and shows as "cpu")
tg() {
  local err; err=$(mktemp)
  TLLM_CL_OPTS="$1" "$B/tllm" bench -m "$M" --device opencl -p 0 -n 128 -d "$2" -r 3 -o json 2>"$err" |
    python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)[0]["avg_ts"], end=" ")'
  if grep -q "decode on OpenCL" "$err"; then
    sed -n 's/.*(\([0-9]*\) work-groups).*/\1/p' "$err" | grep . || echo "-"
  else echo cpu; fi
  rm -f "$err"
}
printf "%-44s %8s %7s %12s\n" "TLLM_CL_OPTS" "tg128" "groups" "tg128@d1024"
for o in "$@"; do
  read -r t0 g0 <<< "$(tg "$o" 0)"
  read -r t1 _ <<< "$(tg "$o" 1024)"
  printf "%-44s %8s %7s %12s\n" "${o:-(defaults)}" "$t0" "$g0" "$t1"
done
