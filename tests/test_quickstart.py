"""The README's script gives the same loss curve on every replicator."""

import numpy as np

import catalogue
from examples import quickstart


def test_same_loss_curve_with_the_replicator_swapped():
  images, labels = quickstart.synthetic(num_examples=1024)
  curves = {}
  for name in ("gpu", "multi_gpu_4", "tpu_emulated_2"):
    curves[name] = quickstart.train(catalogue.make(name), images, labels,
                                    steps=15, global_batch=64)
  reference = np.array(curves["gpu"])
  assert reference[-1] < reference[0]  # it learns
  for name, curve in curves.items():
    np.testing.assert_allclose(curve, reference, rtol=1e-4, err_msg=name)
