#!/usr/bin/env bash
exec > >(tee $OUT/log.txt) 2>&1
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
B=build-static
[ -f /tmp/m/model.safetensors ] || $B/tllm synth --config configs/qwen2.5-0.5b-instruct.json --out /tmp/m --tokenizer tests/data/tokenizer > /dev/null 2>&1
tg() { $B/tllm bench -m /tmp/m --device opencl -p 0 -n 128 -r 3 -o json 2>/dev/null | python3 -c 'import json,sys; print(round(json.load(sys.stdin)[0]["avg_ts"],1))'; }
for i in 1 2 3; do echo "load $(tg)  atomic $(TLLM_CL_OPTS=-DGRID_POLL_LOAD=0 tg)"; done
echo "profile load:"; TLLM_CL_PROFILE=phases $B/tllm bench -m /tmp/m --device opencl -p 0 -n 128 -r 1 2>&1 | grep -v "^|" | tail -9
$B/tests/test_opencl tests/data/models/* 2>&1 | grep -E "FAIL|passed" | tail -3
