"""`python -m examples.resnet.train` end to end, each run a process of its own.

The suite's process has split the CPU into 8 logical devices already; the example
splits it into --cpu_replicas=2 itself, so it runs in a fresh process.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ResNet-20 on 8x8 random images: 4 steps of 16 images on 2 logical CPUs, one
# evaluation of the 256 synthetic evaluation images at the end.
TINY = ["--dataset=synthetic", "--model=resnet20", "--image_size=8", "--num_classes=4",
        "--num_train_examples=64", "--global_batch_size=16", "--eval_batch_size=64",
        "--epochs=1", "--warmup_epochs=0", "--log_every=2"]


def _run(*argv):
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env["CUDA_VISIBLE_DEVICES"] = ""  # the 2 logical CPUs, on a GPU machine too
  return subprocess.run([sys.executable, "-m", "examples.resnet.train", *argv],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_without_data_dir_the_run_stops_and_says_what_to_pass():
  result = _run()
  assert result.returncode != 0
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert ("--data_dir: --dataset=imagenet_tfrecord (the default) needs the ImageNet "
          "TFRecord shards (train-*, validation-*); pass --data_dir=/path/to/it."
          in result.stderr), result.stderr[-3000:]
  assert "--dataset=fashion_mnist" in result.stderr
  assert "--dataset=synthetic" in result.stderr


def test_a_resnet20_run_on_two_logical_cpus_logs_its_replicator_and_progress(tmp_path):
  result = _run(*TINY, f"--workdir={tmp_path}")
  log = result.stderr
  assert result.returncode == 0, log[-3000:]
  assert "Traceback" not in log
  assert ("MultiGpuReplicator: 2 replica(s) on 1 worker(s); this worker's devices: "
          "CPU:0, CPU:1" in log), log[-3000:]
  progress = re.findall(r"\] (step \d+/\d+ .*)", log)
  assert len(progress) == 2, progress
  assert progress[0].startswith("step 2/4  epoch 0.5  loss "), progress
  assert re.search(r"  train_accuracy [0-9.]+  lr [0-9.e-]+  [0-9.]+ images/s "
                   r"\(first interval, tracing included\)  ETA at most \d+", progress[0])
  assert progress[1].startswith("step 4/4  epoch 1  loss ")
  assert "first interval" not in progress[1] and "ETA" not in progress[1]
  assert re.search(r"\] evaluation at step 4/4 \(epoch 1\.00\): accuracy [0-9.]+, "
                   r"loss [0-9.]+ on the 256 evaluation images", log), log[-3000:]
  with open(tmp_path / "checkpoints" / "latest.json") as f:
    assert json.load(f)["step"] == 4  # the steps completed
