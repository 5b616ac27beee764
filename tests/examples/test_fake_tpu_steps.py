"""The examples' training steps traced on TensorFlow's TPUStrategy over a fake TPU.

`replicator.testing.tpu_engine_on_fake_tpu(8)` traces each call as a TPU host
would (the loop, `strategy.run` in the TPU's replicate context, every
collective as `cross_replica_sum`, the optimizer) and returns zeros of the
traced shapes. Each test builds an example's model, optimizer and step with
the example's own code, traces the step with `steps=1` and `steps=2`, and
compares with the same code on one device (`GpuReplicator(device="/cpu:0")`,
executed): the outputs (keys, dtypes, shapes but for the replica dimension),
and the variables (names, shapes, dtypes; the initial values where they are
seeded). The one-device build stands in for `tpu_engine_on_cpus(2)` as the
oracle of the outputs' structure: the stand-in, which also compiles each step
with XLA, took 49 s for the small SN-GAN's two steps here.
"""

import numpy as np
import pytest
import tensorflow as tf

import replicator
from benchmarks.checks import tpu_check
from examples.gan import configs
from examples.gan import data as gan_data
from examples.gan import gan_trainer
from examples.resnet import experiment as experiment_lib
from examples.resnet import models
from examples.resnet import schedule as schedule_lib

CORES = 8  # one TPU v2/v3 host


def _fake_tpu():
  return tpu_check.TracedRuns(replicator.testing.tpu_engine_on_fake_tpu(CORES))


def _one_device():
  return tpu_check.TracedRuns(replicator.GpuReplicator(device="/cpu:0"))


def _trace_steps(fake, step_fn, input_fn):
  """Traces `step_fn` with steps=1 then steps=2; checks what came back."""
  for steps in (1, 2):
    outputs = fake.run(step_fn, input_fn, steps=steps)
    for leaf in tf.nest.flatten(outputs):
      assert leaf.shape[0] == CORES  # one result per replica
  assert [run["steps"] for run in fake.runs] == [1, 2]
  assert fake.runs[0]["outputs"] == fake.runs[1]["outputs"]
  ops = fake.loop_ops()
  # One TPU computation in one loop, its reductions as cross-replica sums.
  assert ops["While"] == ops["TPUReplicateMetadata"] == 1
  assert ops["CrossReplicaSum"] >= 1


def _same_outputs(fake, one):
  """The fake TPU's outputs are the one-device build's, 8 replicas instead of 1."""
  assert tpu_check.same_outputs(fake.runs, one.runs, CORES) == []
  assert one.runs[0]["outputs"] and all(o["shape"][0] == 1 for o in one.runs[0]["outputs"])


def _values(variables):
  return [v.numpy() for v in variables]  # (Sonnet's names repeat across blocks)


# SN-GAN (examples/gan): the `small` config, and `imagenet128`'s architecture
# (6 blocks a network, 128x128) at a width of 1 and 7 classes, as
# test_gan_train.py shrinks it. A global batch of 8: one example per core.
GAN_CONFIGS = {
    "small": configs.SMALL.replace(dataset="synthetic", global_batch_size=CORES),
    "imagenet128": configs.IMAGENET128.replace(
        g_ch=1, d_ch=1, num_classes=7, z_dim=8, global_batch_size=CORES, n_dis=2,
        dataset="synthetic"),
}


def _gan(config, repl):
  """The example's trainer (models, wrapped Adams, steps; seeded) and its input."""
  trainer = gan_trainer.GanTrainer(config, repl, seed=0)
  input_fn = gan_data.make_input_fn(
      "synthetic", config.global_batch_size, resolution=config.resolution,
      channels=config.image_channels, num_classes=config.num_classes)
  return trainer, input_fn


def _gan_model_variables(trainer):
  return (trainer.generator.variables + trainer.discriminator.variables
          + (trainer.step,))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(GAN_CONFIGS))
def test_gan_steps_trace_on_the_fake_tpu(name):
  """The discriminator's step and the generator's, each traced and compared."""
  config = GAN_CONFIGS[name]
  fake_repl, one_repl = _fake_tpu(), _one_device()
  trainer, input_fn = _gan(config, fake_repl)
  oracle, oracle_input_fn = _gan(config, one_repl)
  # GanTrainer makes the models' variables in repl.context(), from a seeded
  # draw: the same values on both.
  model_variables = _gan_model_variables(trainer)
  assert tpu_check.same_variables("models", model_variables,
                                  _gan_model_variables(oracle)) == []
  initial = _values(model_variables)
  for step in ("discriminator_step", "generator_step"):
    # A record of this step's calls alone, on the same replicators.
    fake, one = tpu_check.TracedRuns(fake_repl.repl), tpu_check.TracedRuns(one_repl.repl)
    takes_input = step == "discriminator_step"
    _trace_steps(fake, getattr(trainer, step), input_fn if takes_input else None)
    one.run(getattr(oracle, step), oracle_input_fn if takes_input else None)
    _same_outputs(fake, one)
    # Adam's slots, made by the first trace, as the executed step made them.
    optimizer = "d_optimizer" if takes_input else "g_optimizer"
    slots = getattr(trainer, optimizer).variables
    assert len(slots) > 1, step
    assert tpu_check.same_variables("Adam", slots, getattr(oracle, optimizer).variables,
                                    values=False) == [], step
  # Nothing ran on the fake TPU: the models still hold their initial values.
  for variable, value in zip(model_variables, initial):
    np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)
  fake_repl.shutdown()
  one_repl.shutdown()


