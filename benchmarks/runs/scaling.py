"""Data-parallel scaling over local worker processes: ours vs MultiWorkerMirroredStrategy.

A model with ResNet-50-sized gradients (an MLP whose layers hold `--scale` x
25.6 M parameters; 0.25 by default) trains with SGD at a fixed batch per
worker on 1, 2, 4 ... workers, each worker with cores/W intra-op threads.
Each round is one job per W in which MWMS starts each worker's server, the
replicator joins it, and the two train models of their own with their calls
(five steps each) alternating: both share the job's luck. Prints examples/s
(worker 0's median call; examples of every worker) and the efficiency
`examples/s(W) / examples/s(1)` against our own 1-worker figure: each of W
workers has 1/W of the cores, so its fair share is 1/W of what one worker with
every core trains, and the scaling target (an efficiency at 8 workers, in
benchmarks/report/targets.json) reads "total examples/s divided by the 1-worker
(16-thread) figure".

  python -m benchmarks.runs.scaling [--workers 1,2] [--rounds 2] [--batch 64]
      [--json out.json]

The batch sets how much a step computes against the same gradient: an MLP
example costs 3 multiply-adds per parameter (forward and backward), a
ResNet-50 image about 481 (12.3 G for 25.6 M parameters), so `--batch B`
computes per byte of gradient what ResNet-50 does at B / 160 images per worker
(`resnet50_images`): 64 is 0.4 of an image, 5120 about 32 (the large-minibatch
recipe's batch per GPU, Goyal et al. 2017).
"""

import argparse
import json

from benchmarks.runs import common

VARIANTS = ("ours", "MWMS")


def _layers(scale):
  """Hidden widths of an MLP on 1024 inputs with ~scale x 25.6 M parameters."""
  width = int((scale * 25.6e6 / 4) ** 0.5)
  return [1024, width, width, width, width, 10]


