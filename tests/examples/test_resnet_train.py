"""Training steps of examples/resnet through MultiGpuReplicator on 2 logical CPUs."""

import functools
import glob
import json
import logging
import os
import types

import numpy as np
import pytest
import tensorflow as tf

import replicator
from examples.resnet import checks
from examples.resnet import data
from examples.resnet import experiment as experiment_lib
from examples.resnet import models
from examples.resnet import schedule as schedule_lib
from examples.resnet import train

TWO_CPUS = ["/cpu:0", "/cpu:1"]
IMAGE_SIZE = 8
GLOBAL_BATCH = 16


def _schedule(total_epochs=100, warmup_epochs=0.0, base_learning_rate=0.4):
  return schedule_lib.LearningRateSchedule(
      base_learning_rate=base_learning_rate, global_batch_size=GLOBAL_BATCH,
      steps_per_epoch=1, total_epochs=total_epochs, warmup_epochs=warmup_epochs)


# Two basic blocks (one with a projection): ResNet-20's code paths, a fraction of its
# tracing time.
TINY_RESNET = functools.partial(models.ResNet, [1, 1], [8, 16], models.BasicBlock,
                                imagenet_stem=False)


def _experiment(repl, schedule=None, model_fn=TINY_RESNET, **kwargs):
  return experiment_lib.Experiment(repl, model_fn, num_classes=4,
                                   lr_schedule=schedule or _schedule(), **kwargs)


def _fixed_batches(seed=0):
  """One global batch, fed again every step, as per-replica halves.

  The label is the brightest quadrant of the image, so a few steps can learn it.
  """
  rng = np.random.default_rng(seed)
  images = rng.normal(size=[GLOBAL_BATCH, IMAGE_SIZE, IMAGE_SIZE, 1]).astype(np.float32)
  labels = np.arange(GLOBAL_BATCH, dtype=np.int32) % 4
  half = IMAGE_SIZE // 2
  for i, label in enumerate(labels):
    images[i, (label // 2) * half:(label // 2 + 1) * half,
           (label % 2) * half:(label % 2 + 1) * half] += 2.0
  return images, labels


def _input_fn(images, labels):
  def input_fn(ctx):
    batch = ctx.per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch).repeat()
  return input_fn


def test_a_few_steps_lower_the_loss_on_two_replicas():
  repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
  experiment = _experiment(repl, _schedule(base_learning_rate=3.2))  # peak 0.2
  input_fn = _input_fn(*_fixed_batches())
  first = repl.run(experiment.train_step, input_fn)
  assert first["loss"].shape == (2,)
  np.testing.assert_allclose(first["loss"][0], first["loss"][1])  # all_mean
  last = repl.run(experiment.train_step, input_fn, steps=19)
  assert int(experiment.step.numpy()) == 20  # advanced once per step, not per replica
  assert float(last["loss"][0]) < 0.85 * float(first["loss"][0])
  repl.shutdown()


