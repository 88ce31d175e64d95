#!/usr/bin/env bash
# tllm quantize / synth / logits --quantize from the command line.
set -u
TLLM=$1; DATA=$2; CONFIGS=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*" >&2; }
err() { local e; e=$("$TLLM" "$@" 2>&1 >/dev/null); echo "$e rc=$?"; }

"$TLLM" quantize "$DATA/models/bf16" "$tmp/q" --bits 4 --group-size 32 2>/dev/null && ok || bad "quantize"
[ -f "$tmp/q/model.safetensors" ] && [ -f "$tmp/q/generation_config.json" ] && ok || bad "quantize outputs"
grep -q '"quantization_config"' "$tmp/q/config.json" && ok || bad "quantization_config missing"
# logits of the quantized checkpoint == logits with --quantize on load == the MLX-quantized reference
"$TLLM" logits -m "$tmp/q" --ids 1,2,3 -o "$tmp/a.f32" && \
"$TLLM" logits -m "$DATA/models/bf16" --quantize 4 --group-size 32 --ids 1,2,3 -o "$tmp/b.f32" && \
"$TLLM" logits -m "$DATA/models/bf16-as-q4-g32" --ids 1,2,3 -o "$tmp/c.f32" && ok || bad "logits"
cmp -s "$tmp/a.f32" "$tmp/c.f32" && cmp -s "$tmp/b.f32" "$tmp/c.f32" && ok || bad "quantized logits differ"

# --mode takes mlx's bits and group for the mode, and gives the logits of mlx's own nvfp4 checkpoint
"$TLLM" quantize "$DATA/models/bf16" "$tmp/nv" --mode nvfp4 2>/dev/null && ok || bad "quantize --mode nvfp4"
python3 -c "import json,sys; q=json.load(open(sys.argv[1]))['quantization']; sys.exit(q != {'group_size': 16, 'bits': 4, 'mode': 'nvfp4'})" \
  "$tmp/nv/config.json" && ok || bad "nvfp4 config"
"$TLLM" logits -m "$tmp/nv" --ids 1,2,3 -o "$tmp/nv.f32" && "$TLLM" logits -m "$DATA/models/nvfp4" --ids 1,2,3 -o "$tmp/nvref.f32" && \
  cmp -s "$tmp/nv.f32" "$tmp/nvref.f32" && ok || bad "nvfp4 logits differ from mlx's checkpoint"
case "$(err quantize "$DATA/models/bf16" "$tmp/mx" --mode mxfp4 --mixed mixed_4_8)" in
  *"--mixed names each side's mode (e.g. mixed_mxfp4_mxfp8); it takes no --mode mxfp4 rc=1") ok ;; *) bad "--mixed with --mode" ;; esac
case "$(err quantize "$DATA/models/bf16" "$tmp/mx" --mixed mixed_mxfp8_mxfp4)" in
  *"mixed recipe 'mixed_mxfp8_mxfp4' is not of the form mixed_LOW_HIGH"*) ok ;; *) bad "--mixed HIGH below LOW" ;; esac
case "$(err quantize "$DATA/models/bf16" "$tmp/mx" --mode fp6)" in
  *"--mode: 'fp6' is not affine, mxfp4, nvfp4 or mxfp8 rc=1") ok ;; *) bad "unknown --mode" ;; esac

case "$(err quantize "$DATA/models/bf16" "$tmp/q")" in
  *"already exists and is not empty (use --force to overwrite) rc=1") ok ;; *) bad "existing OUT_DIR" ;; esac
case "$(err quantize "$tmp/missing" "$tmp/q2")" in
  *"$tmp/missing: cannot open model directory: No such file or directory rc=1") ok ;; *) bad "missing IN_DIR" ;; esac
[ ! -e "$tmp/q2" ] && ok || bad "failed quantize left an output directory"
case "$(err quantize "$DATA/models/bf16" "$tmp/q3" --bits 7)" in
  *"bits=7 group_size=64 is not supported"*) ok ;; *) bad "bits 7" ;; esac

"$TLLM" synth --config "$DATA/models/q4-g64/config.json" --out "$tmp/s" --seed 3 2>/dev/null && ok || bad "synth"
"$TLLM" logits -m "$tmp/s" --ids 1,2 --last -o "$tmp/s.f32" && ok || bad "synth output does not run"
"$TLLM" synth --config "$DATA/models/q4-g64/config.json" --out "$tmp/s2" --seed 3 2>/dev/null
cmp -s "$tmp/s/model.safetensors" "$tmp/s2/model.safetensors" && ok || bad "synth is not deterministic for a seed"
case "$(err synth --config "$CONFIGS/nope.json" --out "$tmp/s3")" in
  *"nope.json: cannot open"*) ok ;; *) bad "synth missing config" ;; esac
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