def worker(scale: float, batch: int, iters: int, threads: int, pack_mb):
  """One worker of the job (TF_CONFIG set by the launcher): ours and MWMS.

  MWMS starts the worker's server and the replicator joins it; each trains a
  model of its own, five steps a call, the calls alternating, so both share
  the job's luck.
  """
  num_workers = common.start_worker(threads)
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  rng = np.random.RandomState(0)
  x = rng.randn(batch * 4, 1024).astype(np.float32)
  y = rng.randint(0, 10, batch * 4).astype(np.int32)
  widths = _layers(scale)

  def model_vars():
    return [tf.Variable((rng.randn(a, b) / np.sqrt(a)).astype(np.float32))
            for a, b in zip(widths[:-1], widths[1:])]

  def forward(weights, xb):
    h = xb
    for w in weights[:-1]:
      h = tf.nn.relu(h @ w)
    return h @ weights[-1]

  def loss_fn(weights, xb, yb):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, forward(weights, xb)))

  # Before TensorFlow runs anything: MWMS starts the server, ours joins it.
  strategy, repl = common.mwms_and_replicator(
      pack_bytes=None if pack_mb is None else int(pack_mb * 2**20))
  make_ds = lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      batch, drop_remainder=True)

  ds = make_ds()
  with repl.context():
    weights = model_vars()
    optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.01))

  def step_fn(b):
    with tf.GradientTape() as tape:
      loss = loss_fn(weights, *b)
    optimizer.apply(tape.gradient(loss, weights), weights)
    return loss
  input_fn = lambda ctx: ds  # one object: a new input_fn would be a new input and step

  calls = {"ours": lambda: repl.run(step_fn, input_fn, steps=5)[0]}
  mwms_ds = make_ds()
  with strategy.scope():
    mwms_weights = model_vars()
    mwms_optimizer = keras.optimizers.SGD(0.01)
    mwms_optimizer.build(mwms_weights)
  iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: mwms_ds))

  def replica_fn(b):
    with tf.GradientTape() as tape:
      loss = loss_fn(mwms_weights, *b) / num_workers  # Keras sums over replicas
    mwms_optimizer.apply(tape.gradient(loss, mwms_weights), mwms_weights)
    return loss

  @tf.function
  def five_steps(it):
    loss = tf.constant(0.0)
    for _ in tf.range(5):
      loss = strategy.reduce("SUM", strategy.run(replica_fn, (next(it),)), None)
    return loss

  calls["MWMS"] = lambda: five_steps(iterator)
  seconds = common.median_seconds_alternating(calls, iters, warmup=2)
  print("RESULT " + json.dumps({name: num_workers * batch * 5 / s  # 5 steps a call
                                for name, s in seconds.items()}), flush=True)
  repl.shutdown()


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workers", default="1,2")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--iters", type=int, default=10)
  parser.add_argument("--batch", type=int, default=64, help="examples per worker")
  parser.add_argument("--scale", type=float, default=0.25)
  parser.add_argument("--pack_mb", type=float, default=None,
                      help="bucket size of both, ours (pack_bytes) and MWMS "
                      "(bytes_per_pack); by default each runs its own default "
                      "(ours 16 MB buckets, 2 in flight; MWMS one pack)")
  parser.add_argument("--json", default=None)
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.scale, args.batch, args.iters, args.threads, args.pack_mb)
    return
  counts = [int(w) for w in args.workers.split(",")]
  best, rounds = {}, []
  for _ in range(args.rounds):
    rounds.append({})
    for workers in counts:
      result = common.run_job(
          "benchmarks.runs.scaling", ["--worker", "both", "--scale", str(args.scale),
                                 "--batch", str(args.batch), "--iters", str(args.iters),
                                 *(["--pack_mb", str(args.pack_mb)]
                                   if args.pack_mb is not None else [])],
          workers)
      for variant in VARIANTS:
        key = f"{variant}, {workers} workers"
        best[key] = max(best.get(key, 0.0), result[variant])
        rounds[-1][key] = result[variant]
        print(f"{key}: {result[variant]:.0f} examples/s", flush=True)
    # Written after every round, in case the device machine's time runs out.
    common.write_result(_summary(best, rounds, counts, args), args.json,
                        quiet=len(rounds) < args.rounds)


def _summary(best, rounds, counts, args) -> dict:
  """The JSON result: examples/s, ours / MWMS and the efficiency against 1 worker."""
  return {"machine": common.machine(),
          "layers": _layers(args.scale), "batch_per_worker": args.batch,
          "pack_mb": args.pack_mb,
          "examples_per_s (best of rounds)": best,
          "examples_per_s (each round)": rounds,
          # throughputs, so ours over MWMS (over 1: ours is faster)
          "ours / MWMS (each round)": common.ratio_by_workers(
              best, rounds, counts, "ours", "MWMS")[1],
          EFFICIENCY: efficiency(best)}


# Multiply-adds per parameter and example, forward and backward: an MLP's 3
# (one per weight forward, two backward); ResNet-50's 3 x 4.1 G per 224x224
# image over its 25.56 M parameters.
_MLP_MACS_PER_PARAMETER = 3
_RESNET50_MACS_PER_PARAMETER = 3 * 4.1e9 / 25.56e6


def resnet50_images(batch: int) -> float:
  """The images per worker at which ResNet-50 computes, per byte of gradient,
  what this MLP computes at `batch` examples."""
  return batch * _MLP_MACS_PER_PARAMETER / _RESNET50_MACS_PER_PARAMETER


EFFICIENCY = "efficiency: examples/s over ours on the fewest workers (the same cores)"


def efficiency(best: dict) -> dict:
  """Each variant's examples/s over ours on the fewest workers of the run.

  Every run splits the same cores among its W workers, so the ideal is 1 at
  every W (not W: the workers do not bring cores of their own).
  """
  fewest = min(int(key.split(", ")[1].split()[0]) for key in best)
  return {key: value / best[f"ours, {fewest} workers"] for key, value in best.items()}


if __name__ == "__main__":
  main()