@pytest.mark.slow
def test_two_replicas_with_cross_replica_bn_match_one_device():
  """The oracle: one device on the whole batch, snt.BatchNorm, same initial weights.

  Compares what 3 steps changed, variable by variable (weights, batch-norm
  parameters and moving statistics), so that summation order is the only
  allowed difference.
  """
  images, labels = _fixed_batches(seed=1)
  one = replicator.GpuReplicator(device="/cpu:0")
  two = replicator.MultiGpuReplicator(devices=TWO_CPUS)
  oracle = _experiment(one, _schedule(warmup_epochs=2))
  replicated = _experiment(two, _schedule(warmup_epochs=2), cross_replica_bn=True)
  eval_input = lambda ctx: tf.data.Dataset.from_tensors(  # builds the variables
      (images[:8], labels[:8], np.ones(8, np.float32))).repeat()
  one.run(oracle.eval_step, eval_input)
  two.run(replicated.eval_step, eval_input)
  for source, target in zip(oracle.model.variables, replicated.model.variables):
    target.assign(source)
  for repl, experiment in ((one, oracle), (two, replicated)):
    repl.run(experiment.train_step, _input_fn(images, labels))  # creates the rest
  for variable in oracle.model.variables:  # Unit scales: gradients reach every conv.
    if "scale" in variable.name:
      variable.assign(tf.ones_like(variable))
  state = lambda e: e.model.variables + e.base_optimizer.variables
  for source, target in zip(state(oracle), state(replicated)):
    target.assign(source)  # Momentum too: the same starting point in every way.
  initial = [v.numpy() for v in oracle.model.variables]
  for repl, experiment in ((one, oracle), (two, replicated)):
    repl.run(experiment.train_step, _input_fn(images, labels), steps=3)
  assert len(oracle.model.variables) == len(replicated.model.variables)
  for before, expected, actual in zip(initial, oracle.model.variables,
                                      replicated.model.variables):
    assert expected.name == actual.name
    expected_change = expected.numpy() - before
    difference = np.linalg.norm(actual.numpy() - before - expected_change)
    # Float32 rounding of the values themselves (~1e-7 relative) is allowed too.
    tolerance = 1e-3 * np.linalg.norm(expected_change) + 1e-6 * np.linalg.norm(before)
    assert difference <= tolerance + 1e-6, (
        expected.name, difference, np.linalg.norm(expected_change))


@pytest.mark.slow
def test_train_loop_evaluates_checkpoints_and_resumes(tmp_path):
  def run(total_epochs, base_learning_rate):
    repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
    experiment = _experiment(repl, _schedule(total_epochs, 1, base_learning_rate))
    make = lambda is_training: data.make_input_fn(
        "synthetic", is_training, GLOBAL_BATCH, image_size=IMAGE_SIZE, num_classes=4)
    result = train.train(experiment, make(True), make(False), GLOBAL_BATCH,
                         steps_per_epoch=1, workdir=str(tmp_path), log_every=2,
                         eval_every_epochs=3, checkpoint_every_epochs=3)
    repl.shutdown()
    return experiment, result

  experiment, result = run(total_epochs=3, base_learning_rate=0.4)
  assert int(experiment.step.numpy()) == 3
  assert result["count"] == 256 and 0 <= result["accuracy"] <= 1
  assert glob.glob(os.path.join(tmp_path, "train", "events.*"))
  assert glob.glob(os.path.join(tmp_path, "eval", "events.*"))

  # Resumed at step 3, with a zero learning rate: two more steps leave the
  # restored weights as they were (freshly initialised ones would differ).
  resumed, _ = run(total_epochs=5, base_learning_rate=0.0)
  assert int(resumed.step.numpy()) == 5
  for trained, restored in zip(experiment.model.trainable_variables,
                               resumed.model.trainable_variables):
    np.testing.assert_allclose(restored.numpy(), trained.numpy(), rtol=1e-6,
                               err_msg=trained.name)


def test_eval_flip_averages_each_image_with_its_mirror():
  """`accuracy_flip` against the model called eagerly on the images and their mirrors."""
  images, labels = _fixed_batches(seed=2)
  repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
  experiment = _experiment(repl, _schedule(base_learning_rate=3.2), eval_flip=True)
  weights = np.ones(GLOBAL_BATCH, np.float32)
  weights[-3:] = 0.0  # padding: counted by neither accuracy

  def eval_input_fn(ctx):
    batch = ctx.per_replica_batch_size(GLOBAL_BATCH)
    return tf.data.Dataset.from_tensor_slices((images, labels, weights)).batch(batch)

  # Trained to find the bright quadrant, the model tells an image from its mirror.
  repl.run(experiment.train_step, _input_fn(images, labels), steps=20)
  result = experiment.evaluate(eval_input_fn)
  repl.shutdown()

  def probabilities(x):
    return tf.nn.softmax(experiment.model(x, is_training=False)).numpy()
  plain = probabilities(images)
  both = plain + probabilities(images[:, :, ::-1])
  kept = weights > 0
  assert result["count"] == kept.sum()
  assert result["accuracy"] == pytest.approx(
      np.mean(plain.argmax(-1)[kept] == labels[kept]))
  assert result["accuracy_flip"] == pytest.approx(
      np.mean(both.argmax(-1)[kept] == labels[kept]))
  assert result["accuracy_flip"] != result["accuracy"]  # the mirrors did count


