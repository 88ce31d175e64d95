#!/usr/bin/env bash
set -u
mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
B=build-static/tllm
IDS=$(python3 -c "print(','.join(str((i*7919)%150000) for i in range(1,65)))")
for size in 0.5 1.5; do
  cfg=configs/qwen2.5-${size}b-instruct.json
  python3 -c "import json;c=json.load(open('$cfg'));c['tie_word_embeddings']=False;json.dump(c,open('/tmp/c$size.json','w'))"
  python3 scripts/synth_gguf.py --config /tmp/c$size.json --out /tmp/g$size.gguf
  /usr/bin/time -f "generate cpu (16 threads) wall %e s" $B generate -m /tmp/g$size.gguf --prompt-ids 1,2,3 -n 1 -t 16 --device cpu 2>&1 | grep -E "wall|load"
  $B logits -m /tmp/g$size.gguf --ids $IDS --last -o /tmp/cpu$size.f32
  /usr/bin/time -f "logits opencl wall %e s" $B logits -m /tmp/g$size.gguf --ids $IDS --last -o /tmp/cl$size.f32 --device opencl 2>&1 | tail -1
  $B logits -m /tmp/g$size.gguf --ids $IDS --last -o /tmp/i8$size.f32 --int8
  python3 -c "
import numpy as np
a=np.fromfile('/tmp/cpu$size.f32',np.float32).astype(np.float64); b=np.fromfile('/tmp/cl$size.f32',np.float32).astype(np.float64); c=np.fromfile('/tmp/i8$size.f32',np.float32).astype(np.float64)
r=lambda x,y: np.sqrt(np.mean((x-y)**2))/np.sqrt(np.mean(y**2))
print('$size: opencl vs cpu exact rel RMS %.2e; cpu int8 vs exact %.2e; argmax %d %d %d' % (r(b,a), r(c,a), a.argmax(), b.argmax(), c.argmax()))"
done
TLLM_CL_PROFILE=phases $B bench -m /tmp/g1.5.gguf --device opencl -p 0 -n 64 -r 1 2>&1 | grep -A14 "opencl profile"
$B synth --config /tmp/c1.5.json --out /tmp/m1.5 --bits 4 --seed 1 >/dev/null 2>&1
TLLM_CL_PROFILE=phases $B bench -m /tmp/m1.5 --device opencl -p 0 -n 64 -r 1 2>&1 | grep -A14 "opencl profile"
