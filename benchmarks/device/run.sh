#!/usr/bin/env bash
# On the device machine, after setup.sh, from the project root:
#   bash benchmarks/device/run.sh SECONDS
# Item 6 (ResNet-50 on the GPU: ours fp32, Keras fp32 and ours bf16 + XLA in one
# process), items 1-2 (the step rate on 2 logical CPU devices, with cores to spare),
# item 3 (all-reduce at 8, 4 and 2 workers, with buckets side by side) and, if time
# is left, item 4 (scaling at 1 and 8 workers), the CPU ones with the GPU hidden, each
# under a share of SECONDS. Every benchmark writes its JSON into $OUT after each round
# (resnet50 after each variant), so a run cut short still brings its finished rounds
# back. Keras' own bf16 + XLA is left out: its compilation alone took over 2 minutes.
set -uo pipefail
budget=${1:-540}
start=$(date +%s)
left() { echo $(( budget - ($(date +%s) - start) )); }
. /root/tfgpu.env
export PYTHONUNBUFFERED=1
timeout $(( budget * 40 / 100 )) python3 -m benchmarks.resnet50 --batch 128 --rounds 3 \
  --calls 1 --steps 20 --variants 'GpuReplicator fp32;Keras fp32;GpuReplicator bf16 + XLA' \
  --json "$OUT/resnet50.json"
echo "resnet50: exit $? at $(( $(date +%s) - start )) s"
if [ "$(left)" -gt 120 ]; then
  CUDA_VISIBLE_DEVICES= timeout 60 python3 -m benchmarks.step_rate --replicas 2 \
    --rounds 10 --json "$OUT/step_rate_box.json"
  echo "step_rate: exit $? at $(( $(date +%s) - start )) s"
fi
if [ "$(left)" -gt 60 ]; then
  CUDA_VISIBLE_DEVICES= timeout $(( $(left) - 10 )) python3 -m benchmarks.allreduce \
    --workers 8,4,2 --rounds 2 --variants "ours fp32 packed;ours fp32, 8MB buckets, 4 in flight;\
ours bf16;ours bf16, 8MB buckets;ours bf16, 8MB buckets, 4 in flight;MWMS RING, bytes_per_pack=0;\
MWMS RING, bytes_per_pack=32MB;transfer alone: one bf16 tensor" --json "$OUT/allreduce_box.json"
  echo "allreduce: exit $? at $(( $(date +%s) - start )) s"
fi
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
