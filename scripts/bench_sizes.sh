#!/usr/bin/env bash
# The size table (issue 38): tllm at every Qwen2 shape on one device, and llama.cpp beside it when an
# already built one is given. For each shape it synthesizes a 4-bit g64 checkpoint (`tllm synth --seed
# 1`, kept in CACHE between runs) and measures pp512, pp2048, tg128 (`tllm bench`, the median of REPS
# repetitions) and the aggregate decode rate S_TG at B sequences at once (`tllm bench -np`, prompts of
# 128 tokens, 128 generated each); ROUNDS rounds, every shape (and the peer) once a round, alternating.
#   bash scripts/bench_sizes.sh [TLLM]        (default build-static/tllm, else build/tllm)
# Environment:
#   SIZES   shapes to run (default "0.5b 1.5b 3b 7b": configs/qwen2.5-*, qwen2-7b-instruct.json), or
#           config.json paths
#   DEVICE  tllm's --device (default opencl);  NP  the batch sizes (default 1,4,16,64,256)
#   ROUNDS  (default 2);  REPS  repetitions of each pp/tg test (default 3);  OUT  (default gpu-sizes)
#   CACHE   where the checkpoints go (default /tmp; 7B takes 4.4 GB)
#   LLAMA_BIN  a folder with llama.cpp's llama-bench and llama-batched-bench, built by hand (never by a
#           script of this project), and GGUF_DIR a folder with SIZE.gguf (e.g. 0.5b.gguf): the same
#           weights as Q4_0 (`--pure`: 4.5 bits a weight as tllm's; ../shared/peers says how to write
#           them); LLAMA_ARGS (default "-ngl 99 -fa 1")
# The table goes to stdout and OUT/table.md; every run's JSON stays in OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
TLLM=${1:-}
[ -n "$TLLM" ] || { [ -x build-static/tllm ] && TLLM=build-static/tllm || TLLM=build/tllm; }
SIZES=${SIZES:-"0.5b 1.5b 3b 7b"}
DEVICE=${DEVICE:-opencl}
NP=${NP:-1,4,16,64,256}
ROUNDS=${ROUNDS:-2}
REPS=${REPS:-3}
OUT=${OUT:-gpu-sizes}
CACHE=${CACHE:-/tmp}
LLAMA_ARGS=${LLAMA_ARGS:-"-ngl 99 -fa 1"}
mkdir -p "$OUT"
# NVIDIA's OpenCL is installed without an ICD file on the lent machines: register it
if [ -z "${OCL_ICD_VENDORS:-}" ] && ldconfig -p 2>/dev/null | grep -q libnvidia-opencl; then
  mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
fi

config_of() {
  case "$1" in
    0.5b) echo configs/qwen2.5-0.5b-instruct.json ;;
    1.5b) echo configs/qwen2.5-1.5b-instruct.json ;;
    3b) echo configs/qwen2.5-3b-instruct.json ;;
    7b) echo configs/qwen2-7b-instruct.json ;;
    *) [ -f "$1" ] && echo "$1" || { echo "bench_sizes: $1: not a size (0.5b 1.5b 3b 7b) or a config file" >&2; exit 2; } ;;
  esac
}
name_of() { case "$1" in *.json) basename "$(dirname "$1")" ;; *) echo "$1" ;; esac; }

for s in $SIZES; do
  c=$(config_of "$s")
  m="$CACHE/tllm-sizes-$(name_of "$s")-q4"
  [ -f "$m/config.json" ] || "$TLLM" synth --config "$c" --out "$m" --tokenizer tests/data/tokenizer --seed 1 >&2
done
"$TLLM" devices > "$OUT/devices.txt" 2>&1 || true
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true

