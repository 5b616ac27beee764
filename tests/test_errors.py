"""Misuse gets an error that names the argument, what was given and the fix."""

import os
from unittest import mock

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator


def test_non_optimizer_to_wrap_optimizer():
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(TypeError, match=r"optimizer: .*got str"):
    repl.wrap_optimizer("adam")


@pytest.mark.parametrize("method", ["all_sum", "all_mean", "all_max", "all_min",
                                    "all_gather", "broadcast"])
def test_collective_outside_a_step(method):
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(RuntimeError, match=rf"{method}.*only valid while a step runs"):
    getattr(repl, method)(tf.constant(1.0))


def test_replica_id_outside_a_step():
  with pytest.raises(RuntimeError, match="replica_id is only valid"):
    catalogue.make("gpu").replica_id  # pylint: disable=expression-not-assigned


def test_global_batch_not_divisible():
  ctx = replicator.InputContext(1, 0, 4)
  with pytest.raises(ValueError, match=r"global_batch_size: 30 .* 4 replicas"):
    ctx.per_replica_batch_size(30)


def test_input_fn_returning_a_non_dataset():
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(TypeError, match=r"input_fn: .* returned ndarray, expected a tf.data.Dataset"):
    repl.run(lambda b: b, lambda ctx: np.zeros(3))


def test_step_fn_returning_a_non_tensor():
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(TypeError, match=r"step_fn: .* returned str"):
    repl.run(lambda: {"loss": tf.constant(1.0), "note": "hello"})


def test_run_after_shutdown():
  repl = catalogue.make("multi_gpu_2")
  repl.shutdown()
  repl.shutdown()  # idempotent
  with pytest.raises(RuntimeError, match="run: .* was shut down"):
    repl.run(lambda: tf.constant(1.0))


def test_run_inside_a_tf_function():
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(RuntimeError, match="run: called inside a tf.function.*steps=k"):
    tf.function(lambda: repl.run(lambda: tf.constant(1.0)))()


def test_variable_created_outside_every_context_used_in_a_multi_replica_step():
  repl = catalogue.make("multi_gpu_2")
  stray = tf.Variable(1.0, name="stray_weight")
  with pytest.raises(ValueError, match="stray_weight.*outside every replicator context"):
    repl.run(lambda: stray * 2.0)
  counter = tf.Variable(0, dtype=tf.int64)  # written, never read, in the step

  def count():
    counter.assign_add(1, read_value=False)
    return tf.constant(1.0)

  with pytest.raises(ValueError, match=r"step_fn writes a variable of dtype int64 "
                     r"\(AssignAddVariableOp .*outside every replicator context"):
    repl.run(count)
  generator = tf.random.Generator.from_seed(1)  # made outside, as the global one
  with pytest.raises(ValueError, match=r"StateVar.*outside every replicator context.*"
                     r"make the generator inside the context, or use repl.random_generator"):
    repl.run(lambda: generator.normal([2]))


@pytest.mark.parametrize("write", ["assign", "resource_apply", "scatter"])
def test_a_write_through_a_replicated_variables_handle_is_refused(write):
  # It would change the copy of the replica that runs it alone: before, the
  # copies drifted apart without a word (1.0 and 2.0 here).
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    weight = tf.Variable([1.0, 2.0], name="bypassed")
  writes = {
      "assign": lambda value: tf.raw_ops.AssignVariableOp(
          resource=weight.handle, value=value),
      "resource_apply": lambda value: tf.raw_ops.ResourceApplyGradientDescent(
          var=weight.handle, alpha=0.1, delta=value),  # a TF1 optimizer's update
      "scatter": lambda value: tf.raw_ops.ResourceScatterUpdate(
          resource=weight.handle, indices=[0], updates=value[:1]),
  }

  def step_fn():
    writes[write](tf.fill([2], tf.cast(repl.replica_id, tf.float32)))
    return weight.read_value()

  with pytest.raises(ValueError, match=r"step_fn writes the variable 'bypassed' through "
                     r"its handle \(\w+ .*drift apart.*own methods \(assign"):
    repl.run(step_fn)
  np.testing.assert_array_equal(weight.numpy(), [1.0, 2.0])  # nothing ran
  weight.assign([3.0, 4.0])  # its own methods still work, in and out of a step
  out = repl.run(lambda: weight.assign(tf.fill([2], tf.cast(repl.replica_id, tf.float32))))
  np.testing.assert_allclose(out.numpy(), [[0.5, 0.5]] * 2)
  repl.assert_replicas_in_sync([weight])


