"""Checkpoint round trip: save and restore time of a ResNet-50-sized state.

  python -m benchmarks.runs.checkpoint_roundtrip [--params 25600000] [--replicas 2]

Saves a model (one big and many small variables, ~ResNet-50's 161 tensors and
25.6M parameters) with its Adam slots through `replicator.Checkpointer`, then
restores it on another replica count, and prints the seconds and MB/s, next
to a plain `tf.train.Checkpoint.write` / `read` of the same objects in the
same run (the floor: ours adds the pointer file and the input positions).
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top
import sonnet as snt
import tensorflow as tf

import replicator
from benchmarks.runs import common


def build(repl, sizes):
  with repl.context():
    params = [tf.Variable(tf.random.stateless_normal([n], seed=[i, 0]), name=f"p{i}")
              for i, n in enumerate(sizes)]
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))
  return params, optimizer


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--params", type=int, default=25_600_000)
  parser.add_argument("--tensors", type=int, default=161)
  parser.add_argument("--replicas", type=int, default=2)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  devices = replicator.testing.configure_logical_cpus(max(args.replicas, 1))
  rng = np.random.RandomState(0)
  weights = rng.pareto(1.0, args.tensors) + 0.01
  sizes = np.maximum(1, (weights / weights.sum() * args.params).astype(int)).tolist()

  repl = replicator.MultiGpuReplicator(devices=devices[:args.replicas])
  params, optimizer = build(repl, sizes)

  def step():
    optimizer.apply([tf.ones_like(p) for p in params], params)
    return tf.constant(0.0)

  repl.run(step)  # creates the Adam slots
  directory = tempfile.mkdtemp()
  checkpointer = replicator.Checkpointer(directory, params=params, optimizer=optimizer.optimizer)
  plain = tf.train.Checkpoint(params=params, optimizer=optimizer.optimizer)
  plain_dir = tempfile.mkdtemp()
  save_s = plain_save_s = float("inf")
  for step in (1, 2):  # alternating; the best of two each
    start = time.perf_counter()
    checkpointer.save(step=step)
    save_s = min(save_s, time.perf_counter() - start)
    start = time.perf_counter()
    plain_path = plain.write(os.path.join(plain_dir, f"ckpt{step}"))
    plain_save_s = min(plain_save_s, time.perf_counter() - start)
  nbytes = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory)
               if f.startswith("ckpt-2."))  # one checkpoint's files

  other = replicator.GpuReplicator(device="/cpu:0")
  restored, restored_optimizer = build(other, sizes)
  other.run(lambda: (restored_optimizer.apply([tf.zeros_like(p) for p in restored], restored),
                     tf.constant(0.0))[1])
  checkpointer = replicator.Checkpointer(directory, params=restored,
                                         optimizer=restored_optimizer.optimizer)
  plain = tf.train.Checkpoint(params=restored, optimizer=restored_optimizer.optimizer)
  restore_s = plain_restore_s = float("inf")
  for _ in range(2):
    start = time.perf_counter()
    checkpointer.restore_latest()
    restore_s = min(restore_s, time.perf_counter() - start)
    start = time.perf_counter()
    plain.read(plain_path).assert_consumed()
    plain_restore_s = min(plain_restore_s, time.perf_counter() - start)
  same = all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(params, restored))
  result = {
      "machine": common.machine(),
      "tensors": args.tensors, "parameters": int(sum(sizes)),
      "checkpoint_MB": round(nbytes / 2**20, 1),
      "save_s": round(save_s, 3), "restore_s (on 1 replica)": round(restore_s, 3),
      "save_MB_per_s": round(nbytes / 2**20 / save_s, 1),
      "restore_MB_per_s": round(nbytes / 2**20 / restore_s, 1),
      "restored_identical": same,
      "plain tf.train.Checkpoint write_s": round(plain_save_s, 3),
      "plain tf.train.Checkpoint read_s": round(plain_restore_s, 3),
      "ratios": {"save: ours / plain": save_s / plain_save_s,
                 "restore: ours / plain": restore_s / plain_restore_s}}
  common.write_result(result, args.json)


if __name__ == "__main__":
  main()