for r in $(seq 1 "$ROUNDS"); do
  for s in $SIZES; do
    n=$(name_of "$s")
    m="$CACHE/tllm-sizes-$n-q4"
    echo "round $r: $n" >&2
    "$TLLM" bench -m "$m" --device "$DEVICE" -p 512,2048 -n 128 -r "$REPS" -o json > "$OUT/tllm-$n-bench-$r.json"
    "$TLLM" bench -m "$m" --device "$DEVICE" -np "$NP" -p 128 -n 128 -r 2 -o json > "$OUT/tllm-$n-np-$r.json"
    if [ -n "${LLAMA_BIN:-}" ] && [ -f "${GGUF_DIR:-.}/$n.gguf" ]; then
      # shellcheck disable=SC2086
      "$LLAMA_BIN/llama-bench" -m "$GGUF_DIR/$n.gguf" $LLAMA_ARGS -p 512,2048 -n 128 -r "$REPS" -o json \
        > "$OUT/llama-$n-bench-$r.json" 2>/dev/null
      # shellcheck disable=SC2086
      "$LLAMA_BIN/llama-batched-bench" -m "$GGUF_DIR/$n.gguf" $LLAMA_ARGS -c $((256 * (128 + 128))) -npp 128 -ntg 128 \
        -npl "$NP" --output-format jsonl 2>&1 | grep '^{' > "$OUT/llama-$n-np-$r.jsonl" || true
    fi
  done
done

python3 - "$OUT" "$SIZES" "$NP" "$ROUNDS" <<'EOF' | tee "$OUT/table.md"
import json, os, statistics, sys
out, sizes, nps, rounds = sys.argv[1], sys.argv[2].split(), [int(b) for b in sys.argv[3].split(",")], int(sys.argv[4])

def load(path):
    if not os.path.exists(path):
        return []
    text = open(path).read().strip()
    if not text:
        return []
    return json.loads(text) if text.startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]

def figures(engine, n, r):
    """{test: tokens/s} of one engine, one shape, one round"""
    f = {}
    for row in load(os.path.join(out, "%s-%s-bench-%d.json" % (engine, n, r))):
        ts = statistics.median(row["samples_ts"]) if row.get("samples_ts") else row["avg_ts"]
        if row["n_prompt"] and not row["n_gen"]:
            f["pp%d" % row["n_prompt"]] = ts
        elif row["n_gen"] and not row["n_prompt"]:
            f["tg%d" % row["n_gen"]] = ts
    for row in load(os.path.join(out, "%s-%s-np-%d.json%s" % (engine, n, r, "l" if engine == "llama" else ""))):
        f["B=%d" % row.get("n_parallel", row.get("pl", 0))] = row["speed_tg"]
    return f

def cell(vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    fmt = lambda v: "{:,.0f}".format(v)
    return fmt(lo) if fmt(lo) == fmt(hi) else "%s-%s" % (fmt(lo), fmt(hi))

tests = ["pp512", "pp2048", "tg128"] + ["B=%d" % b for b in nps]
names = [os.path.basename(os.path.dirname(s)) if s.endswith(".json") else s for s in sizes]
peer = any(os.path.exists(os.path.join(out, "llama-%s-bench-1.json" % n)) for n in names)
print("| shape | " + " | ".join(t if t.startswith(("pp", "tg")) else "S_TG " + t for t in tests) + " |")
print("| --- " * (len(tests) + 1) + "|")
for n in names:
    rows = [(e, [figures(e, n, r) for r in range(1, rounds + 1)]) for e in (["llama", "tllm"] if peer else ["tllm"])]
    cells = []
    for t in tests:
        parts = [cell([f.get(t) for f in fs]) for _, fs in rows]
        meds = [[f[t] for f in fs if f.get(t)] for _, fs in rows]
        ratio = " (%.2fx)" % (statistics.median(meds[1]) / statistics.median(meds[0])) if peer and all(meds) else ""
        cells.append(" / ".join(parts) + ratio)
    print("| %s | %s |" % (n, " | ".join(cells)))
print("\ntokens/s%s; ranges are the %d rounds; pp and tg the median of each run's repetitions, S_TG the aggregate "
      "decode rate of B sequences (prompts of 128 tokens, 128 generated each)%s" % (" (llama.cpp / tllm)" if peer else "", rounds,
      "; (x) tllm / llama.cpp, of the rounds' medians" if peer else ""))
EOF
