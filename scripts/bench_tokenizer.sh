#!/usr/bin/env bash
# Tokenizer encoding speed (one thread) on a few MB each of English prose, Chinese and C code
# found on any Debian machine. Usage: scripts/bench_tokenizer.sh [TOKENIZER_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
TOK=${1:-tests/data/tokenizer}
[ -x build/tllm ] || bash scripts/setup.sh
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# English: the license texts Debian ships, repeated up to ~4 MB
cat /usr/share/common-licenses/{GPL-3,Apache-2.0,GFDL-1.3,LGPL-3,MPL-2.0} > "$tmp/one.txt"
while [ "$(stat -c %s "$tmp/one.txt")" -lt 4000000 ]; do cat "$tmp/one.txt" "$tmp/one.txt" > "$tmp/two.txt"; mv "$tmp/two.txt" "$tmp/one.txt"; done
mv "$tmp/one.txt" "$tmp/english.txt"

# Chinese: the zh_CN message catalogs installed on the machine (gettext .mo files)
python3 - "$tmp/chinese.txt" <<'PY'
import gettext, glob, sys
out = []
for f in sorted(glob.glob('/usr/share/locale/zh_CN/LC_MESSAGES/*.mo') + glob.glob('/usr/share/vim/*/lang/zh_CN.UTF-8/LC_MESSAGES/*.mo')):
    try:
        with open(f, 'rb') as fp:
            out += [v for v in gettext.GNUTranslations(fp)._catalog.values() if isinstance(v, str)]
    except Exception:
        pass
text = '\n'.join(out)
if not text:
    sys.exit('no zh_CN catalogs found')
while len(text.encode()) < 2_000_000:
    text += '\n' + text
open(sys.argv[1], 'w').write(text)
PY

# Code: the C headers in /usr/include, up to ~4 MB
(find /usr/include -name '*.h' -type f | sort | head -2000 | xargs cat 2>/dev/null || true) | head -c 4000000 > "$tmp/code.txt" || true

echo "tokenizer: $TOK ($(nproc) cores, one thread used)"
./build/tllm tokenize -m "$TOK" --bench "$tmp/english.txt" "$tmp/chinese.txt" "$tmp/code.txt" | sed "s#$tmp/##"