@pytest.mark.parametrize("trained_on,used_on", [
    ("multi_gpu_2", "gpu"), ("multi_gpu_2", "multi_gpu_4"), ("gpu", "multi_gpu_2")])
def test_a_model_made_by_another_replicator_is_read_there_but_never_updated(
    trained_on, used_on):
  """Updating a model from a replicator on other devices would change some copies."""
  x, y = catalogue.classification_data(num_examples=64)
  owner = catalogue.make(trained_on)
  with owner.context():
    model = catalogue.mlp()
    optimizer = owner.wrap_optimizer(snt.optimizers.SGD(0.1))
  owner.run(catalogue.train_step(model, optimizer), catalogue.input_fn_for(x, y, 16))

  other = catalogue.make(used_on)
  n = other.num_replicas
  logits = other.run(lambda: model(tf.constant(x[:4])))  # evaluation: every replica reads
  np.testing.assert_allclose(logits.numpy(), [model(x[:4]).numpy()] * n, rtol=1e-6)
  before = [v.numpy() for v in model.variables]
  with pytest.raises(ValueError, match=r"updates the variable 'mlp/linear_\d/[wb]:0', which was "
                     r"made for \d replica\(s\) .* by another replicator's context"):
    other.run(catalogue.train_step(model, optimizer), catalogue.input_fn_for(x, y, 16))
  for got, want in zip(model.variables, before):
    np.testing.assert_array_equal(got.numpy(), want)
  owner.assert_replicas_in_sync(model.variables)


@pytest.mark.parametrize("devices,match", [
    (["/cpu:0", "CPU:0"], "appears twice"),
    (["/cpu:0", "/cpu:99"], "CPU:99.* is not a device of this process"),
    (["/cpu:0", "banana"], "'banana' is not a device name"),
])
def test_bad_mesh_devices(devices, match):
  with pytest.raises(ValueError, match=match):
    replicator.MultiGpuReplicator(devices=devices)


def test_tpu_replicator_with_no_tpu_reachable():
  with mock.patch.dict(os.environ, {"TPU_NAME": "", "COLAB_TPU_ADDR": ""}):
    with pytest.raises(RuntimeError, match="no TPU reachable.*emulate_on_cpu=True"):
      replicator.TpuReplicator()


def test_unsupported_num_tpu_cores_per_worker():
  with pytest.raises(ValueError, match=r"num_tpu_cores_per_worker: 3 .*\(1, 2, 4, 8\)"):
    replicator.TpuReplicator(num_tpu_cores_per_worker=3, emulate_on_cpu=True)


def test_gradients_and_variables_of_different_lengths():
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    w = tf.Variable([1.0, 2.0])
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))
  with pytest.raises(ValueError, match="updates/parameters: got 2 gradients for 1 variables"):
    repl.run(lambda: optimizer.apply([tf.ones([2]), tf.ones([2])], [w]))


def test_dataset_whose_element_structure_changes():
  repl = catalogue.make("multi_gpu_2")
  calls = []

  def input_fn(ctx):
    calls.append(1)
    if len(calls) == 1:
      return tf.data.Dataset.range(8).batch(2)
    return tf.data.Dataset.range(8).map(lambda x: (x, x)).batch(2)

  repl.run(lambda b: b, input_fn)
  with pytest.raises(ValueError, match="input_fn: the dataset's element structure changed"):
    repl.reset_input(input_fn)


@pytest.mark.parametrize("dataset, match", [
    (lambda: tf.data.Dataset.range(8).batch(2),
     r"input_fn: .* shape \(None,\); a TPU needs every dimension fixed.*drop_remainder=True"),
    (lambda: tf.data.Dataset.from_tensor_slices(["a", "bb"] * 4).batch(2, drop_remainder=True),
     r"input_fn: .*dtype=tf.string.*dense numeric tensors only"),
    (lambda: tf.data.Dataset.from_tensor_slices(
        tf.ragged.constant([[1], [2, 3]] * 4)).batch(2, drop_remainder=True),
     r"input_fn: .*RaggedTensorSpec.*dense numeric tensors only"),
])
def test_tpu_emulation_refuses_what_a_tpu_cannot_take(dataset, match):
  repl = catalogue.make("tpu_engine_2")
  with pytest.raises(ValueError, match=match):
    repl.run(lambda b: b, lambda ctx: dataset())
  repl.run(lambda b: b * 2, lambda ctx: tf.data.Dataset.range(8).batch(2, drop_remainder=True))


