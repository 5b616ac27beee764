"""A worker of the multi-worker error tests: misuses every worker survives.

Prints one line per case: what `run` raised on this worker (the test checks
every worker's lines), then `DONE`.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import replicator


def main():
  argparse.ArgumentParser().parse_args()
  repl = replicator.MultiGpuReplicator()
  worker = repl.mesh.worker_index
  with repl.context():
    v = tf.Variable(tf.ones([3]))

  def step_fn():
    v.assign_add(tf.ones([3]))
    return repl.all_sum(v.read_value())

  repl.run(step_fn)
  try:  # different steps on different workers: an error on each, no hang
    repl.run(step_fn, steps=1 + worker)
    print("STEPS ran", flush=True)
  except ValueError as error:
    print(f"STEPS {error}", flush=True)
  print(f"AFTER {repl.run(step_fn, steps=2).numpy()[0].tolist()}", flush=True)

  def numerics_fn():  # v is 6 after 2 more steps: inf on every worker
    v.assign_add(tf.ones([3]))
    tf.debugging.check_numerics(v / (v - 6.0), "v hit 6")
    return repl.all_sum(v.read_value())

  try:
    repl.run(numerics_fn, steps=3)
  except Exception as error:  # pylint: disable=broad-except
    print(f"NUMERICS {type(error).__name__}", flush=True)
  print("DONE", flush=True)


if __name__ == "__main__":
  main()
