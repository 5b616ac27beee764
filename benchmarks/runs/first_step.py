"""Time to the first training step: ours vs MirroredStrategy vs plain `tf.function`.

What a researcher waits for before the first loss appears: building the model
and optimizer, tracing the step (autograph included), Grappler and the first
step itself. Each measurement is a fresh Python process (TensorFlow imported,
logical devices set, data made before the clock starts), the variants
alternating within each round:

- "replicator": `MultiGpuReplicator` over the logical CPUs (`GpuReplicator` at
  one replica), the model built lazily inside the first step, as the API
  allows;
- "MirroredStrategy": the same step under `strategy.run`, the model called once
  on a sample batch and the optimizer built before the step, as MirroredStrategy
  requires (its replica context cannot create them in the compiled step);
- "plain tf.function" (one replica only): the step as single-device code, the
  model built lazily in its first call.

Model: Sonnet's ResNet-50 on 32x32 images, 4 images per replica, Keras SGD with
momentum on every side (Sonnet optimizers refuse MirroredStrategy). Prints
seconds to the end of the first step (best of rounds), the ratios, and the
second step's time as a check that the first one did the compiling.

  python -m benchmarks.runs.first_step [--replicas 1,2] [--rounds 3] [--json out.json]
"""

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.runs import common

VARIANTS = ("replicator", "MirroredStrategy", "plain tf.function")
# The project root, where `python -m benchmarks.runs.first_step` runs.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_IMAGE = 32
_PER_REPLICA_BATCH = 4
_CLASSES = 10


def _child(variant: str, replicas: int) -> dict:
  """In a fresh process: seconds to the end of the first step, and the second's."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np
  import sonnet as snt
  import tensorflow as tf

  import replicator

  if replicas > 1:
    devices = replicator.testing.configure_logical_cpus(replicas)
  batch = _PER_REPLICA_BATCH * replicas
  rng = np.random.RandomState(0)
  images = rng.rand(64, _IMAGE, _IMAGE, 3).astype(np.float32)
  labels = rng.randint(0, _CLASSES, 64).astype(np.int64)

  def dataset(size):
    return (tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
            .batch(size, drop_remainder=True))

  def loss_and_grads(model, batch_):
    x, y = batch_
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          y, model(x, is_training=True)))
    return loss, tape.gradient(loss, model.trainable_variables)

  tf.constant(0.0)  # the runtime is up before the clock starts
  start = time.perf_counter()
  if variant == "replicator":
    repl = (replicator.MultiGpuReplicator() if replicas > 1
            else replicator.GpuReplicator())
    with repl.context():
      model = snt.nets.ResNet50(_CLASSES)
      optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.1, momentum=0.9))

    def step_fn(batch_):
      loss, grads = loss_and_grads(model, batch_)
      optimizer.apply(grads, model.trainable_variables)
      return loss

    input_fn = lambda ctx: dataset(ctx.per_replica_batch_size(batch))
    call = lambda: repl.run(step_fn, input_fn)
  elif variant == "MirroredStrategy":
    strategy = (tf.distribute.MirroredStrategy(devices) if replicas > 1
                else tf.distribute.OneDeviceStrategy("/cpu:0"))
    with strategy.scope():
      model = snt.nets.ResNet50(_CLASSES)
      optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
      model(tf.zeros([1, _IMAGE, _IMAGE, 3]), is_training=True)
      optimizer.build(model.trainable_variables)
    iterator = iter(strategy.experimental_distribute_dataset(dataset(batch)))

    def replica_step(batch_):
      loss, grads = loss_and_grads(model, batch_)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    call = tf.function(lambda: strategy.run(replica_step, args=(next(iterator),)))
  else:
    model = snt.nets.ResNet50(_CLASSES)
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    iterator = iter(dataset(batch))

    @tf.function
    def call():
      loss, grads = loss_and_grads(model, next(iterator))
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

  out = call()
  tf.nest.map_structure(lambda t: getattr(t, "numpy", lambda: t)(), out)
  first = time.perf_counter() - start
  start = time.perf_counter()
  out = call()
  tf.nest.map_structure(lambda t: getattr(t, "numpy", lambda: t)(), out)
  return {"first_step_s": first, "second_step_s": time.perf_counter() - start}


def _measure(variant: str, replicas: int) -> dict:
  output = subprocess.run(
      [sys.executable, "-m", "benchmarks.runs.first_step", "--child", variant,
       "--replicas", str(replicas)],
      check=True, capture_output=True, text=True,
      cwd=ROOT).stdout
  return json.loads(output.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--replicas", default="1,2",
                      help="comma-separated replica counts (logical CPUs)")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--json", default=None)
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(_child(args.child, int(args.replicas))))
    return

  counts = [int(n) for n in args.replicas.split(",")]
  rounds = {n: [] for n in counts}
  for round_index in range(args.rounds):
    for n in counts:
      figures = {}
      for variant in VARIANTS:
        if variant == "plain tf.function" and n > 1:
          continue
        figures[variant] = _measure(variant, n)
        print(f"round {round_index + 1}, {n} replica(s), {variant}: "
              f"first step {figures[variant]['first_step_s']:.2f} s, "
              f"second {figures[variant]['second_step_s'] * 1e3:.0f} ms", flush=True)
      rounds[n].append(figures)

  results = {}
  for n in counts:
    best = {variant: min(r[variant]["first_step_s"] for r in rounds[n])
            for variant in rounds[n][0]}
    ratios = {f"{variant} / replicator": {
        "best_of_rounds": best[variant] / best["replicator"],
        "rounds": [r[variant]["first_step_s"] / r["replicator"]["first_step_s"]
                   for r in rounds[n]]}
              for variant in best if variant != "replicator"}
    results[str(n)] = {"first_step_s": best, "ratios": ratios, "rounds": rounds[n]}
  common.write_result({
      "benchmark": "first_step", "machine": common.machine(),
      "image_size": _IMAGE, "per_replica_batch": _PER_REPLICA_BATCH,
      "rounds": args.rounds, "replicas": results}, args.json)


if __name__ == "__main__":
  main()
