"""Checkpointer: atomic saves, input position, any topology."""

import os
import subprocess
import sys

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator


def _trainer(name, directory, accumulate_steps=1):
  repl = catalogue.make(name)
  x, y = catalogue.classification_data()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2),
                                    accumulate_steps=accumulate_steps)

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    return ds.batch(ctx.per_replica_batch_size(32), drop_remainder=True)

  step_fn = catalogue.train_step(model, optimizer)

  checkpointer = replicator.Checkpointer(directory, model=model, optimizer=optimizer)
  return repl, model, optimizer, checkpointer, lambda steps: repl.run(
      step_fn, input_fn, steps=steps)


def _state(model, optimizer):
  return [v.numpy() for v in list(model.variables) + list(optimizer.variables)]


@pytest.mark.parametrize("accumulate_steps", [1, 2])  # 2: saved mid-sum
def test_resume_on_the_same_topology_continues_exactly(tmp_path, accumulate_steps):
  _, model, optimizer, checkpointer, train = _trainer("multi_gpu_2", tmp_path,
                                                      accumulate_steps)
  train(3)
  checkpointer.save(step=3)
  train(2)
  want = _state(model, optimizer)

  repl, model, optimizer, checkpointer, train = _trainer("multi_gpu_2", tmp_path,
                                                         accumulate_steps)
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


@pytest.mark.parametrize("name", ["multi_gpu_4", "tpu_emulated_2"])
def test_a_trained_model_exports_as_a_saved_model_of_plain_variables(name, tmp_path):
  repl, model, optimizer, _, train = _trainer(name, tmp_path / "checkpoints")
  train(3)
  x = catalogue.classification_data()[0][:5]
  want = model(x).numpy()  # outside a step: the (identical) copies' values

  _export_mlp(str(tmp_path / "exported"), model, optimizer=optimizer)

  loaded = tf.saved_model.load(str(tmp_path / "exported"))
  np.testing.assert_allclose(loaded.predict(x).numpy(), want, rtol=1e-6)
  for layer, trained in zip(loaded.model._layers, model._layers):  # pylint: disable=protected-access
    np.testing.assert_array_equal(layer.w.numpy(), trained.w.numpy())
    np.testing.assert_array_equal(layer.b.numpy(), trained.b.numpy())
  saved = [name for name, _ in tf.train.list_variables(
      str(tmp_path / "exported" / "variables" / "variables"))
           if name.endswith("VARIABLE_VALUE")]
  assert len(saved) == len(model.variables) + len(optimizer.variables)  # one copy each


def _export_mlp(directory, model, **trackables):
  """Saves `model` (and `trackables`) with a `predict` signature for 8 features."""
  export = tf.Module()
  export.model = model
  for name, trackable in trackables.items():
    setattr(export, name, trackable)
  export.predict = tf.function(model, input_signature=[tf.TensorSpec([None, 8])])
  export.predict(tf.zeros([1, 8]))  # builds a model that is not built yet
  tf.saved_model.save(export, directory)


def _fine_tune_step(loaded, optimizer):
  parameters = [v for layer in loaded.model._layers for v in (layer.w, layer.b)]  # pylint: disable=protected-access

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], loaded.predict(batch[0])))
    optimizer.apply(tape.gradient(loss, parameters), parameters)
    return loss
  return step_fn, parameters


@pytest.mark.parametrize("name", ["multi_gpu_4", "tpu_emulated_2"])
def test_a_saved_model_loaded_in_the_context_fine_tunes_as_on_one_device(name, tmp_path):
  _export_mlp(str(tmp_path), catalogue.mlp())
  x, y = catalogue.classification_data()

  plain = tf.saved_model.load(str(tmp_path))
  step_fn, oracle = _fine_tune_step(plain, snt.optimizers.SGD(0.5))
  step_fn = tf.function(step_fn)
  for i in range(3):
    step_fn((x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]))

  repl = catalogue.make(name)
  with repl.context():
    loaded = tf.saved_model.load(str(tmp_path))
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.5))
  step_fn, parameters = _fine_tune_step(loaded, optimizer)
  loss = repl.run(step_fn, catalogue.input_fn_for(x, y, 32), steps=3)
  assert len(set(loss.numpy().tolist())) == repl.num_replicas  # each its own batch
  repl.assert_replicas_in_sync(parameters)
  for got, want in zip(parameters, oracle):
    assert catalogue.norm_relative(got.numpy(), want.numpy()) < 1e-5, got.name
  assert catalogue.norm_relative(parameters[0].numpy(),
                                 tf.saved_model.load(str(tmp_path)).model._layers[0].w.numpy()) > 1e-3  # pylint: disable=protected-access
