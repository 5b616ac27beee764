"""Checkpointer: atomic saves, input position, any topology."""

import os
import subprocess
import sys

import numpy as np
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator


def _trainer(name, directory):
  repl = catalogue.make(name)
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.batch(ctx.per_replica_batch_size(32), drop_remainder=True)

  step_fn = catalogue.train_step(model, optimizer)

  checkpointer = replicator.Checkpointer(directory, model=model, optimizer=optimizer)
  return repl, model, optimizer, checkpointer, lambda steps: repl.run(
      step_fn, input_fn, steps=steps)


def _state(model, optimizer):
  return [v.numpy() for v in list(model.variables) + list(optimizer.variables)]


def test_resume_on_the_same_topology_continues_exactly(tmp_path):
  _, model, optimizer, checkpointer, train = _trainer("multi_gpu_2", tmp_path)
  train(3)
  checkpointer.save(step=3)
  train(2)
  want = _state(model, optimizer)

  repl, model, optimizer, checkpointer, train = _trainer("multi_gpu_2", tmp_path)
  assert checkpointer.restore_latest() == 3
  train(2)  # the input continues at step 4
  for got, expected in zip(_state(model, optimizer), want):
    np.testing.assert_array_equal(got, expected)
  repl.assert_replicas_in_sync(list(model.variables) + list(optimizer.variables))


def test_restore_on_another_number_of_replicas(tmp_path):
  _, model, optimizer, checkpointer, train = _trainer("multi_gpu_4", tmp_path)
  train(3)
  checkpointer.save(step=3)
  saved = [v.numpy() for v in model.variables]
  train(1)
  continued = _state(model, optimizer)  # one more step on the saving topology
  for name in ("gpu", "multi_gpu_2"):
    repl, model, optimizer, checkpointer, train = _trainer(name, tmp_path)
    checkpointer.restore_latest()
    repl.run(lambda x: model(x), args=(tf.zeros([2, 8]),))  # builds the model
    for got, want in zip([v.numpy() for v in model.variables], saved):
      np.testing.assert_array_equal(got, want)  # built lazily, restored on creation
    train(1)  # Adam's slots and step count were restored too
    for variable, want in zip(list(model.variables) + list(optimizer.variables),
                              continued):
      for copy in variable.replicas:
        assert catalogue.norm_relative(copy.numpy(), want) < 1e-5, variable.name
    repl.assert_replicas_in_sync(list(model.variables) + list(optimizer.variables))


def test_a_crash_during_save_leaves_the_previous_checkpoint(tmp_path):
  script = os.path.join(os.path.dirname(__file__), "multiworker", "crash_during_save.py")
  done = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True,
                        text=True, timeout=120)
  assert done.returncode == -9, done.stdout + done.stderr  # killed mid-save
  assert (tmp_path / "ckpt-2.index").exists()  # the data of step 2 was written...
  counter = tf.Variable(0.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  assert checkpointer.restore_latest() == 1  # ...but step 1 is what is visible
  assert float(counter) == 1.0


def test_inputs_with_the_same_name_keep_separate_positions(tmp_path):
  def make_input(size):
    def input_fn(ctx):
      return tf.data.Dataset.range(size).batch(1)
    return input_fn

  def run_script():
    repl = catalogue.make("multi_gpu_2")
    counter = tf.Variable(0)
    return repl, make_input(100), make_input(50), replicator.Checkpointer(
        tmp_path, counter=counter)

  repl, train, evaluate, checkpointer = run_script()
  repl.run(lambda b: b, train, steps=3)
  repl.run(lambda b: b, evaluate, steps=1)
  checkpointer.save(step=3)
  repl.shutdown()
  repl, train, evaluate, checkpointer = run_script()
  repl.run(lambda b: b, train)  # used first, as before: same key
  repl.run(lambda b: b, evaluate)
  checkpointer.restore_latest()
  np.testing.assert_array_equal(repl.run(lambda b: b, train).numpy(), [[6], [7]])
  np.testing.assert_array_equal(repl.run(lambda b: b, evaluate).numpy(), [[2], [3]])
