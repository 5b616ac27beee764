#!/usr/bin/env bash
# On the device machine, after setup.sh, from the project root:
#   bash benchmarks/device/run.sh SECONDS
# Item 6 (ResNet-50 on the GPU, ours vs Keras), then item 4 (scaling at 1 and 8 workers)
# and item 3 (all-reduce at 8 workers) on the CPUs with the GPU hidden, each under a
# share of SECONDS. Every benchmark writes its JSON into $OUT after each round, so a
# run cut short still brings its finished rounds back.
set -uo pipefail
budget=${1:-540}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
. /root/tfgpu.env
export PYTHONUNBUFFERED=1
timeout $(( budget * 55 / 100 )) python3 -m benchmarks.resnet50 --batch 128 --rounds 3 \
  --calls 2 --json "$OUT/resnet50.json"
echo "resnet50: exit $? at $(( $(date +%s) - start )) s"
if [ "$(left)" -gt 90 ]; then
  CUDA_VISIBLE_DEVICES= timeout $(( $(left) * 70 / 100 )) python3 -m benchmarks.scaling \
    --workers 1,8 --rounds 2 --iters 10 --json "$OUT/scaling_box.json"
  echo "scaling: exit $? at $(( $(date +%s) - start )) s"
fi
if [ "$(left)" -gt 60 ]; then
  CUDA_VISIBLE_DEVICES= timeout $(( $(left) - 10 )) python3 -m benchmarks.allreduce \
    --workers 8 --rounds 2 --json "$OUT/allreduce_box.json"
  echo "allreduce: exit $? at $(( $(date +%s) - start )) s"
fi
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