@pytest.mark.parametrize("make, match", [
    (lambda: catalogue.make("tpu_engine_2"), r"a TPU step is one XLA computation"),
    (lambda: replicator.GpuReplicator(device="/cpu:0", jit_compile=True),
     r"jit_compile=False does not"),
])
def test_an_op_that_xla_cannot_compile_is_named_with_the_fix(make, match):
  repl = make()

  def printing_step():
    value = tf.cast(repl.replica_id, tf.float32) + 1.0
    tf.print("value:", value)
    return value

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"step_fn: printing_step uses (PrintV2|StringFormat), "
                           rf"which XLA cannot compile; .*{match}.*Fix: tf.print"):
    repl.run(printing_step)

  def numbers_step():
    return tf.strings.length(tf.strings.as_string(tf.random.uniform([])))

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"step_fn: numbers_step uses AsString.*into input_fn"):
    repl.run(numbers_step)
  # Other steps still run on the same replicator.
  np.testing.assert_array_equal(
      repl.run(lambda: tf.cast(repl.replica_id, tf.float32) + 1.0),
      np.arange(1.0, repl.num_replicas + 1.0))


def test_a_variable_initialized_from_the_batch_in_the_step():
  repl = catalogue.make("multi_gpu_2")

  class ActNorm(snt.Module):
    def __call__(self, x):
      if not hasattr(self, "bias"):
        self.bias = tf.Variable(-tf.reduce_mean(x, 0))
      return x + self.bias

  data = np.arange(16, dtype=np.float32).reshape(8, 2)
  input_fn = lambda ctx: tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)
  with repl.context():
    model = ActNorm()
  with pytest.raises(ValueError, match=r"initial value depends on the step's input.*"
                     r"call the module once on a sample batch inside"):
    repl.run(model, input_fn)
  with repl.context():  # the fix the message gives
    model = ActNorm()
    model(tf.constant(data[:2]))
  np.testing.assert_allclose(repl.run(model, input_fn).numpy(),
                             [data[0:2] - data[0:2].mean(0), data[2:4] - data[0:2].mean(0)])


def test_outputs_whose_shape_differs_between_replicas():
  repl = catalogue.make("multi_gpu_2")

  def kept_values():  # replica r keeps r + 1 values
    x = tf.range(4)
    return tf.boolean_mask(x, x <= tf.cast(repl.replica_id, tf.int32))

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r"step_fn: kept_values returned an output whose shape "
                           r"differs from replica to replica.*pad it to a fixed size"):
    repl.run(kept_values)


def test_gpu_replicator_under_a_multi_worker_tf_config():
  config = ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, '
            '"task": {"type": "worker", "index": 0}}')
  with mock.patch.dict(os.environ, {"TF_CONFIG": config}):
    with pytest.raises(ValueError, match="TF_CONFIG lists 2 workers"):
      replicator.GpuReplicator()


def test_replicas_branching_around_a_collective():
  repl = catalogue.make("multi_gpu_2")

  def step_fn():
    if repl.mesh.devices and _python_replica_index() == 0:
      return repl.all_sum(tf.constant(1.0))
    return tf.constant(0.0)

  def _python_replica_index():
    from replicator.collectives import replica_context  # pylint: disable=g-import-not-at-top
    return replica_context.current().index

  with pytest.raises(RuntimeError, match="Replicas took different paths"):
    repl.run(step_fn)


def test_creating_a_variable_after_the_first_run():
  repl = catalogue.make("multi_gpu_2")
  created = []

  def step_fn(flag):
    if flag and not created:
      created.append(tf.Variable(1.0, name="late"))
    return tf.constant(1.0)

  repl.run(step_fn, args=(False,))
  with pytest.raises(RuntimeError, match="created the variable 'late' after its first run"):
    repl.run(step_fn, args=(True,))


@pytest.mark.parametrize("kwargs,match", [
    ({"gradient_reduction": replicator.ReduceOp.MAX}, "gradient_reduction"),
    ({"accumulate_steps": 0}, "accumulate_steps"),
    ({"clip_global_norm": -1.0}, "clip_global_norm"),
])
def test_bad_wrap_optimizer_options(kwargs, match):
  repl = catalogue.make("gpu")
  with pytest.raises((ValueError, TypeError), match=match):
    repl.wrap_optimizer(snt.optimizers.SGD(0.1), **kwargs)


