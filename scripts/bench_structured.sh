#!/usr/bin/env bash
# What constrained decoding costs: the same batch of prompts through `tllm generate --prompts`, free
# and under a JSON schema, alternating, ROUNDS times; prints the generated tokens per second of each
# run and the grammar's own counts (the vocabulary's byte-order index, built once a process; masks
# computed, their time, masks found in the cache).
#   bash scripts/bench_structured.sh TLLM MODEL NP [ROUNDS=2] [-- extra generate flags, e.g. --device opencl]
# Every sequence runs the whole -n 96 tokens in both runs (the same work but for the masks): the free
# run with --ignore-eos, the constrained one under a schema of one string of at least 1000 characters
# (a counted string: every token meets a grammar state not seen before, the masks' worst case). SCHEMA
# in the environment replaces it (a schema whose answers end early measures fewer tokens). Synthetic weights
# (tllm synth --tokenizer tests/data/tokenizer) measure it as well as trained ones: the grammar's work
# depends on the states the text passes, not on what it says.
set -euo pipefail
TLLM=$1 MODEL=$2 NP=$3 ROUNDS=${4:-2}
shift $(($# < 4 ? $# : 4))
[ "${1:-}" = "--" ] && shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for i in $(seq 1 "$NP"); do
  printf '{"id": %d, "prompt": "Record %d of the archive, as JSON: {\\"text\\": \\""}\n' "$i" "$i"
done > "$dir/prompts.jsonl"
schema=${SCHEMA:-'{"type": "object", "properties": {"text": {"type": "string", "minLength": 1000}}, "required": ["text"]}'}
run() { # name, flags...
  local name=$1
  shift
  rm -f "$dir/out.jsonl"
  TLLM_GRAMMAR_STATS=1 "$TLLM" generate -m "$MODEL" --prompts "$dir/prompts.jsonl" -o "$dir/out.jsonl" -n 96 -np "$NP" \
    "$@" 2> "$dir/err.txt" > /dev/null
  local line masks
  line=$(grep -a "in forward steps" "$dir/err.txt" | tail -1)
  masks=$(grep -a "^grammar" "$dir/err.txt" | sed 's/^grammar: //; s/^grammar index: /index: /' | paste -sd ";" - | sed "s/;/; /" || true)
  # tokens, tok/s, and the time outside the forward steps (sampling, masks, bookkeeping) per token
  echo "$line" | sed -n 's/.*generated \([0-9]*\) (\([0-9.]*\) tok\/s); \([0-9.]*\) s of \([0-9.]*\) s in forward steps.*/\1 \2 \3 \4/p' |
    awk -v name="$name" -v masks="$masks" '{ printf "%-8s %6d tokens %9.1f tok/s   outside the forward steps: %.3f ms a token%s\n",
      name, $1, $2, ($4 - $3) * 1000 / $1, masks != "" ? "   | " masks : "" }'
}
for r in $(seq 1 "$ROUNDS"); do
  run free --ignore-eos "$@"
  run schema --json-schema "$schema" "$@"
done
