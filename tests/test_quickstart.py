"""The README's script gives the same loss curve on every replicator."""

import json
import logging
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

import catalogue
from examples import quickstart

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_same_loss_curve_with_the_replicator_swapped(caplog):
  caplog.set_level(logging.INFO, logger="absl")  # absl logs the lines
  images, labels = quickstart.synthetic(num_examples=1024)
  curves = {}
  # tpu_engine_2: the TPU emulator (--replicator=tpu_emulated --cpu_replicas=2),
  # TpuReplicator(num_tpu_cores_per_worker=2, emulate_on_cpu=True).
  for name in ("gpu", "multi_gpu_4", "tpu_engine_2"):
    caplog.clear()
    curves[name] = quickstart.train(catalogue.make(name), images, labels,
                                    steps=15, global_batch_size=64, log_every=5)
  reference = np.array(curves["gpu"])
  assert reference[-1] < reference[0]  # it learns
  for name, curve in curves.items():
    np.testing.assert_allclose(curve, reference, rtol=1e-4, err_msg=name)
  # Every --log_every steps, a progress line (of the last run's).
  progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  assert [line.split()[1] for line in progress] == ["5/15", "10/15", "15/15"]
  assert progress[0].startswith(f"step 5/15  loss {curves['tpu_engine_2'][4]:.4g}  ")
  assert re.search(r"examples/s \(first interval, tracing included\)  ETA at most \d+", progress[0])
  assert "first interval" not in progress[1] and "ETA" in progress[1]


def test_the_script_logs_its_replicator_progress_and_loss_curve(tmp_path):
  # A process of its own: it splits the CPU into --cpu_replicas devices itself.
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env["CUDA_VISIBLE_DEVICES"] = ""
  result = subprocess.run(
      [sys.executable, "-m", "examples.quickstart", "--dataset=synthetic", "--steps=4",
       "--log_every=2", "--global_batch_size=64", f"--workdir={tmp_path}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  log = result.stderr
  assert result.returncode == 0, log[-3000:]
  assert ("MultiGpuReplicator: 2 replica(s) on 1 worker(s); this worker's devices: "
          "CPU:0, CPU:1" in log), log[-3000:]
  progress = re.findall(r"\] (step \d+/4 .*)", log)
  assert len(progress) == 2 and "(first interval, tracing included)  ETA at most" in progress[0]
  with open(tmp_path / "loss_curve.json") as f:
    saved = json.load(f)
  assert saved["num_replicas"] == 2 and len(saved["loss"]) == 4
  curve = re.search(r"\] loss curve, every 1 step\(s\) from step 1: (.*)", log).group(1).split()
  assert [float(loss) for loss in curve] == [float(f"{x:.4g}") for x in saved["loss"]]
  assert f"final loss {saved['loss'][-1]:.4f}" in log


def test_tpu_emulated_runs_the_tpu_engine_with_the_same_curve(tmp_path):
  # --replicator=tpu_emulated in a process of its own: TpuReplicator splits the
  # CPU into --cpu_replicas devices itself and runs the strategy engine there.
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env["CUDA_VISIBLE_DEVICES"] = ""
  result = subprocess.run(
      [sys.executable, "-m", "examples.quickstart", "--replicator=tpu_emulated",
       "--dataset=synthetic", "--steps=4", "--log_every=2", "--global_batch_size=64",
       f"--workdir={tmp_path}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  log = result.stderr
  assert result.returncode == 0, log[-3000:]
  assert ("TpuReplicator: 2 replica(s) on 1 worker(s); this worker's devices: "
          "CPU:0, CPU:1" in log), log[-3000:]
  with open(tmp_path / "loss_curve.json") as f:
    saved = json.load(f)
  assert saved["replicator"] == "tpu_emulated" and saved["num_replicas"] == 2
  images, labels = quickstart.synthetic()
  # As in the script's fresh process: no global seed. (A test before this one in
  # the same process may have set one, which changes every seeded initializer's
  # draws in a graph.)
  previous = context.global_seed()
  tf.random.set_seed(None)
  try:
    one_device = quickstart.train(catalogue.make("gpu"), images, labels, steps=4,
                                  global_batch_size=64, log_every=0)
  finally:
    tf.random.set_seed(previous)
  np.testing.assert_allclose(saved["loss"], one_device, rtol=1e-4)
