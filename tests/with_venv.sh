#!/usr/bin/env bash
# Run a Python test with packages from PyPI: in the virtual environment VENV (made, and the packages
# installed, when missing and PyPI is reachable), else with the system python3, where the test skips
# what needs them. The packages are the tests' tools (numpy, gguf), never tllm's dependencies.
#   with_venv.sh VENV "PKG PKG..." SCRIPT ARGS...
set -u
venv=$1 pkgs=$2
shift 2
py=python3
# ctest -j runs several tests over one VENV: one makes it and installs while the others wait on the lock,
# else a test starts on a half-made venv without its packages and skips (flock: util-linux, on every Debian)
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
command -v flock >/dev/null 2>&1 && flock 9
if [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  if "$venv/bin/python" -m pip install -q --disable-pip-version-check $pkgs >/dev/null 2>&1 ||
     "$venv/bin/python" -c "import sys; sys.exit(0)" >/dev/null 2>&1; then
    py=$venv/bin/python
  fi
fi
exec 9>&-
exec "$py" "$@"
