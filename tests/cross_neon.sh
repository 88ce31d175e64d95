#!/usr/bin/env bash
# The NEON kernels on every change though no ARM machine is at hand: test_qpack_kernels (and
# test_qmatvec_kernels, the float decode kernel) built with
# Debian's aarch64 cross compiler and run under qemu-user, on an emulated CPU with the dot-product
# extension (the NEON kernel, compared bit for bit with the portable one) and on one without it (the
# portable kernel). Exit 77 (skipped) when the cross compiler or qemu is not installed.
#   usage: cross_neon.sh REPO_ROOT BUILD_DIR
set -euo pipefail
ROOT=$1 OUT=$2
CC=aarch64-linux-gnu-gcc QEMU=qemu-aarch64
command -v "$CC" >/dev/null && command -v "$QEMU" >/dev/null || { echo "cross_neon: $CC or $QEMU is not installed"; exit 77; }
BIN=$OUT/test_qpack_kernels_arm64
"$CC" -O2 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -I"$ROOT" -o "$BIN" "$ROOT/tests/test_qpack_kernels.c" \
  "$ROOT/tests/check.c" "$ROOT"/kernels/cpu/{qpack,qpack_ref,qpack_matmul,qpack_neon,qpack_avx2,qpack_avxvnni,qpack_avx512,qpack_amx,cpu_features}.c \
  "$ROOT"/base/{dtype,error}.c -lm
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
"$QEMU" -cpu max "$BIN" neon             # sdot: the NEON kernel
"$QEMU" -cpu cortex-a53 "$BIN" ref       # ARMv8.0, no dot product: the portable kernel
TLLM_CPU=ref "$QEMU" -cpu max "$BIN" ref # the switch
# the float (--exact) decode kernel: NEON against the scalar oracle, and the portable loop without it
BIN2=$OUT/test_qmatvec_kernels_arm64
"$CC" -O2 -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -I"$ROOT" -o "$BIN2" "$ROOT/tests/test_qmatvec_kernels.c" \
  "$ROOT/tests/check.c" "$ROOT"/kernels/cpu/{qmatmul,qmatmul_ref,qmatmul_avx2,qmatmul_neon,cpu_features}.c \
  "$ROOT"/base/{dtype,error}.c -lm
"$QEMU" -cpu max "$BIN2" neon
"$QEMU" -cpu cortex-a53 "$BIN2" ref