def test_jit_compile_trains_as_without_it_and_needs_the_gpu_replicator():
  images, labels = _fixed_batches()
  results = []
  for jit_compile in (False, True):
    tf.random.set_seed(0)
    repl = train.make_replicator("gpu", cpu_replicas=1, jit_compile=jit_compile)
    experiment = _experiment(repl)
    out = repl.run(experiment.train_step, _input_fn(images, labels), steps=3)
    results.append(([v.numpy() for v in experiment.model.variables], out["loss"].numpy()))
    assert int(experiment.step.numpy()) == 3
  np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-4)
  for a, b in zip(results[1][0], results[0][0]):
    np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
  with pytest.raises(ValueError, match="--jit_compile.*--replicator=multi_gpu"):
    train.make_replicator("multi_gpu", cpu_replicas=1, jit_compile=True)


class _CountingExperiment:
  """What train() needs of an Experiment, with a one-variable step: fast to trace."""

  def __init__(self, repl, total_steps):
    self.repl = repl
    self.schedule = types.SimpleNamespace(total_steps=total_steps)
    with repl.context():
      self.model = tf.Module()
      self.model.w = tf.Variable(0.0)
      self.base_optimizer = tf.Module()
      self.step = tf.Variable(0, dtype=tf.int64)

  def train_step(self, batch):
    del batch
    self.model.w.assign_add(1.0)
    self.step.assign_add(1)
    return {"loss": self.repl.all_mean(self.model.w), "accuracy": tf.constant(0.0),
            "learning_rate": tf.constant(0.0)}

  def evaluate(self, eval_input_fn):
    del eval_input_fn
    return {"accuracy": 0.0, "loss": 0.0, "count": 4.0}


def test_a_broken_eval_input_stops_the_run_before_training(tmp_path):
  """Not at the first evaluation, an epoch or more of training later."""
  repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
  eval_input_fn = data.make_input_fn("imagenet_tfrecord", False, GLOBAL_BATCH,
                                     str(tmp_path), image_size=IMAGE_SIZE)
  experiment = _experiment(repl)
  with pytest.raises(ValueError, match="--data_dir: no file matches"):
    train.train(experiment, _input_fn(*_fixed_batches()), eval_input_fn, GLOBAL_BATCH,
                steps_per_epoch=1, log_every=1, eval_every_epochs=2)
  assert int(experiment.step.numpy()) == 0  # no step was run
  repl.shutdown()


def test_the_checkpoint_is_saved_before_the_evaluation_that_fails(tmp_path):
  """At a step that both evaluates and saves, a failing evaluation loses no training."""
  repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
  experiment = _CountingExperiment(repl, total_steps=2)

  def failing_evaluate(eval_input_fn):
    raise RuntimeError("evaluation failed")
  experiment.evaluate = failing_evaluate
  eval_input_fn = lambda ctx: tf.data.Dataset.range(4)  # passes the start-up check
  with pytest.raises(RuntimeError, match="evaluation failed"):
    train.train(experiment, _input_fn(*_fixed_batches()), eval_input_fn, GLOBAL_BATCH,
                steps_per_epoch=1, workdir=str(tmp_path), log_every=2,
                eval_every_epochs=2, checkpoint_every_epochs=2)
  repl.shutdown()
  assert int(experiment.step.numpy()) == 2
  saved = glob.glob(os.path.join(tmp_path, "checkpoints", "ckpt-2*.index"))
  assert len(saved) == 1, os.listdir(os.path.join(tmp_path, "checkpoints"))