# ResNets (examples/resnet): ResNet-20 on Fashion-MNIST's shapes (28x28x1, 10
# classes) in float32, and ResNet-50 in bfloat16 on 32x32 colour images, as
# `train.py --model=...` builds them (Experiment: Nesterov momentum, weight
# decay, the learning-rate schedule); synthetic batches of 2 per core.
RESNETS = {
    "resnet20_fashion_mnist": dict(model_fn=models.ResNet20, image=[28, 28, 1],
                                   num_classes=10, bfloat16=False),
    "resnet50_bfloat16": dict(model_fn=models.ResNet50, image=[32, 32, 3],
                              num_classes=10, bfloat16=True),
}
RESNET_BATCH = 2 * CORES


def _resnet(repl, spec):
  schedule = schedule_lib.LearningRateSchedule(
      base_learning_rate=0.1, global_batch_size=RESNET_BATCH, steps_per_epoch=10,
      total_epochs=2, warmup_epochs=1)
  return experiment_lib.Experiment(repl, spec["model_fn"],
                                   num_classes=spec["num_classes"],
                                   lr_schedule=schedule, bfloat16=spec["bfloat16"])


def _resnet_input_fns(spec):
  rng = np.random.default_rng(0)
  images = rng.normal(size=[RESNET_BATCH] + spec["image"]).astype(np.float32)
  labels = rng.integers(0, spec["num_classes"], [RESNET_BATCH]).astype(np.int32)

  def train_input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        ctx.per_replica_batch_size(RESNET_BATCH), drop_remainder=True).repeat()

  def eval_input_fn(ctx):
    weights = np.ones([RESNET_BATCH], np.float32)
    return tf.data.Dataset.from_tensor_slices((images, labels, weights)).batch(
        ctx.per_replica_batch_size(RESNET_BATCH), drop_remainder=True)

  return train_input_fn, eval_input_fn


def _conv_dtypes(graphs):
  """The dtypes of the 2-D convolutions in `graphs` and their functions."""
  dtypes = set()
  for graph in graphs:
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
      nodes += list(function.node_def)
    dtypes |= {tf.as_dtype(n.attr["T"].type) for n in nodes if n.op == "Conv2D"}
  return dtypes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESNETS))
def test_resnet_train_step_traces_on_the_fake_tpu(name):
  spec = RESNETS[name]
  train_input_fn, eval_input_fn = _resnet_input_fns(spec)
  fake, one = _fake_tpu(), _one_device()
  experiment, oracle = _resnet(fake, spec), _resnet(one, spec)
  # The model's weights are made lazily, by the first trace of the train step.
  with pytest.raises(ValueError, match="does not currently contain any variables"):
    experiment.model.variables  # pylint: disable=pointless-statement
  _trace_steps(fake, experiment.train_step, train_input_fn)
  assert len(experiment.model.trainable_variables) > 0
  # One device: the model made by an evaluation step (which changes nothing),
  # then the train step (outputs, the optimizer's slots).
  one.run(oracle.eval_step, eval_input_fn)
  initial = _values(oracle.model.variables)
  one.runs.clear()
  one.run(oracle.train_step, train_input_fn)
  _same_outputs(fake, one)
  assert tpu_check.same_variables("model", experiment.model.variables,
                                  oracle.model.variables, values=False) == []
  assert tpu_check.same_variables("optimizer", experiment.base_optimizer.variables,
                                  oracle.base_optimizer.variables, values=False) == []
  # Initial values: the examples' random initializers are not seeded (each
  # trace draws its own), so the constant ones (batch norm's scales, offsets
  # and statistics, the biases) are compared exactly and the random ones by
  # their spread.
  constant = 0
  for variable, theirs in zip(experiment.model.variables, initial):
    mine = variable.numpy()
    if np.all(theirs == theirs.flat[0]):
      constant += 1
      np.testing.assert_array_equal(mine, theirs, err_msg=variable.name)
    elif theirs.size >= 64:
      assert 0.7 < mine.std() / theirs.std() < 1.4, variable.name
  assert 0 < constant < len(experiment.model.variables)
  # Weights in float32; the convolutions in the compute dtype.
  assert {v.dtype for v in experiment.model.trainable_variables} == {tf.float32}
  compute = tf.bfloat16 if spec["bfloat16"] else tf.float32
  assert _conv_dtypes(fake.loop_graphs()) == {compute}
  fake.shutdown()
  one.shutdown()
