#!/usr/bin/env bash
# Here, from the project root, after `bash ../shared/device/prepare_tf_gpu.sh` has
# downloaded the wheels into .tfg/dl: repacks them as one installed tree, xz-compressed,
# in 61 MiB parts under .tfg/repack/parts (17 parts against the 36 deflated ones, so
# fewer device calls). It leaves out what a convolutional network never loads:
# TensorFlow's C++ headers, cuDNN's RNN/attention sub-library (libcudnn_adv, loaded only
# for RNNs), and cuFFT, cuSOLVER, cuSPARSE and cuRAND, which TensorFlow dlopens at
# start-up (dlopen_checker.cc) but binds symbol by symbol only when an FFT, solver or
# sparse op runs: empty libraries of those names pass the start-up check. A model that
# needs them fails at that op, by name. On the device: benchmarks/device/setup.sh.
set -euo pipefail
R=.tfg/repack
rm -rf $R; mkdir -p $R/site $R/parts $R/stubs
for w in .tfg/dl/*.whl; do
  case $w in *cufft*|*cusolver*|*cusparse*|*curand*) continue;; esac
  unzip -q -o "$w" -d $R/site
done
rm -rf $R/site/tensorflow/include $R/site/nvidia/cudnn/lib/libcudnn_adv.so.9
rm -rf $R/site/nvidia/*/include
mkdir -p $R/site/nvidia/stubs/lib
echo 'int replicator_stub_marker;' > $R/stubs/empty.c
for so in libcufft.so.11 libcusolver.so.11 libcusparse.so.12 libcurand.so.10; do
  gcc -shared -fPIC -nostdlib -Wl,-soname,$so -o $R/site/nvidia/stubs/lib/$so $R/stubs/empty.c
done
du -sh $R/site
tar cf - -C $R site | xz -6 -T2 --block-size=48MiB > $R/site.tar.xz
split -b 61M -d -a 3 $R/site.tar.xz $R/parts/part.
ls $R/parts | wc -l | xargs echo "parts:"
