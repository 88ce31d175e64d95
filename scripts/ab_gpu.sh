#!/usr/bin/env bash
# Side by side on one machine: two or more variants of tllm (a binary and the environment it runs with:
# a build of another commit, TLLM_CL_OPTS, a TLLM_CL_NO_* switch), alternating within each round, so their
# ratio holds even where the card's speed drifts between rounds. Prints S_TG of `bench -np B` (and with
# --pp the prompt rate) for each model, B and round; with --texts also whether each variant's greedy texts
# (generate --prompts, three prompts, -np of each B) are the same as the first variant's; with --tg N the
# one-sequence decode rate tgN (bench -p 0 -n N: the one-launch decoder on a GPU).
#   bash scripts/ab_gpu.sh [options] -m MODEL [-m MODEL ...] -- 'NAME BINARY [VAR=VALUE ...]' 'NAME BINARY ...'
# options: --np "1 2 16" (default "1 2"), --rounds N (3), --prompt N, --gen N (128, 64: bench -p and -n),
#          --pp N (also ppN: bench -p N -n 0), --tg N (also tgN: bench -p 0 -n N), --texts,
#          --device D (opencl; cpu to try the script itself); --np "" leaves S_TG out
# e.g. bash scripts/ab_gpu.sh --texts -m /tmp/m/7 -- 'head build-static/tllm' 'norope build-static/tllm TLLM_CL_NO_FEW_ROPE=1'
#      (a value with spaces in quotes: 'ru8 build-static/tllm "TLLM_CL_OPTS=-DFEW_ROWS=1 -DFEW_RU=8"')
set -euo pipefail
cd "$(dirname "$0")/.."
NPS="1 2" ROUNDS=3 P=128 N=64 PP="" TG="" TEXTS=0 DEV=opencl
MODELS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    -m) MODELS+=("$2"); shift 2 ;;
    --np) NPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --prompt) P=$2; shift 2 ;;
    --gen) N=$2; shift 2 ;;
    --pp) PP=$2; shift 2 ;;
    --tg) TG=$2; shift 2 ;;
    --texts) TEXTS=1; shift ;;
    --device) DEV=$2; shift 2 ;;
    *) echo "ab_gpu.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] && shift
if [ ${#MODELS[@]} -eq 0 ] || [ $# -lt 2 ]; then
  echo "usage: ab_gpu.sh [options] -m MODEL [-m MODEL ...] -- 'NAME BINARY [VAR=VALUE ...]' 'NAME BINARY ...'" >&2
  exit 2
fi
VARIANTS=("$@")
for v in "${VARIANTS[@]}"; do
  eval "w=($v)"
  [ ${#w[@]} -ge 2 ] && [ -x "${w[1]}" ] || { echo "ab_gpu.sh: variant '$v': no executable binary '${w[1]:-}'" >&2; exit 2; }
done

# run VARIANT ARGS...: the variant's binary with its environment
run() {
  local -a w
  eval "w=($1)" # (shell words: a value with spaces in quotes)
  shift
  env "${w[@]:2}" "${w[1]}" "$@"
}
# json FIELD: the field of the first row of bench's -o json, or "-" when the run failed
json() { python3 -c 'import json,sys
try: print("%.1f" % json.load(sys.stdin)[0][sys.argv[1]], end="")
except Exception: print("-", end="")' "$1"; }

for m in "${MODELS[@]}"; do
  for b in $NPS; do
    for round in $(seq 1 "$ROUNDS"); do
      line="$(basename "$m") B=$b round $round:"
      for v in "${VARIANTS[@]}"; do
        s=$(run "$v" bench -m "$m" --device "$DEV" -np "$b" -p "$P" -n "$N" -r 3 -o json 2>/dev/null | json speed_tg || true)
        line+=" ${v%% *} $s"
      done
      echo "$line"
    done
  done
  if [ -n "$PP" ]; then
    for round in $(seq 1 "$ROUNDS"); do
      line="$(basename "$m") pp$PP round $round:"
      for v in "${VARIANTS[@]}"; do
        s=$(run "$v" bench -m "$m" --device "$DEV" -p "$PP" -n 0 -r 3 -o json 2>/dev/null | json avg_ts || true)
        line+=" ${v%% *} $s"
      done
      echo "$line"
    done
  fi
  if [ -n "$TG" ]; then
    for round in $(seq 1 "$ROUNDS"); do
      line="$(basename "$m") tg$TG round $round:"
      for v in "${VARIANTS[@]}"; do
        s=$(run "$v" bench -m "$m" --device "$DEV" -p 0 -n "$TG" -r 3 -o json 2>/dev/null | json avg_ts || true)
        line+=" ${v%% *} $s"
      done
      echo "$line"
    done
  fi
  if [ "$TEXTS" = 1 ]; then
    tmp=$(mktemp -d)
    printf '%s\n' '{"prompt": "The quick brown fox"}' '{"prompt": "Once upon a time in a land far"}' \
      '{"prompt": "def fib(n):"}' >"$tmp/p.jsonl"
    for b in $NPS; do
      line="$(basename "$m") greedy texts, -np $b:"
      i=0
      for v in "${VARIANTS[@]}"; do
        run "$v" generate -m "$m" --device "$DEV" --prompts "$tmp/p.jsonl" -np "$b" -n 24 --ignore-eos -o "$tmp/g$i.jsonl" \
          >/dev/null 2>&1 || true
        python3 -c 'import json,sys; [print(json.loads(l)["text"]) for l in open(sys.argv[1])]' "$tmp/g$i.jsonl" \
          >"$tmp/t$i" 2>/dev/null || echo "(no output)" >"$tmp/t$i"
        if [ $i -gt 0 ]; then
          if cmp -s "$tmp/t0" "$tmp/t$i"; then line+=" ${v%% *} same"; else line+=" ${v%% *} DIFFER"; fi
        fi
        i=$((i + 1))
      done
      echo "$line ($(wc -c <"$tmp/t0") bytes of the first's text)"
    done
    rm -rf "$tmp"
  fi
done
