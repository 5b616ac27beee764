"""A worker of the launcher's restart test: trains with checkpoints; can die mid-way.

  python -m replicator.launch --workers 2 --devices-per-worker 2 [--max-restarts 1] -- \
      python tests/multiworker/resume.py --out DIR --ckpt DIR [--die_at 3]

Worker 1 kills itself at step `--die_at` on the job's first attempt only (the
launcher's REPLICATOR_RESTART_COUNT), so a restarted job runs to the end. Every
worker saves its final variables and Adam slots to OUT/worker<i>.npz.
"""

import argparse
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

import catalogue
import replicator


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", required=True)
  parser.add_argument("--ckpt", required=True)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--die_at", type=int, default=-1)
  args = parser.parse_args()
  attempt = int(os.environ.get("REPLICATOR_RESTART_COUNT", "0"))  # set by the launcher

  repl = replicator.MultiGpuReplicator()
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(keras.optimizers.Adam(1e-2))
  checkpointer = replicator.Checkpointer(args.ckpt, model=model,
                                         optimizer=optimizer.optimizer)

  def input_fn(ctx):  # deterministic: a restored position finds the same batches
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.batch(ctx.per_replica_batch_size(32), drop_remainder=True)

  step_fn = catalogue.train_step(model, optimizer)

  start = checkpointer.restore_latest() or 0  # the number of steps completed
  print(f"attempt {attempt}: starting at step {start}", flush=True)
  for step in range(start, args.steps):
    if step == args.die_at and attempt == 0 and repl.mesh.worker_index == 1:
      print(f"attempt {attempt}: worker 1 kills itself at step {step}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    repl.run(step_fn, input_fn)
    if (step + 1) % 2 == 0:
      checkpointer.save(step + 1)
  state = list(model.variables) + list(optimizer.optimizer.variables)
  np.savez(os.path.join(args.out, f"worker{repl.mesh.worker_index}.npz"),
           **{f"s{i}": v.numpy() for i, v in enumerate(state)})
  print(f"attempt {attempt}: done", flush=True)


if __name__ == "__main__":
  main()
