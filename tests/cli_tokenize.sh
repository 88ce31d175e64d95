#!/usr/bin/env bash
# tllm tokenize from the command line: every mode, and clean errors.
set -u
TLLM=$1; TOK=$2; MODELS=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
eq() { # got want what
  if [ "$1" = "$2" ]; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $3: got '$1', want '$2'" >&2; fi
}
eq "$("$TLLM" tokenize -m "$TOK" "Hello world<|im_end|>")" "[9707, 1879, 151645]" "text with special"
eq "$("$TLLM" tokenize -m "$TOK" --no-special "<|im_end|>")" "[27, 91, 318, 6213, 91, 29]" "--no-special"
printf 'Hello world' > "$tmp/f.txt"
eq "$("$TLLM" tokenize -m "$TOK" --file "$tmp/f.txt")" "[9707, 1879]" "--file"
printf '{"text": "Hello"}\n{"text": " Hello"}\n' > "$tmp/in.jsonl"
eq "$("$TLLM" tokenize -m "$TOK" --jsonl "$tmp/in.jsonl" | tr '\n' '|')" '{"ids": [9707]}|{"ids": [21927]}|' "--jsonl"
echo '[{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the gold?"}]' > "$tmp/chat.json"
eq "$("$TLLM" tokenize -m "$TOK" --chat "$tmp/chat.json")" \
   "[151644, 8948, 198, 2610, 525, 264, 53966, 13, 151645, 198, 151644, 872, 198, 9064, 374, 279, 6623, 30, 151645, 198, 151644, 77091, 198]" "--chat"
eq "$("$TLLM" tokenize -m "$TOK" --chat "$tmp/chat.json" --json | head -c 40)" '{"text": "<|im_start|>system\nYou are a ' "--chat --json"
eq "$("$TLLM" tokenize -m "$TOK" --decode 9707,1879,151645)" "Hello world<|im_end|>" "--decode"
eq "$("$TLLM" tokenize -m "$TOK" --decode 9707,1879,151645 --skip-special)" "Hello world" "--decode --skip-special"

err() { local e; e=$("$TLLM" "$@" 2>&1 >/dev/null); echo "$e rc=$?"; }
eq "$(err tokenize -m "$MODELS/q4-g64" hi)" "tllm: $MODELS/q4-g64/tokenizer.json: cannot open: No such file or directory rc=1" "model without tokenizer"
eq "$(err tokenize -m "$TOK" --bogus)" "tllm: tokenize: unknown option '--bogus' (see tllm tokenize --help) rc=1" "unknown option"
eq "$(err tokenize -m "$TOK" --decode 1,99999999)" "tllm: token id 99999999 is not in the tokenizer's vocabulary (151665 ids) rc=1" "bad id"
eq "$(err tokenize -m "$TOK")" "tllm: tokenize: give exactly one of TEXT, --file, --jsonl, --chat, --decode, --bench rc=1" "no input"
echo '[{"role": "user"}]' > "$tmp/bad.json"
eq "$(err tokenize -m "$TOK" --chat "$tmp/bad.json")" "tllm: $tmp/bad.json: $TOK/tokenizer_config.json:23:50: 'dict object' has no attribute 'content' rc=1" "a message without content"
printf '{%% if %%}' > "$tmp/bad.jinja"
eq "$(err tokenize -m "$TOK" --chat "$tmp/bad.json" --chat-template "$tmp/bad.jinja")" "tllm: $tmp/bad.jinja: the chat template cannot be run: $tmp/bad.jinja:1:7: expected an expression; use --no-template or --chat-template FILE rc=1" "a broken template"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
