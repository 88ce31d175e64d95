#!/usr/bin/env bash
# Run a Python test with packages from PyPI: in the virtual environment VENV (made, and the packages
# installed, when missing and PyPI is reachable), else with the system python3, where the test skips
# what needs them. The packages are the tests' tools (numpy, gguf), never tllm's dependencies.
#   with_venv.sh VENV "PKG PKG..." SCRIPT ARGS...
set -u
venv=$1 pkgs=$2
shift 2
py=python3
if [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1; then
  # shellcheck disable=SC2086
  if "$venv/bin/python" -m pip install -q --disable-pip-version-check $pkgs >/dev/null 2>&1 ||
     "$venv/bin/python" -c "import sys; sys.exit(0)" >/dev/null 2>&1; then
    py=$venv/bin/python
  fi
fi
exec "$py" "$@"
