#!/usr/bin/env bash
# The Python package's batch generation against the CLI's on the same prompt file, side by side:
# `tllm generate --prompts FILE` and `tllm.Model(...).generate_batch(lines)` alternate ROUNDS times on
# one model with the same settings (greedy, -np, -n, --fast-decode as the CLI's batch default); each
# reports generated tokens per second of the batch's own time (the model's load left out of both), and
# the texts must be equal.
#   scripts/bench_python.sh [-m MODEL] [-np 16] [-n 64] [--prompts 64] [--rounds 3] [-t THREADS]
# MODEL defaults to a synthesized Qwen2.5-0.5B (tllm synth, 4-bit) under build/bench-models. Needs the
# package in build/venv-python (ctest -R python_package makes it).
set -euo pipefail
cd "$(dirname "$0")/.."
model="" np=16 n=64 count=64 rounds=3 threads=0
while [ $# -gt 0 ]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    -np) np=$2; shift 2 ;;
    -n) n=$2; shift 2 ;;
    --prompts) count=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    *) echo "bench_python: unknown option $1" >&2; exit 2 ;;
  esac
done
py=build/venv-python/bin/python
[ -x "$py" ] && "$py" -c "import tllm" 2>/dev/null || { echo "bench_python: no tllm package in build/venv-python (run ctest -R python_package)" >&2; exit 1; }
if [ -z "$model" ]; then
  model=build/bench-models/qwen2.5-0.5b-q4
  [ -f "$model/config.json" ] || ./build/tllm synth --config configs/qwen2.5-0.5b-instruct.json --out "$model" \
    --tokenizer tests/data/tokenizer >/dev/null
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" - "$work/prompts.txt" "$count" <<'EOF'
import random, sys
words = "the a tar grep find sed awk file files line lines print match pattern directory archive list show".split()
rnd = random.Random(1)
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(" ".join(rnd.choice(words) for _ in range(rnd.randint(8, 40))) + "\n")
EOF
tflag=()
[ "$threads" != 0 ] && tflag=(-t "$threads")
echo "model $model, $count prompts, -np $np, -n $n, greedy, $rounds rounds alternating"
for r in $(seq "$rounds"); do
  rm -f "$work/cli.jsonl"
  ./build/tllm generate -m "$model" --device cpu "${tflag[@]}" --prompts "$work/prompts.txt" -o "$work/cli.jsonl" \
    -np "$np" -n "$n" --temp 0 2>"$work/cli.err" >/dev/null
  cli=$(grep -o 'generated [0-9]* ([0-9.]* tok/s)' "$work/cli.err" | grep -o '([0-9.]*' | tr -d '(')
  pyr=$("$py" - "$model" "$work/prompts.txt" "$np" "$n" "$threads" "$work/cli.jsonl" <<'EOF'
import json, sys, time, tllm
model, prompts, np_, n, threads, cli_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
lines = [l.rstrip("\n") for l in open(prompts)]
with tllm.Model(model, device="cpu", threads=threads, fast_decode=True) as m:
    eos_free = {"temperature": 0, "max_tokens": n}
    t = time.perf_counter()
    out = m.generate_batch(lines, parallel=np_, **eos_free)
    el = time.perf_counter() - t
cli = {}
for l in open(cli_out):
    rec = json.loads(l)
    cli[rec["id"]] = rec["text"]
same = sum(1 for i, o in enumerate(out) if cli.get(i + 1, cli.get(str(i + 1))) == o.text)
print(f"{sum(o.completion_tokens for o in out) / el:.1f} {same}/{len(out)}")
EOF
)
  echo "round $r: cli ${cli} tok/s, python ${pyr%% *} tok/s (texts equal: ${pyr##* })"
done
