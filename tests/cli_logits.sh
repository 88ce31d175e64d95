#!/usr/bin/env bash
# tllm logits from the command line: output size, --last, and clean one-line errors.
set -u
TLLM=$1; DATA=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }

# every row: 3 ids x 4096 vocab x 4 bytes
"$TLLM" logits -m "$DATA/models/q4-g64" --ids 1,2,3 -o "$tmp/all.f32" && ok || bad "logits failed"
[ "$(stat -c %s "$tmp/all.f32" 2>/dev/null)" = $((3*4096*4)) ] && ok || bad "all rows: wrong size"
"$TLLM" logits -m "$DATA/models/q4-g64" --ids 1,2,3 --last -o "$tmp/last.f32" && ok || bad "--last failed"
[ "$(stat -c %s "$tmp/last.f32" 2>/dev/null)" = $((4096*4)) ] && ok || bad "--last: wrong size"
# the last row of the full output equals --last (1e-5 of the row's scale: the kernels for 1 and for
# many tokens sum in different orders)
python3 - "$tmp/all.f32" "$tmp/last.f32" <<'PY' && ok || bad "--last differs from the last row"
import array, sys
a = array.array("f"); a.frombytes(open(sys.argv[1], "rb").read())
b = array.array("f"); b.frombytes(open(sys.argv[2], "rb").read())
row = a[-len(b):]
scale = max(abs(v) for v in row)
sys.exit(0 if max(abs(x - y) for x, y in zip(row, b)) <= 1e-5 * scale else 1)
PY

# --device opencl (when there is an OpenCL device: PoCL in CI): the same rows from the device's prompt
# kernels, and --last with the prompt on the CPU and its last id a device decode step (1e-4 of the
# row's scale: float32 activations on both, sums in other orders)
close() { # a b: every row of b within 1e-4 of its scale from a's
python3 - "$1" "$2" <<'PY'
import array, sys
a = array.array("f"); a.frombytes(open(sys.argv[1], "rb").read())
b = array.array("f"); b.frombytes(open(sys.argv[2], "rb").read())
a = a[len(a) - len(b):]
for r in range(0, len(b), 4096):
    scale = max(abs(v) for v in a[r:r + 4096])
    if max(abs(x - y) for x, y in zip(a[r:r + 4096], b[r:r + 4096])) > 1e-4 * scale:
        sys.exit(1)
PY
}
if "$TLLM" devices 2>/dev/null | grep -q '^opencl:'; then
  "$TLLM" logits -m "$DATA/models/q4-g64" --ids 1,2,3 -o "$tmp/dev.f32" --device opencl && ok || bad "--device opencl failed"
  close "$tmp/all.f32" "$tmp/dev.f32" && ok || bad "--device opencl: rows differ from the CPU's"
  "$TLLM" logits -m "$DATA/models/q4-g64" --ids 1,2,3 --last -o "$tmp/devlast.f32" --device opencl --prefill cpu && ok || bad "--device opencl --prefill cpu --last failed"
  close "$tmp/all.f32" "$tmp/devlast.f32" && ok || bad "--device opencl --last: differs from the CPU's last row"
else
  echo "no OpenCL device: --device opencl skipped"
fi

# errors: non-zero exit, one line on stderr starting with "tllm: ", no output file
expect_err() { # expected-substring args...
  local want=$1; shift
  local err
  err=$("$TLLM" "$@" 2>&1 >/dev/null); local rc=$?
  [ $rc -ne 0 ] && ok || bad "'$*' exited 0"
  [ "$(printf '%s\n' "$err" | wc -l)" = 1 ] && ok || bad "'$*': not one line: $err"
  case "$err" in "tllm: "*"$want"*) ok ;; *) bad "'$*': got '$err', want '$want'" ;; esac
}
expect_err "cannot open model directory" logits -m "$tmp/nope" --ids 1 -o "$tmp/x.f32"
expect_err "token id 5000 is out of range [0, 4096)" logits -m "$DATA/models/q4-g64" --ids 1,5000 -o "$tmp/x.f32"
expect_err "not a comma-separated list" logits -m "$DATA/models/q4-g64" --ids 1,,x -o "$tmp/x.f32"
expect_err "unknown option '--bogus'" logits --bogus
expect_err "--ids and -o are required" logits -m "$DATA/models/q4-g64"
expect_err "unknown command 'frobnicate'" frobnicate
expect_err "--prefill: 'gpu' is not auto, cpu or device" logits -m "$DATA/models/q4-g64" --ids 1 -o "$tmp/x.f32" --prefill gpu
expect_err "--device: 'cuda' is not cpu, opencl or opencl:N" logits -m "$DATA/models/q4-g64" --ids 1 -o "$tmp/x.f32" --device cuda
[ ! -e "$tmp/x.f32" ] && ok || bad "an output file was left behind by a failed run"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
