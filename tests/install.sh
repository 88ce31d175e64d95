#!/usr/bin/env bash
# `cmake --install` into a temporary prefix: the installed tllm finds the installed demo model with no
# -m, and a program compiled against the installed header and library (pkg-config) generates from it.
# usage: install.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS]
set -u
build=$1 src=$2 extra=${3:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

cmake --install "$build" --prefix "$tmp/p" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; bad "cmake --install"; }
for f in bin/tllm lib/libtllm.a lib/libtllm.so include/tllm.h lib/pkgconfig/tllm.pc share/tllm/models/tllm-man-demo/model.safetensors \
         share/tllm/models/tllm-man-demo/tokenizer.json share/man/man1/tllm.1; do
  [ -e "$tmp/p/$f" ] && ok "installed $f" || bad "not installed: $f"
done

# the installed binary, run from elsewhere with no -m, uses the installed demo model
out=$(cd "$tmp" && env -u TLLM_MODEL "$tmp/p/bin/tllm" generate -p hi -n 4 --device cpu 2>"$tmp/err")
rc=$?
[ $rc -eq 0 ] && [ -n "$out" ] && ok "installed tllm generate -p hi -n 4" || { cat "$tmp/err"; bad "installed tllm generate: rc $rc, output '$out'"; }
grep -q "bundled demo model $tmp/p/share/tllm/models/tllm-man-demo" "$tmp/err" && ok "it says it uses the installed demo model" \
  || { cat "$tmp/err"; bad "the installed binary did not use the installed demo model"; }

# a program against the installed header and library, found by pkg-config alone
export PKG_CONFIG_PATH="$tmp/p/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
flags=$(pkg-config --cflags --libs tllm) || bad "pkg-config --cflags --libs tllm"
demo=$(pkg-config --variable=demo_model tllm)
[ "$(realpath "$demo")" = "$(realpath "$tmp/p/share/tllm/models/tllm-man-demo")" ] && ok "pkg-config's demo_model" || bad "demo_model is '$demo'"
if cc -std=c11 -Wall -Wextra -Werror $extra "$src/docs/examples/embed.c" -o "$tmp/embed" $flags 2>"$tmp/cc.log"; then
  ok "docs/examples/embed.c builds against the installed tllm.h with pkg-config's flags"
  if (cd "$tmp" && ./embed "$demo" "What does tar do?" >"$tmp/embed.out" 2>&1); then
    grep -q "round trip ok" "$tmp/embed.out" && grep -q "generated, finish" "$tmp/embed.out" \
      && ok "the embedded engine tokenizes and generates" || { cat "$tmp/embed.out"; bad "embed's output"; }
    grep -q 'tool calls \[{"id":"call_.*"name":"get_weather".*finish tool_calls' "$tmp/embed.out" \
      && ok "and answers an OpenAI request with a tool call" || { cat "$tmp/embed.out"; bad "embed's tool call"; }
  else
    cat "$tmp/embed.out"; bad "embed exited non-zero"
  fi
  # a model that is not there: a status and a message, not an exit from inside the library
  (cd "$tmp" && ./embed "$tmp/nowhere" >"$tmp/embed2.out" 2>&1)
  [ $? -eq 1 ] && grep -q "embed: open: .*nowhere" "$tmp/embed2.out" && ok "a bad model path is the caller's to report" \
    || { cat "$tmp/embed2.out"; bad "bad model path"; }
else
  cat "$tmp/cc.log"; bad "embed.c does not build against the installed tllm"
fi
[ $fails -eq 0 ] && echo "install: all ok" || echo "install: $fails failed"
exit $((fails > 0))
