"""Checkpointer: atomic saves, input position, any topology."""

import logging
import os
import shutil
import subprocess
import sys
import weakref

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


def test_the_readme_loop_resumes_at_the_first_step_not_completed(tmp_path):
  # save(n) after n steps; restore_latest() returns n; range(n, total) runs the rest.
  total, every = 7, 2

  def loop(stop_after=None):
    repl, model, optimizer, checkpointer, train = _trainer("multi_gpu_2", tmp_path)
    start = checkpointer.restore_latest() or 0
    ran = []
    for step in range(start, total):
      if step == stop_after:
        break  # the process dies here: steps after the last save are lost
      train(1)
      ran.append(step)
      if (step + 1) % every == 0 or step + 1 == total:
        checkpointer.save(step + 1)
    return start, ran, lambda: _state(model, optimizer)

  _, ran, want = loop()
  want = want()
  assert ran == list(range(total))
  shutil.rmtree(tmp_path)
  start, ran, _ = loop(stop_after=5)  # saves after 2 and 4 steps, dies after 5
  assert (start, ran) == (0, [0, 1, 2, 3, 4])
  start, ran, got = loop()
  assert (start, ran) == (4, [4, 5, 6])  # the fifth step (4) again: it was not saved
  for g, w in zip(got(), want):
    np.testing.assert_array_equal(g, w)
  start, ran, _ = loop()  # a finished run: nothing left
  assert (start, ran) == (total, [])


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
                        text=True, timeout=120, env=_env_importing_this_checkout())
  assert done.returncode == -9, done.stdout + done.stderr  # killed mid-save
  assert list(tmp_path.glob("ckpt-2-*.index"))  # the data of step 2 was written...
  counter = tf.Variable(0.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  assert checkpointer.restore_latest() == 1  # ...but step 1 is what is visible
  assert float(counter) == 1.0


def _env_importing_this_checkout():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.environ.get("PYTHONPATH")
  return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def test_saving_a_step_again_keeps_the_visible_checkpoint_until_the_pointer_moves(
    tmp_path, monkeypatch):
  counter = tf.Variable(1.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  checkpointer.save(step=3)
  counter.assign(2.0)
  with monkeypatch.context() as patch:  # dies before the pointer is replaced
    patch.setattr(tf.io.gfile, "rename", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
      checkpointer.save(step=3)
  restored = tf.Variable(0.0)
  assert replicator.Checkpointer(tmp_path, counter=restored).restore_latest() == 3
  assert float(restored) == 1.0  # the visible step 3, not the half-saved one
  counter.assign(5.0)
  checkpointer.save(step=3)
  checkpointer.save(step=4)
  kept = checkpointer._read_pointer()["all"]  # pylint: disable=protected-access
  assert len(kept) == 2
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest.json"] + [
      f"{name}.{ext}" for name in kept
      for ext in ("data-00000-of-00001", "index")])  # nothing superseded is left
  assert replicator.Checkpointer(tmp_path, counter=restored).restore_latest() == 4
  assert float(restored) == 5.0


def test_a_save_logs_no_sharding_duration_but_other_info_lines_pass(tmp_path, caplog):
  absl_logger = logging.getLogger("absl")
  with caplog.at_level(logging.INFO, logger="absl"):
    replicator.Checkpointer(tmp_path, counter=tf.Variable(1)).save(1)
    absl_logger.info("a line of the user's")
  messages = [r.getMessage() for r in caplog.records if r.name == "absl"]
  assert "a line of the user's" in messages
  assert not [m for m in messages if "Sharding callback" in m], messages


def test_a_directory_must_be_a_path_and_a_step_any_integer(tmp_path):
  with pytest.raises(ValueError, match="directory"):
    replicator.Checkpointer(None, counter=tf.Variable(1))
  checkpointer = replicator.Checkpointer(tmp_path, counter=tf.Variable(1))
  checkpointer.save(np.int64(3))
  assert checkpointer.latest_step == 3
  with pytest.raises(ValueError, match="step"):
    checkpointer.save(np.float32(4))


def test_only_the_chief_of_the_replicators_mesh_writes(tmp_path, monkeypatch):
  class Worker1:  # a replicator of a cluster given without TF_CONFIG
    num_workers, is_chief, _closed = 2, False, True

  worker = Worker1()
  monkeypatch.delenv("TF_CONFIG", raising=False)
  monkeypatch.setattr(replicator.Replicator, "live", weakref.WeakSet([worker]))
  checkpointer = replicator.Checkpointer(tmp_path, counter=tf.Variable(1))
  assert checkpointer.save(step=1) is None
  assert not list(tmp_path.iterdir())
  worker.is_chief = True
  assert checkpointer.save(step=1) is not None


def test_a_name_the_checkpoint_lacks_is_an_error(tmp_path, caplog):
  model = tf.Module()
  model.w = tf.Variable(3.0)
  replicator.Checkpointer(tmp_path, model=model, step=tf.Variable(7)).save(step=1)
  model.w.assign(0.0)
  with pytest.raises(ValueError, match=r"no \['net'\].*\['model', 'step'\].*model=\.\.\."):
    replicator.Checkpointer(tmp_path, net=model).restore_latest()
  assert float(model.w) == 0.0
  with caplog.at_level(logging.WARNING):
    assert replicator.Checkpointer(tmp_path, model=model).restore_latest() == 1
  assert float(model.w) == 3.0
  assert "also holds ['step'], which nothing restores" in caplog.text


def test_names_allowed_missing_keep_their_values_and_the_rest_restores(tmp_path, caplog):
  model = tf.Module()
  model.w = tf.Variable(3.0)
  replicator.Checkpointer(tmp_path, model=model).save(step=1)
  model.w.assign(0.0)
  added_later = tf.Variable(5.0)
  checkpointer = replicator.Checkpointer(tmp_path, model=model, rng=added_later)
  with pytest.raises(ValueError, match=r"allow_missing=\['rng'\]\) if they were added"):
    checkpointer.restore_latest()
  with caplog.at_level(logging.WARNING):
    assert checkpointer.restore_latest(allow_missing=["rng"]) == 1
  assert (float(model.w), float(added_later)) == (3.0, 5.0)
  assert "has no ['rng'] (allow_missing)" in caplog.text
  for wrong in ("net", ["model", "net"], 3, [added_later]):
    with pytest.raises(ValueError, match=r"allow_missing: expected names given to "
                       r"this Checkpointer \(\['model', 'rng'\]\)"):
      checkpointer.restore_latest(allow_missing=wrong)


@pytest.mark.parametrize("saved_wrapped", [True, False])
def test_an_optimizer_saved_wrapped_restores_into_the_one_it_wraps_and_back(
    saved_wrapped, tmp_path):
  def trainer():
    repl = catalogue.make("gpu")
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    x, y = catalogue.classification_data()
    step_fn = catalogue.train_step(model, optimizer)
    input_fn = catalogue.input_fn_for(x, y, 32)
    return model, optimizer, lambda steps: repl.run(step_fn, input_fn, steps=steps)

  model, optimizer, train = trainer()
  train(2)
  replicator.Checkpointer(tmp_path, model=model, optimizer=(
      optimizer if saved_wrapped else optimizer.optimizer)).save(step=2)
  train(1)
  want = _state(model, optimizer)
  model, optimizer, train = trainer()
  replicator.Checkpointer(tmp_path, model=model, optimizer=(
      optimizer.optimizer if saved_wrapped else optimizer)).restore_latest()
  train(1)  # Adam's step count and moments came back, as the weights did
  for got, expected in zip(_state(model, optimizer), want):
    np.testing.assert_array_equal(got, expected)


def test_inputs_made_by_one_factory_resume_in_any_order(tmp_path, caplog):
  def make_input(split, start):
    def input_fn(ctx):
      return tf.data.Dataset.range(start, start + 100).batch(1)
    return input_fn

  def run_script():
    repl = catalogue.make("multi_gpu_2")
    return repl, make_input("train", 0), make_input("eval", 1000), replicator.Checkpointer(
        tmp_path, counter=tf.Variable(0))

  repl, train, evaluate, checkpointer = run_script()
  repl.run(lambda b: b, train, steps=5)
  repl.run(lambda b: b, evaluate)
  checkpointer.save(step=5)
  repl.shutdown()
  repl, train, evaluate, checkpointer = run_script()
  checkpointer.restore_latest()
  np.testing.assert_array_equal(repl.run(lambda b: b, evaluate).numpy(), [[1002], [1003]])
  np.testing.assert_array_equal(repl.run(lambda b: b, train).numpy(), [[10], [11]])
  repl.shutdown()

  repl = catalogue.make("multi_gpu_2")
  with caplog.at_level(logging.WARNING):
    repl.run(lambda b: b, make_input("train", 0))
    repl.run(lambda b: b, make_input("train", 0))
  assert caplog.text.count("both named") == 1  # cannot be told apart: says how
  assert "close over a constant that differs" in caplog.text


def test_an_evaluation_replicator_made_later_keeps_the_training_input_position(tmp_path):
  def train_input(ctx):
    return tf.data.Dataset.range(100).batch(1)

  def eval_input(ctx):
    return tf.data.Dataset.range(1000, 1100).batch(1)

  def run_script():
    repl, evaluator = catalogue.make("multi_gpu_2"), catalogue.make("gpu")
    return repl, evaluator, replicator.Checkpointer(tmp_path, counter=tf.Variable(0))

  repl, evaluator, checkpointer = run_script()
  repl.run(lambda b: b, train_input, steps=5)
  evaluator.run(lambda b: b, eval_input, steps=3)
  checkpointer.save(step=5)
  repl.shutdown()
  evaluator.shutdown()
  repl, evaluator, checkpointer = run_script()
  checkpointer.restore_latest()
  np.testing.assert_array_equal(evaluator.run(lambda b: b, eval_input).numpy(), [[1003]])
  np.testing.assert_array_equal(repl.run(lambda b: b, train_input).numpy(), [[10], [11]])
  repl.shutdown()
  evaluator.shutdown()


def _draws(repl, generator, steps):
  return [repl.run(lambda: generator.uniform([3])).numpy() for _ in range(steps)]


@pytest.mark.parametrize("name", ["multi_gpu_2", "tpu_engine_2"])
def test_random_generator_streams_resume_exactly(name, tmp_path):
  repl = catalogue.make(name)
  want = _draws(repl, repl.random_generator(42), 4)
  repl.shutdown()

  repl = catalogue.make(name)
  generator = repl.random_generator(42)
  holder = tf.Module()
  holder.rng = generator  # kept with the model, as a script does
  _draws(repl, generator, 2)
  replicator.Checkpointer(tmp_path, holder=holder).save(step=2)
  repl.shutdown()

  repl = catalogue.make(name)
  generator = repl.random_generator(42)
  holder = tf.Module()
  holder.rng = generator
  replicator.Checkpointer(tmp_path, holder=holder).restore_latest()
  np.testing.assert_array_equal(np.stack(_draws(repl, generator, 2)), np.stack(want[2:]))
  repl.shutdown()


def test_random_generator_resumes_on_other_workers_and_other_replica_counts(
    tmp_path, caplog):
  def generators(replica_ids, num_replicas):
    devices = [f"/device:CPU:{i}" for i in range(len(replica_ids))]
    return replicator.engines.in_graph.generators.ReplicaGenerator(7, replica_ids, num_replicas, devices)

  everyone, chief = generators([0, 1, 2, 3], 4), generators([0, 1], 4)
  for generator in everyone._generators + chief._generators:  # pylint: disable=protected-access
    generator.uniform([5])  # every replica draws the same shapes
  tf.train.Checkpoint(rng=chief).write(str(tmp_path / "ckpt"))

  worker1 = generators([2, 3], 4)  # restores what worker 0 (the chief) saved
  tf.train.Checkpoint(rng=worker1).read(str(tmp_path / "ckpt"))
  got = [g.state.numpy() for g in worker1._generators]  # pylint: disable=protected-access
  want = [g.state.numpy() for g in everyone._generators[2:]]  # pylint: disable=protected-access
  assert len(got) == len(want) == 2
  np.testing.assert_array_equal(got, want)

  one = generators([0], 1)
  with caplog.at_level(logging.WARNING):
    tf.train.Checkpoint(rng=one).read(str(tmp_path / "ckpt"))
  assert "saved on 4 replica(s) and is restored on 1" in caplog.text
  np.testing.assert_array_equal(one._generators[0].state.numpy(),  # pylint: disable=protected-access
                                chief._generators[0].state.numpy())  # pylint: disable=protected-access


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


@pytest.mark.parametrize("name", ["multi_gpu_4", "tpu_engine_2"])
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


@pytest.mark.parametrize("name", ["multi_gpu_4", "tpu_engine_2"])
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


def _records_input(decoded, skip_itself=True, mark=True):
  """Records 0, 1, ... "decoded" (counted) after a skip that input_fn does itself."""
  def decode(record):
    decoded.append(int(record))
    return record

  def input_fn(ctx):
    records = tf.data.Dataset.range(10_000)
    if skip_itself:
      records = records.skip(ctx.batches_taken * 2)  # before decoding: cheap
    ds = records.map(lambda r: tf.ensure_shape(tf.py_function(decode, [r], tf.int64), []))
    ds = ds.batch(2, drop_remainder=True)
    return replicator.skipped_by_input_fn(ds) if mark else ds
  return input_fn


def test_an_input_fn_that_skips_the_taken_batches_itself_resumes_without_decoding_them(
    tmp_path):
  repl = catalogue.make("multi_gpu_2")
  repl.run(lambda b: b, _records_input([]), steps=20)
  want = repl.run(lambda b: b, _records_input([]), steps=21).numpy()  # uninterrupted
  repl.shutdown()

  def run_script():
    return catalogue.make("multi_gpu_2"), replicator.Checkpointer(
        tmp_path, counter=tf.Variable(0))

  decoded = []
  repl, checkpointer = run_script()
  repl.run(lambda b: b, _records_input(decoded), steps=20)
  checkpointer.save(step=20)
  repl.shutdown()
  repl, checkpointer = run_script()
  checkpointer.restore_latest()
  decoded.clear()
  got = repl.run(lambda b: b, _records_input(decoded)).numpy()
  np.testing.assert_array_equal(got, want)  # skipped once: by input_fn, not again
  assert min(decoded) == want.min()  # the 80 records before were never decoded
  repl.shutdown()


@pytest.mark.parametrize("skip_itself, mark, says", [
    (True, False, "skip those batches twice"),
    (False, True, "start its input from the beginning")])
def test_input_fn_must_read_the_taken_batches_and_mark_its_dataset_together(
    skip_itself, mark, says):
  repl = catalogue.make("gpu")
  with pytest.raises(ValueError, match=f"input_fn: input_fn .*{says}"):
    repl.run(lambda b: b, _records_input([], skip_itself, mark))  # a new job too
  repl.shutdown()


def test_input_fn_reading_the_position_after_it_returned_is_an_error():
  def input_fn(ctx):  # the generator reads ctx when the iterator starts: too late
    def records():
      yield from range(ctx.batches_taken, 100)
    return tf.data.Dataset.from_generator(
        records, output_signature=tf.TensorSpec([], tf.int64)).batch(2)

  repl = catalogue.make("gpu")
  with pytest.raises(Exception, match="read after input_fn returned"):
    repl.run(lambda b: b, input_fn)  # else a resumed job skips them twice
  repl.shutdown()


def test_an_input_fn_failing_after_a_restore_leaves_its_restart_for_the_retry(tmp_path):
  failing = []

  def input_fn(ctx):
    if failing:
      raise IOError(failing.pop())
    return tf.data.Dataset.range(10_000).batch(2, drop_remainder=True)

  repl = catalogue.make("multi_gpu_2")
  checkpointer = replicator.Checkpointer(tmp_path, counter=tf.Variable(0))
  repl.run(lambda b: b, input_fn, steps=3)
  checkpointer.save(step=3)
  repl.run(lambda b: b, input_fn, steps=2)
  checkpointer.restore_latest()  # back at step 3 of a started input
  failing.append("storage unavailable")
  with pytest.raises(IOError):
    repl.run(lambda b: b, input_fn)
  np.testing.assert_array_equal(repl.run(lambda b: b, input_fn).numpy(),
                                [[12, 13], [14, 15]])  # step 4, not step 6
  assert list(repl.input_positions().values()) == [4]
  failing.append("storage unavailable")
  with pytest.raises(IOError):
    repl.reset_input(input_fn)
  assert list(repl.input_positions().values()) == [4]  # the old stream goes on
  np.testing.assert_array_equal(repl.run(lambda b: b, input_fn).numpy(),
                                [[16, 17], [18, 19]])
  repl.shutdown()
