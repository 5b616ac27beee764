#!/usr/bin/env bash
# On the device machine, from the project root, once every part that
# benchmarks/device/repack_tf_gpu.sh made is in /root/tfg (DEVICE.md): unpacks
# TensorFlow's GPU build into /root/site-gpu, writes /root/tfgpu.env, and checks that
# TensorFlow sees the GPU and runs a convolution's gradient and a matrix product on it.
set -euo pipefail
if [ ! -f /root/tfgpu.env ]; then
  start=$(date +%s)
  mkdir -p /root/site-gpu
  if command -v xz >/dev/null; then
    cat /root/tfg/part.* | xz -d -T0 | tar xf - -C /root --no-same-owner
  else
    cat /root/tfg/part.* | python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer, 1 << 24)" | tar xf - -C /root --no-same-owner
  fi
  rm -rf /root/site-gpu && mv /root/site /root/site-gpu && rm -rf /root/tfg
  libs=$(ls -d /root/site-gpu/nvidia/*/lib | paste -sd:)
  { echo "export PYTHONPATH=/root/site-gpu:\$PWD"
    echo "export LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export PATH=/root/site-gpu/nvidia/cuda_nvcc/bin:\$PATH"
    echo "export XLA_FLAGS=--xla_gpu_cuda_data_dir=/root/site-gpu/nvidia/cuda_nvcc"
    echo "export TF_CPP_MIN_LOG_LEVEL=1"; } > /root/tfgpu.env
  echo "unpacked in $(( $(date +%s) - start )) s"
fi
. /root/tfgpu.env
python3 - <<'PY'
import numpy as np
import tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
print("tf", tf.__version__, "gpus", gpus, flush=True)
if not gpus:
  raise SystemExit("setup.sh: TensorFlow sees no GPU (see the log above)")
x = tf.random.normal([8, 32, 32, 16], seed=1)
k = tf.random.normal([3, 3, 16, 32], seed=2)
def conv_grad(device):
  with tf.device(device):
    with tf.GradientTape() as tape:
      tape.watch(k)
      y = tf.reduce_sum(tf.nn.conv2d(x, k, 1, "SAME") ** 2)
    return tape.gradient(y, k).numpy(), (x[0, :, :, 0] @ x[1, :, :, 0]).numpy()
g_gpu, m_gpu = conv_grad("/GPU:0")
g_cpu, m_cpu = conv_grad("/CPU:0")
# The GPU rounds convolutions and products to TF32 (10-bit mantissa): compare norms.
for gpu, cpu in ((g_gpu, g_cpu), (m_gpu, m_cpu)):
  error = np.linalg.norm(gpu - cpu) / np.linalg.norm(cpu)
  if not error < 1e-2:
    raise SystemExit(f"setup.sh: GPU result off by {error:.1e} of its norm")
print("GPU conv gradient and matmul agree with the CPU", flush=True)
PY
