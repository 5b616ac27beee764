"""The ResNet notebook, run in smoke mode (its own file: the suite runs files
in parallel, and each notebook takes most of a minute)."""

import re

import pytest

from test_notebooks import _EMULATED, _in_order, _run_smoke, FASHION_MNIST, ROOT


@pytest.mark.slow
def test_resnet_notebook_runs_in_smoke_mode(tmp_path):
  out, work, seconds = _run_smoke("resnet", tmp_path)
  print(f"resnet notebook, smoke mode: {seconds:.0f} s")
  _in_order(out, [
      f"smoke mode: --replicator=tpu_emulated --cpu_replicas=2; repository {ROOT}; "
      f"results in {work / 'resnet20_fmnist'}",
      _EMULATED, "num_replicas: 2",
      f"Fashion-MNIST: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
      f"t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz in {FASHION_MNIST}",
      "-m examples.resnet.train --dataset=fashion_mnist",
      "2 replicas, resnet20 on fashion_mnist: 9 steps of 128 images",
      "step 9/9", "evaluation at step 9/9 (epoch 0.02): accuracy ",
      "test accuracy after 0.02 epochs (step 9/9): "])
  accuracy = re.search(r"test accuracy after 0\.02 epochs \(step 9/9\): ([\d.]+)%, "
                       r"([\d.]+)% with mirror images", out)
  assert accuracy and 0 < float(accuracy.group(1)) <= 100, out[-2000:]
  assert list((work / "resnet20_fmnist" / "checkpoints").iterdir())
