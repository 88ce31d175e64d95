#!/usr/bin/env bash
# What constrained decoding costs: the same batch of prompts through `tllm generate --prompts`, free
# and under a JSON schema, alternating, ROUNDS times; prints the generated tokens per second of each
# run and the grammar's own counts (the vocabulary's byte-order index, built once a process; masks
# computed, their time, masks found in the cache).
#   bash scripts/bench_structured.sh TLLM MODEL NP [ROUNDS=2] [-- extra generate flags, e.g. --device opencl]
# With ROUNDS > 1 the last line is the median of the rounds' schema / same.
# PROMPTS in the environment: how many prompts (default NP, one batch); more keep the batch full by
# continuous batching and spread what a process pays once (the vocabulary's index, each state's first mask)
# over more tokens, as a server running a while does.
# Every sequence runs the whole -n 96 tokens in both runs (the same work but for the masks): the free
# run with --ignore-eos, the constrained one under a schema of one string of at least 1000 characters
# (a counted string: every token meets a grammar state not seen before, the masks' worst case). SCHEMA
# in the environment replaces it (a schema whose answers end early measures fewer tokens). Synthetic weights
# (tllm synth --tokenizer tests/data/tokenizer) measure it as well as trained ones: the grammar's work
# depends on the states the text passes, not on what it says.
# A third run, "same", is free again but each prompt stops where its constrained answer stopped
# (per-line max_tokens, --ignore-eos): the same tokens in the same batch shapes, so schema / same is what
# the grammar costs in throughput even when the answers end early (the last column).
set -euo pipefail
TLLM=$1 MODEL=$2 NP=$3 ROUNDS=${4:-2}
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 "${PROMPTS:-$NP}"); do
  printf '{"id": %d, "prompt": "Record %d of the archive, as JSON: {\\"text\\": \\""}\n' "$i" "$i"
done > "$dir/prompts.jsonl"
schema=${SCHEMA:-'{"type": "object", "properties": {"text": {"type": "string", "minLength": 1000}}, "required": ["text"]}'}
run() { # name, prompts, flags...
  local name=$1 prompts=$2
  shift 2
  rm -f "$dir/out.jsonl"
  TLLM_GRAMMAR_STATS=1 "$TLLM" generate -m "$MODEL" --prompts "$prompts" -o "$dir/out.jsonl" -n 96 -np "$NP" \
    "$@" 2> "$dir/err.txt" > /dev/null
  local line masks mk
  line=$(grep -a "in forward steps" "$dir/err.txt" | tail -1)
  mk=$(echo "$line" | sed -n 's/.*(\([0-9.]*\) s of them making the grammars. masks).*/\1/p')
  masks=$(grep -a "^grammar" "$dir/err.txt" | sed 's/^grammar: //; s/^grammar index: /index: /' | paste -sd ";" - | sed "s/;/; /" || true)
  # tokens, tok/s, and the time outside the forward steps (sampling, masks, bookkeeping) per token
  echo "$line" | sed -n 's/.*generated \([0-9]*\) (\([0-9.]*\) tok\/s); \([0-9.]*\) s of \([0-9.]*\) s in forward steps.*/\1 \2 \3 \4/p' |
    awk -v name="$name" -v masks="$masks" -v ref="${ref:-}" -v mk="${mk:-}" '{ printf "%-8s %6d tokens %9.1f tok/s   outside the forward steps: %.3f ms a token%s%s%s\n",
      name, $1, $2, ($4 - $3) * 1000 / $1, mk != "" ? sprintf(", making bitsets %.3f", mk * 1000 / $1) : "", masks != "" ? "   | " masks : "",
      ref != "" ? sprintf("   | schema / same: %.3f", ref / $2) : "" }'
}
tps() { grep -a "in forward steps" "$dir/err.txt" | tail -1 | sed -n 's/.*generated [0-9]* (\([0-9.]*\) tok\/s).*/\1/p'; }
for r in $(seq 1 "$ROUNDS"); do
  ref= run free "$dir/prompts.jsonl" --ignore-eos "$@"
  ref= run schema "$dir/prompts.jsonl" --json-schema "$schema" "$@"
  schema_tps=$(tps)
  python3 - "$dir/out.jsonl" "$dir/prompts.jsonl" > "$dir/same.jsonl" << 'EOF'
import json, sys
n = {r["id"]: r["completion_tokens"] for r in map(json.loads, open(sys.argv[1]))}
for line in open(sys.argv[2]):
    p = json.loads(line)
    p["max_tokens"] = max(1, n[p["id"]])
    print(json.dumps(p))
EOF
  ref=$schema_tps run same "$dir/same.jsonl" --ignore-eos "$@"
  echo "$schema_tps $(tps)" >> "$dir/ratios"
done
# a round's ratio moves by ~0.1 on a device (its steps are host-bound): the median of the rounds
if [ "$ROUNDS" -gt 1 ]; then
  awk '{ printf "%.6f\n", $1 / $2 }' "$dir/ratios" | sort -g | awk '{ r[NR] = $1 } END {
    printf "schema / same over %d rounds: median %.3f (%.3f - %.3f)\n", NR, NR % 2 ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2, r[1], r[NR] }'
fi
