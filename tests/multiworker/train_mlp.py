"""A worker of the multi-worker tests: trains the catalogue MLP, saves variables.

  python -m replicator.launch --workers 2 --devices-per-worker 2 -- \
      python tests/multiworker/train_mlp.py --out DIR --optimizer sonnet_sgd,keras_adam
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator

OPTIMIZERS = {"sonnet_sgd": lambda: snt.optimizers.SGD(0.1),
              "keras_adam": lambda: keras.optimizers.Adam(1e-2)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--optimizer", default="sonnet_sgd",
                      help="comma-separated: a model each, out/NAME/ each")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--global_batch", type=int, default=32)
  parser.add_argument("--uneven", action="store_true",
                      help="give worker 1 fewer batches than worker 0")
  parser.add_argument("--short_last_step", action="store_true",
                      help="give worker 1 half batches at step 4 (worker 0 "
                      "full ones; worker 1's batch size is not static)")
  args = parser.parse_args()

  repl = replicator.MultiGpuReplicator()
  names = args.optimizer.split(",")
  for name in names:  # one job trains a model per optimizer, one after another
    out = args.out if len(names) == 1 else os.path.join(args.out, name)
    os.makedirs(out, exist_ok=True)
    train(repl, args, OPTIMIZERS[name], out)


def train(repl, args, make_optimizer, out_dir):
  """Trains a new MLP with `make_optimizer()`; saves its variables in `out_dir`."""
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(make_optimizer())

  def input_fn(ctx):
    per_replica = ctx.per_replica_batch_size(args.global_batch)
    per_worker = per_replica * repl.num_local_replicas
    # Worker w takes rows [w*per_worker, (w+1)*per_worker) of each global batch,
    # so the job's global batch k is rows [k*B, (k+1)*B) in replica-id order.
    xs = x.reshape(-1, ctx.num_input_pipelines, per_worker, x.shape[-1])
    ys = y.reshape(-1, ctx.num_input_pipelines, per_worker)
    xs = xs[:, ctx.input_pipeline_id].reshape(-1, x.shape[-1])
    ys = ys[:, ctx.input_pipeline_id].reshape(-1)
    if args.uneven and ctx.input_pipeline_id == 1:
      xs, ys = xs[:3 * per_worker], ys[:3 * per_worker]
    if args.short_last_step and ctx.input_pipeline_id == 1:
      full = tf.data.Dataset.from_tensor_slices(
          (xs[:3 * per_worker], ys[:3 * per_worker]))
      short = tf.data.Dataset.from_tensor_slices(
          (xs[3 * per_worker:3 * per_worker + per_worker // 2],
           ys[3 * per_worker:3 * per_worker + per_worker // 2]))
      return full.batch(per_replica, drop_remainder=True).concatenate(
          short.batch(per_replica // 2))
    ds = tf.data.Dataset.from_tensor_slices((xs, ys))
    return ds.batch(per_replica, drop_remainder=True)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], model(batch[0])))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return {"loss": repl.all_mean(loss), "replica": repl.replica_id}

  def loss_fn(batch):  # builds the model, so its initial values can be saved
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        batch[1], model(batch[0])))

  repl.run(loss_fn, lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
  initial = {f"i{i}": v.numpy() for i, v in enumerate(model.variables)}
  steps_done = 0
  try:
    out = repl.run(step_fn, input_fn, steps=args.steps)
    steps_done = args.steps
  except replicator.InputExhausted as error:
    steps_done = error.steps_completed
    out = error.outputs
  repl.assert_replicas_in_sync(model.variables)
  np.savez(os.path.join(out_dir, f"worker{repl.mesh.worker_index}.npz"),
           steps=steps_done, replica=out["replica"].numpy(),
           loss=out["loss"].numpy(), **initial,
           **{f"v{i}": v.numpy() for i, v in enumerate(model.variables)})
  print(f"worker {repl.mesh.worker_index}: {steps_done} steps, loss "
        f"{out['loss'].numpy()[0]:.4f}")


if __name__ == "__main__":
  main()
