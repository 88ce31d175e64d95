#!/usr/bin/env bash
# The Python package (python/): pip-installed into a virtual environment as a user installs it (its
# libtllm.so built by scikit-build-core), then python/tests under pytest. Under the sanitizers the
# package's module runs over the sanitized build's libtllm.so instead (LD_PRELOAD'ed runtime, leaks not
# checked: the interpreter's own are not ours). Skips (77) when the venv or PyPI is not there.
#   python_package.sh VENV CLI LIBTLLM [sanitized]
set -u
venv=$1 cli=$2 lib=$3 sanitized=${4:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
if ! { [ -x "$venv/bin/python" ] || python3 -m venv "$venv" >/dev/null 2>&1; }; then
  echo "skip: no python3 venv"; exit 77
fi
py=$venv/bin/python
if ! "$py" -m pip install -q --disable-pip-version-check pytest numpy scikit-build-core >/dev/null 2>&1; then
  echo "skip: PyPI is not reachable (pytest, numpy, scikit-build-core)"; exit 77
fi
export TLLM_CLI=$cli TLLM_REPO=$repo
if [ -z "$sanitized" ]; then
  # Ray Data for python/tests/test_ray.py (which skips without it)
  "$py" -c "import ray.data" 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check "ray[data]" >/dev/null 2>&1 ||
    echo "note: ray[data] could not be installed: the Ray tests skip"
  # what a user runs; build isolation off: the build dependency is in the venv already
  "$py" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps "$repo/python" ||
    { echo "FAIL: pip install ./python"; exit 1; }
  cd "$venv" || exit 1 # not the source tree: the installed package is the one imported
  exec "$py" -m pytest -q -rs -p no:cacheprovider "$repo/python/tests"
fi
"$py" -m pip uninstall -q -y tllm >/dev/null 2>&1
export TLLM_LIBRARY=$lib PYTHONPATH=$repo/python/src TLLM_TEST_CYCLES=200 TLLM_TEST_SANITIZED=1
# A bounded quarantine (ASan's default holds up to 256 MB of freed memory): the create/free cycles test
# reads the process's RSS, which would otherwise count freed blocks waiting in the quarantine as growth
# (measured: 8.5-9.6 MB over 200 cycles with the default, none with 16 MB; the unsanitized run checks
# 1000 cycles with no quarantine at all)
LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so) ASAN_OPTIONS=detect_leaks=0:quarantine_size_mb=16 \
  exec "$py" -m pytest -q -p no:cacheprovider "$repo/python/tests"