def test_a_resumed_run_continues_at_the_next_step_and_a_finished_one_says_so(
    tmp_path, caplog):
  """A checkpoint holds the steps completed: a resumed run repeats and skips no step."""
  caplog.set_level(logging.INFO, logger="absl")  # absl logs the lines

  def run(total_steps):
    caplog.clear()
    repl = replicator.MultiGpuReplicator(devices=TWO_CPUS)
    experiment = _CountingExperiment(repl, total_steps)
    train.train(experiment, _input_fn(*_fixed_batches()),
                lambda ctx: tf.data.Dataset.range(4), GLOBAL_BATCH, steps_per_epoch=1,
                workdir=str(tmp_path), log_every=1, eval_every_epochs=100,
                checkpoint_every_epochs=2)
    repl.shutdown()
    messages = [record.getMessage() for record in caplog.records]
    logged = [int(m.split()[1].split("/")[0]) for m in messages if m.startswith("step ")]
    with open(os.path.join(tmp_path, "checkpoints", "latest.json")) as f:
      saved = json.load(f)["step"]
    return float(experiment.model.w.numpy()), logged, saved, messages

  runs, logged, saved, messages = run(total_steps=3)
  assert (runs, logged, saved) == (3, [1, 2, 3], 3)
  assert not [m for m in messages if "restored" in m]
  # w counts the steps run, in this process and before the checkpoint.
  runs, logged, saved, messages = run(total_steps=5)
  assert (runs, logged, saved) == (5, [4, 5], 5)
  assert [m for m in messages if m.startswith("restored step 3/5 ")]
  progress = [m for m in messages if m.startswith("step ")]
  assert "(first interval, tracing included)" in progress[0]  # traced again
  assert "first interval" not in progress[1]
  runs, logged, saved, messages = run(total_steps=5)
  assert (runs, logged, saved) == (5, [], 5)
  finished = [m for m in messages if "is finished" in m]
  assert len(finished) == 1 and "holds step 5 of 5" in finished[0]
  assert "nothing is left to do" in finished[0]


@pytest.mark.parametrize("flag, values, message", [
    ("global_batch_size", (0, -8), "--global_batch_size: must be positive, got {}"),
    ("eval_batch_size", (0,), "--eval_batch_size: must be positive, got 0"),
    ("epochs", (0, -1), "--epochs: must be positive, got {}"),
    ("warmup_epochs", (-0.5, 90), "--warmup_epochs: must be at least 0 and shorter than "
     "--epochs=90, got {}"),
    ("eval_every_epochs", (0, -1), "--eval_every_epochs: must be positive, got {}"),
    ("checkpoint_every_epochs", (0,), "--checkpoint_every_epochs: must be positive"),
    ("log_every", (0,), "--log_every: must be positive, got 0"),
])
def test_flag_errors_name_the_flag_and_value(flag, values, message):
  good = dict(global_batch_size=1024, eval_batch_size=None, epochs=90, warmup_epochs=5,
              eval_every_epochs=1, checkpoint_every_epochs=1, log_every=100)
  checks.check_flags(**good)
  for value in values:
    with pytest.raises(ValueError, match=message.format(value)):
      checks.check_flags(**{**good, flag: value})


def test_batches_must_fit_the_replicas_and_the_data():
  assert checks.check_batches(16, 8, 2.0, 2, num_train_examples=40,
                              dataset="image_folder") == 2  # 40 // 16
  with pytest.raises(ValueError, match="--eval_batch_size: 3 images do not split evenly "
                     "over 2 replicas; pass a multiple of 2"):
    checks.check_batches(16, 3, 2.0, 2, 40, "image_folder")
  with pytest.raises(ValueError, match="--global_batch_size: 16 is more than the 12 "
                     "training images of --dataset=image_folder"):
    checks.check_batches(16, 16, 2.0, 2, 12, "image_folder")
  with pytest.raises(ValueError, match="--epochs: 0.1 epochs of 2 steps round to no step"):
    checks.check_batches(16, 16, 0.1, 2, 40, "image_folder")
