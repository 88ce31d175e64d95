#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan + UBSan, into build-fuzz/) and run each for SECONDS.
#   bash scripts/fuzz.sh [SECONDS=60] [TARGET...]      (targets: tests/fuzz/fuzz_*.c)
# Corpora grow in build-fuzz/corpus/TARGET (seeded from tests/fuzz/corpus/TARGET). A crash, leak,
# sanitizer report or timeout is saved to tests/fuzz/crashes/TARGET/ (commit it: ctest replays that
# folder in every build) and makes the script fail. Prints executions per target.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=(safetensors gguf config tokenizer_load encode decode chat_template jinja json_schema prompt_line oai_request)
command -v clang >/dev/null || { echo "fuzz: clang is not installed (scripts/setup.sh installs it)" >&2; exit 1; }

CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTLLM_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'fuzz_%s ' "${TARGETS[@]}") >/dev/null

export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
printf '%-16s %12s %10s %s\n' target executions exec/s result
for t in "${TARGETS[@]}"; do
  corpus=build-fuzz/corpus/$t crashes=tests/fuzz/crashes/$t
  mkdir -p "$corpus" "$crashes"
  log=build-fuzz/fuzz_$t.log
  # -rss_limit_mb: a hostile input must not make the engine allocate without bound
  if build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    result=ok
  else
    result="FAILED (see $log; the input is in $crashes/)"
    status=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  printf '%-16s %12s %10s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
  rmdir "$crashes" 2>/dev/null || true   # keep only folders that hold a finding
done
exit $status
