"""A contrastive training step over local worker processes: ours vs MultiWorkerMirroredStrategy.

Each worker embeds its batch (a linear layer, L2-normalized), gathers every
worker's embeddings (`all_gather`, differentiated: SimCLR-style losses need the
whole global batch as negatives), scores its rows against all of them and
takes an SGD step; the gradients are averaged across workers. Ours uses
`repl.all_gather` and a wrapped Keras SGD; MWMS uses
`ReplicaContext.all_gather` and Keras SGD under the strategy. Each round is
one job of worker processes on 127.0.0.1 (`replicator.launch`) in which MWMS
starts each worker's server, the replicator joins it, and the two train their
own copies with their calls alternating (5 steps a call on both sides), so
both share the job's luck.

  python -m benchmarks.runs.gather_step [--workers 2,4] [--rounds 3] [--json out.json]

Prints ms per step (worker 0's median call of `--iters`, best of the rounds)
and MWMS / ours, best of rounds and round by round.
"""

import argparse
import json

from benchmarks.runs import common

VARIANTS = ("ours", "MWMS")
STEPS_PER_CALL = 5


def worker(batch: int, features: int, dim: int, iters: int, threads: int):
  """One worker of the job (TF_CONFIG set by the launcher): ours and MWMS.

  MWMS starts the worker's server and the replicator joins it; each trains
  its own copy of the layer, their calls alternating.
  """
  num_workers = common.start_worker(threads)
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  rng = np.random.RandomState(0)
  x = rng.randn(batch * 4, features).astype(np.float32)
  initial = (rng.randn(features, dim) / np.sqrt(features)).astype(np.float32)

  def loss_fn(w, xb, replica_id, gather):
    z = tf.math.l2_normalize(xb @ w, axis=1)
    every = gather(z)  # [num_workers * batch, dim]
    logits = z @ tf.transpose(every) / 0.1
    labels = tf.range(batch) + replica_id * batch  # its own rows are the positives
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

  make_ds = lambda: tf.data.Dataset.from_tensor_slices(x).repeat().batch(
      batch, drop_remainder=True)
  # Before TensorFlow runs anything: MWMS starts the server, ours joins it.
  strategy, repl = common.mwms_and_replicator()

  ds = make_ds()
  with repl.context():
    w = tf.Variable(initial)
    optimizer = repl.wrap_optimizer(keras.optimizers.SGD(0.1))

  def step_fn(xb):
    with tf.GradientTape() as tape:
      loss = loss_fn(w, xb, repl.replica_id, repl.all_gather)
    optimizer.apply([tape.gradient(loss, w)], [w])
    return loss
  input_fn = lambda ctx: ds  # one object: a new input_fn would be a new input

  mwms_ds = make_ds()
  with strategy.scope():
    mwms_w = tf.Variable(initial)
    mwms_optimizer = keras.optimizers.SGD(0.1)
    mwms_optimizer.build([mwms_w])
  iterator = iter(strategy.distribute_datasets_from_function(lambda ctx: mwms_ds))

  def replica_fn(xb):
    context = tf.distribute.get_replica_context()
    with tf.GradientTape() as tape:
      loss = loss_fn(mwms_w, xb, context.replica_id_in_sync_group,
                     lambda z: context.all_gather(z, axis=0))
      scaled = loss / num_workers  # Keras sums gradients over replicas
    mwms_optimizer.apply([tape.gradient(scaled, mwms_w)], [mwms_w])
    return loss

  @tf.function
  def steps(it):
    loss = tf.constant(0.0)
    for _ in tf.range(STEPS_PER_CALL):
      loss = strategy.experimental_local_results(strategy.run(replica_fn, (next(it),)))[0]
    return loss

  calls = {"ours": lambda: repl.run(step_fn, input_fn, steps=STEPS_PER_CALL)[0],
           "MWMS": lambda: steps(iterator)}
  seconds = common.median_seconds_alternating(calls, iters, warmup=3)
  # After as many steps on both sides, worker 0's loss: the same work done.
  print("RESULT " + json.dumps(
      {name: {"ms_per_step": 1e3 * seconds[name] / STEPS_PER_CALL,
              "loss": float(call())} for name, call in calls.items()}), flush=True)
  repl.shutdown()


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workers", default="2,4")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iters", type=int, default=40, help="timed calls per job")
  parser.add_argument("--batch", type=int, default=256, help="examples per worker")
  parser.add_argument("--features", type=int, default=512)
  parser.add_argument("--dim", type=int, default=128, help="embedding width")
  parser.add_argument("--json", default=None)
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.batch, args.features, args.dim, args.iters, args.threads)
    return
  counts = [int(w) for w in args.workers.split(",")]
  best, rounds, losses = {}, [], {}
  for _ in range(args.rounds):
    rounds.append({})
    for workers in counts:
      results = common.run_job(
          "benchmarks.runs.gather_step",
          ["--worker", "both", "--batch", str(args.batch), "--features",
           str(args.features), "--dim", str(args.dim), "--iters", str(args.iters)],
          workers)
      for variant in VARIANTS:
        result = results[variant]
        key = f"{variant}, {workers} workers"
        best[key] = min(best.get(key, float("inf")), result["ms_per_step"])
        rounds[-1][key] = result["ms_per_step"]
        losses[key] = result["loss"]
        print(f"{key}: {result['ms_per_step']:.2f} ms/step, loss {result['loss']:.6f}",
              flush=True)
  result = {"machine": common.machine(), "batch_per_worker": args.batch,
            "features": args.features, "dim": args.dim,
            "ms_per_step (best of rounds)": best,
            "loss of worker 0 after the same steps (last round)": losses,
            "ms_per_step (each round)": rounds,
            **common.mwms_over_ours(best, rounds, counts)}
  common.write_result(result, args.json)


if __name__ == "__main__":
  main()
