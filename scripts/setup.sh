#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for tllm and build it (Release, into build/).
# Installs only the packages that are missing; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake pkg-config libjson-c-dev libpcre2-dev libutf8proc-dev libreadline-dev
      ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libmicrohttpd-dev python3 python3-venv
      clang libclang-rt-dev valgrind   # the test command's fuzzing (libFuzzer) and valgrind runs
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user   # the NEON kernel, cross-built and emulated
      haproxy)  # the load-balancer recipe of docs/deploy.md (tests/deploy_haproxy.py)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
echo "setup: built build/tllm" >&2