def test_reduce_op_must_be_the_enum():
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(TypeError, match="op: expected a replicator.ReduceOp"):
    repl.run(lambda: repl.all_reduce(tf.constant(1.0), "sum"))


def test_collective_inside_a_tensor_conditional():
  repl = catalogue.make("multi_gpu_2")

  def step_fn(x):
    return tf.cond(x > 0, lambda: repl.all_sum(x * 2.0), lambda: x)

  with pytest.raises(NotImplementedError, match="inside a tf.cond"):
    repl.run(step_fn, args=(tf.constant(1.0),))


@pytest.mark.parametrize("method,value,match", [
    ("all_sum", lambda: tf.constant("a"),
     r"all_sum: cannot reduce string values \(ReduceOp.SUM\).*use all_gather"),
    ("all_max", lambda: tf.constant(["a", "b"]), r"all_max: cannot reduce string values"),
    ("all_max", lambda: tf.complex(1.0, 2.0),
     r"all_max: complex64 values have no order.*tf.math.real, tf.math.imag or tf.abs"),
    ("all_min", lambda: {"a": tf.constant(1.0), "b": tf.complex(1.0, 2.0)},
     r"all_min: complex64 values have no order"),
])
@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
def test_values_a_collective_cannot_reduce(name, method, value, match):
  repl = catalogue.make(name)
  with pytest.raises(TypeError, match=match):
    repl.run(lambda: getattr(repl, method)(value()))
  assert repl.run(lambda: repl.all_sum(tf.complex(1.0, 2.0))).numpy()[0] == (
      repl.num_replicas * (1 + 2j))  # complex sums still work


@pytest.mark.parametrize("source,error,match", [
    (lambda: tf.constant(1), TypeError,
     r"broadcast: source_replica must be a Python int .*got <tf.Tensor.*tf.where"),
    (lambda: 1.0, TypeError, r"broadcast: source_replica must be a Python int .*got 1.0"),
    (lambda: True, TypeError, r"got True"),
    (lambda: 2, ValueError, r"broadcast: source_replica must be in \[0, 2\), got 2"),
])
def test_broadcast_source_replica_not_a_replica_id(source, error, match):
  repl = catalogue.make("multi_gpu_2")
  with pytest.raises(error, match=match):
    repl.run(lambda: repl.broadcast(tf.constant(1.0), source_replica=source()))
  np.testing.assert_array_equal(  # a NumPy integer is an int
      repl.run(lambda: repl.broadcast(tf.cast(repl.replica_id, tf.float32),
                                      source_replica=np.int64(1))).numpy(), [1.0, 1.0])


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(timeout_s="5"), TypeError, r"timeout_s: expected a number of seconds .*got '5'"),
    (dict(timeout_s=True), TypeError, r"timeout_s: expected a number of seconds .*got True"),
    (dict(pack_bytes=True), ValueError, r"pack_bytes: expected a positive int, got True"),
    (dict(buckets_in_flight=0), ValueError,
     r"buckets_in_flight: expected a positive int or None \(2, or 1 on a host .*got 0"),
    (dict(buckets_in_flight=2.0), ValueError,
     r"buckets_in_flight: expected a positive int or None .*got 2.0"),
    (dict(compression=replicator.Compression.BF16, sum_in_float32="yes"), TypeError,
     r"sum_in_float32: expected True or False, got 'yes'"),
])
def test_all_reduce_options_of_the_wrong_type(kwargs, error, match):
  with pytest.raises(error, match=match):
    replicator.AllReduceOptions(**kwargs)
  assert replicator.AllReduceOptions(timeout_s=np.float32(5.0)).timeout_s == 5.0


def test_reduction_of_values_whose_shapes_differ_between_replicas():
  repl = catalogue.make("multi_gpu_2")

  def step_fn():
    rows = tf.zeros(tf.stack([repl.replica_id + 3, 2]))  # static: [3, 2] and [4, 2]
    return repl.all_sum({"a": tf.constant(1.0), "rows": rows})

  with pytest.raises(ValueError, match=(
      r"all_sum: tensor 1 of the 2 in the value has a different shape on each replica "
      r"\(replica 0: \(3, 2\), replica 1: \(4, 2\)\).*all_gather")):
    repl.run(step_fn)
  with pytest.raises(ValueError, match=r"all_max: the value has a different shape"):
    # tf.maximum would have broadcast [1] against [2] silently
    repl.run(lambda: repl.all_max(tf.zeros(tf.stack([repl.replica_id + 1]))))
