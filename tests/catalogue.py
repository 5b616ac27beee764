"""The replicators and small models that every property is tested over."""

import glob
import os

import numpy as np
import sonnet as snt
import tensorflow as tf

import replicator
from replicator import testing

# name -> (constructor, number of replicas)
REPLICATORS = {
    "gpu": (lambda: replicator.GpuReplicator(device="/cpu:0"), 1),
    "multi_gpu_2": (lambda: replicator.MultiGpuReplicator(
        devices=["/cpu:0", "/cpu:1"]), 2),
    "multi_gpu_4": (lambda: replicator.MultiGpuReplicator(
        devices=[f"/cpu:{i}" for i in range(4)]), 4),
    # The engine TpuReplicator() runs on a TPU, on a stand-in strategy: the TPU
    # emulator, TpuReplicator(num_tpu_cores_per_worker=2, emulate_on_cpu=True).
    "tpu_engine_2": (lambda: testing.tpu_engine_on_cpus(2), 2),
}
# The same at 8 replicas (a TPU host's cores): every catalogue test where
# REPLICATOR_EIGHT_REPLICAS=1 is set (about 10 minutes on 2 cores); otherwise
# tests/engines/strategy/test_eight_replicas.py runs the central ones.
EIGHT = "tpu_engine_8"
if os.environ.get("REPLICATOR_EIGHT_REPLICAS") == "1":
  REPLICATORS[EIGHT] = (lambda: testing.tpu_engine_on_cpus(8), 8)
EIGHT_REPLICATORS = {EIGHT: (lambda: testing.tpu_engine_on_cpus(8), 8)}
MULTI = [name for name, (_, n) in REPLICATORS.items() if n > 1]


def in_graph(name) -> bool:
  """Whether `name` runs on the in-graph engine (replicator.engines.in_graph), whose
  merges a test may watch; the others run on the strategy engine."""
  return not name.startswith("tpu_engine")


# The TPU's engine (and so its emulator) compiles each step with XLA before its
# first run, and XLA has no summary (or Assert) kernels.
NOT_XLA = sorted(name for name in REPLICATORS if not name.startswith("tpu"))


def make(name):
  return {**REPLICATORS, **EIGHT_REPLICATORS}[name][0]()


def summary_events(logdir, tag):
  """`(step, value)` of every summary event with `tag`, from the files in `logdir`."""
  recorded = []
  for path in sorted(glob.glob(f"{logdir}/events.out.tfevents.*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag == tag:
          recorded.append((event.step, tf.make_ndarray(value.tensor).item()))
  return recorded


def classification_data(num_examples=640, features=8, classes=4, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randn(num_examples, features).astype(np.float32)
  w = rng.randn(features, classes).astype(np.float32)
  y = np.argmax(x @ w + 0.5 * rng.randn(num_examples, classes), -1)
  return x, y.astype(np.int32)


def mlp():
  return snt.nets.MLP([16, 4], w_init=snt.initializers.VarianceScaling(seed=1),
                      b_init=snt.initializers.RandomUniform(-0.1, 0.1, seed=2))


def input_fn_for(x, y, global_batch, repeat=False):
  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if repeat:
      ds = ds.repeat()
    return ds.batch(ctx.per_replica_batch_size(global_batch), drop_remainder=True)
  return input_fn


def norm_relative(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)


def train_step(model, optimizer):
  """A step_fn: one optimizer step on the mean cross-entropy of a batch."""
  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], model(batch[0])))
    optimizer.apply(tape.gradient(loss, model.trainable_variables),
                    model.trainable_variables)
    return loss
  return step_fn
