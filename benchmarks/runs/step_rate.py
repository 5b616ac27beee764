"""Step rate of a tiny MLP: replicator vs MirroredStrategy vs plain tf.function.

Runs every variant in one process, alternating rounds, and prints ms per step
and the ratios (absolute times on a shared machine are noise; ratios less so).

  python -m benchmarks.runs.step_rate [--replicas 2] [--rounds 5] [--threads 1,2]
      [--gpus] [--json out.json]

`--gpus` splits the first GPU into `--replicas` logical GPUs and runs every variant
there instead of on logical CPUs (the device machine; one physical GPU).
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import sonnet as snt
import tensorflow as tf

import replicator
from benchmarks.runs import common

GLOBAL_BATCH = 64


def _data():
  rng = np.random.RandomState(0)
  x = rng.randn(GLOBAL_BATCH * 64, 32).astype(np.float32)
  y = rng.randint(0, 10, len(x)).astype(np.int32)
  return x, y


def _loss(model, x, y):
  return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x)))


def replicator_variant(devices, steps_per_call):
  repl = (replicator.MultiGpuReplicator(devices=devices) if len(devices) > 1
          else replicator.GpuReplicator(device=devices[0]))
  x, y = _data()
  with repl.context():
    model = snt.nets.MLP([64, 10])
    optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.01))

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    return ds.batch(ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).prefetch(64)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = _loss(model, *batch)
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss

  return lambda: repl.run(step_fn, input_fn, steps=steps_per_call)


def mirrored_variant(devices, steps_per_call):
  strategy = tf.distribute.MirroredStrategy(devices=devices)
  x, y = _data()
  with strategy.scope():
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"), keras.layers.Dense(10)])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH, drop_remainder=True).prefetch(64)
  iterator = iter(strategy.experimental_distribute_dataset(ds))

  def replica_step(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], model(batch[0]))) / GLOBAL_BATCH
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss

  @tf.function
  def call(it):
    loss = tf.constant(0.0)
    for _ in tf.range(steps_per_call):
      loss = strategy.reduce("SUM", strategy.run(replica_step, (next(it),)), axis=None)
    return loss

  return lambda: call(iterator)


def plain_variant(steps_per_call):
  x, y = _data()
  model = snt.nets.MLP([64, 10])
  optimizer = keras.optimizers.SGD(0.01)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(GLOBAL_BATCH, drop_remainder=True).prefetch(64)
  iterator = iter(ds)

  @tf.function
  def call(it):
    loss = tf.constant(0.0)
    for _ in tf.range(steps_per_call):
      xb, yb = next(it)
      with tf.GradientTape() as tape:
        loss = _loss(model, xb, yb)
      optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss

  return lambda: call(iterator)


def hand_written_variant(devices, steps_per_call):
  """In-graph replication written by hand: the floor for N replicas.

  A model and a Keras SGD per device, each replica's gradients concatenated,
  one add_n, the mean split back and applied on every device; no exhaustion
  check (`next` raises at the end of the data); one step a call runs without
  a loop.
  """
  x, y = _data()
  n = len(devices)
  models, optimizers = [], []
  for device in devices:
    with tf.device(device):
      model = snt.nets.MLP([64, 10])
      model(tf.zeros([1, 32]))
      optimizer = keras.optimizers.SGD(0.01)
      optimizer.build(model.trainable_variables)
    models.append(model)
    optimizers.append(optimizer)
  ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      GLOBAL_BATCH // n, drop_remainder=True).prefetch(64)
  iterator = iter(ds)

  def step(it):
    flat, losses = [], []
    for device, model in zip(devices, models):
      with tf.device(device):
        xb, yb = next(it)
        with tf.GradientTape() as tape:
          loss = _loss(model, xb, yb)
        grads = tape.gradient(loss, model.trainable_variables)
        flat.append(tf.concat([tf.reshape(g, [-1]) for g in grads], 0))
        losses.append(loss)
    with tf.device(devices[0]):
      mean = tf.add_n(flat) / n
    for device, model, optimizer in zip(devices, models, optimizers):
      with tf.device(device):
        sizes = [v.shape.num_elements() for v in model.trainable_variables]
        grads = [tf.reshape(g, v.shape) for g, v in
                 zip(tf.split(tf.identity(mean), sizes), model.trainable_variables)]
        optimizer.apply(grads, model.trainable_variables)
    return tf.stack(losses)  # each replica's, as ours returns them

  @tf.function
  def call(it):
    if steps_per_call == 1:  # one step a call: no loop
      return step(it)
    losses = tf.zeros([n])
    for _ in tf.range(steps_per_call):
      losses = step(it)
    return losses

  return lambda: call(iterator)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--replicas", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--json", default=None)
  parser.add_argument("--threads", default=None, metavar="INTRA,INTER",
                      help="intra-op and inter-op thread counts (TF's defaults "
                      "when left out), e.g. 1,2 for a thread per logical device")
  parser.add_argument("--gpus", action="store_true",
                      help="replicas on logical GPUs of the first GPU, not logical CPUs")
  args = parser.parse_args()
  if args.threads:
    intra, inter = (int(t) for t in args.threads.split(","))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
  if args.gpus:
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_logical_device_configuration(
        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=4096)] * args.replicas)
    devices = [device.name for device in tf.config.list_logical_devices("GPU")]
  else:
    devices = replicator.testing.configure_logical_cpus(args.replicas)
  variants = {
      "replicator, 1 step/call": (replicator_variant(devices, 1), 1),
      "MirroredStrategy, 1 step/call": (mirrored_variant(devices, 1), 1),
      "plain tf.function, 1 device, 1 step/call": (plain_variant(1), 1),
      "hand-written in-graph replication, 1 step/call": (hand_written_variant(devices, 1), 1),
      "replicator, 50 steps/call": (replicator_variant(devices, 50), 50),
      "MirroredStrategy, 50 steps/call": (mirrored_variant(devices, 50), 50),
      "plain tf.function, 1 device, 50 steps/call": (plain_variant(50), 50),
      "hand-written in-graph replication, 50 steps/call":
          (hand_written_variant(devices, 50), 50),
      # The loop's own cost, without a second replica's ops:
      "replicator, 1 replica, 50 steps/call": (replicator_variant(devices[:1], 50), 50),
  }
  best = {name: float("inf") for name in variants}
  busy = {name: [] for name in variants}  # cores the process kept busy
  for _ in range(args.rounds):
    for name, (fn, per_call) in variants.items():
      cpu, wall = time.process_time(), time.perf_counter()
      seconds = common.seconds_per_call(fn, max(1, args.steps // per_call))
      busy[name].append((time.process_time() - cpu) / (time.perf_counter() - wall))
      best[name] = min(best[name], seconds / per_call)
  ms = {name: 1e3 * s for name, s in best.items()}
  ratios = {
      "MirroredStrategy / replicator, 1 step/call":
          ms["MirroredStrategy, 1 step/call"] / ms["replicator, 1 step/call"],
      "replicator 1 step/call / hand-written in-graph 1 step/call":
          ms["replicator, 1 step/call"]
          / ms["hand-written in-graph replication, 1 step/call"],
      "replicator 50 steps/call / plain 50-step loop":
          ms["replicator, 50 steps/call"] / ms["plain tf.function, 1 device, 50 steps/call"],
      "replicator 50 steps/call / hand-written in-graph 50-step loop":
          ms["replicator, 50 steps/call"]
          / ms["hand-written in-graph replication, 50 steps/call"],
      "replicator 1 replica 50 steps/call / plain 50-step loop":
          ms["replicator, 1 replica, 50 steps/call"]
          / ms["plain tf.function, 1 device, 50 steps/call"],
      "replicator 1 step/call / replicator 50 steps/call":
          ms["replicator, 1 step/call"] / ms["replicator, 50 steps/call"],
  }
  result = {"machine": common.machine(),
            "tensorflow": tf.__version__, "replicas": args.replicas,
            "threads (intra,inter)": args.threads or "TensorFlow's defaults",
            "devices": devices,
            "ms_per_step (best of rounds)": ms,
            "cores busy (process CPU time / wall time, mean of rounds)":
                {name: sum(b) / len(b) for name, b in busy.items()},
            "ratios": ratios}
  common.write_result(result, args.json)


if __name__ == "__main__":
  main()
