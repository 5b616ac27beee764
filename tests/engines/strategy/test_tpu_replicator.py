"""TpuReplicator on a TPU: the resolver's choice, the path to the strategy
engine, and the errors a TPU gives before a step runs (on the stand-in)."""

import os
import re
import subprocess
import sys
import time
from unittest import mock

import keras
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
from replicator import testing
from replicator import tpu
from replicator.engines.strategy import engine as strategy_engine


@pytest.mark.parametrize("argument,environment,want", [
    ("my-tpu", {"TPU_NAME": "other", "COLAB_TPU_ADDR": "10.0.0.2:8470"}, "my-tpu"),
    (None, {"TPU_NAME": "named", "COLAB_TPU_ADDR": "10.0.0.2:8470"}, "named"),
    (None, {"TPU_NAME": "", "COLAB_TPU_ADDR": "10.0.0.2:8470"}, "grpc://10.0.0.2:8470"),
    (None, {"TPU_NAME": "", "COLAB_TPU_ADDR": ""}, "local"),
])
def test_the_tpu_is_the_argument_then_tpu_name_then_colab_then_local(
    argument, environment, want):
  with mock.patch.dict(os.environ, environment):
    assert tpu._tpu_address(argument) == want  # pylint: disable=protected-access


def test_no_tpu_fails_in_about_a_second_with_the_fix():
  start = time.monotonic()
  with mock.patch.dict(os.environ, {"TPU_NAME": "", "COLAB_TPU_ADDR": ""}):
    with pytest.raises(RuntimeError, match="no TPU reachable at 'local'.*tensorflow-tpu"
                       ".*TPU_NAME.*emulate_on_cpu=True"):
      replicator.TpuReplicator()
  assert time.monotonic() - start < 60  # a hang guard: it takes about a second


class _FakeResolver:
  """What TPUClusterResolver gives: only its address is read here."""

  def __init__(self, tpu=None):
    self.tpu = tpu


@pytest.fixture
def tpu_found(monkeypatch):
  """A TPU 'found' at any address: the resolver, the connection and the
  initialization are TensorFlow's and need a TPU; the strategy they lead to
  is the stand-in's, so everything after them runs as on a TPU."""
  connected = []
  monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", _FakeResolver)
  monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                      lambda resolver: connected.append(("connect", resolver.tpu)))
  monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                      lambda resolver: connected.append(("initialize", resolver.tpu)))
  monkeypatch.setattr(snt.distribute, "TpuReplicator",
                      lambda resolver: tpu._StandIn(  # pylint: disable=protected-access
                          devices=["/cpu:0", "/cpu:1"]))
  return connected


def test_a_tpu_found_gets_the_strategy_engine_and_trains(tpu_found):
  repl = replicator.TpuReplicator(tpu="grpc://10.0.0.2:8470")
  assert tpu_found == [("connect", "grpc://10.0.0.2:8470"),
                       ("initialize", "grpc://10.0.0.2:8470")]
  assert repl.num_replicas == 2 and repl.num_workers == 1
  x, y = catalogue.classification_data(64)
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))
  loss = repl.run(catalogue.train_step(model, optimizer),
                  catalogue.input_fn_for(x, y, 16), steps=2)
  assert loss.shape == (2,)
  repl.assert_replicas_in_sync(model.variables)


@pytest.mark.parametrize("kwargs,match", [
    ({"num_tpu_cores_per_worker": 4},
     r"num_tpu_cores_per_worker: 4 requested; the TPU found has 2 cores per host"),
    ({"num_workers": 2}, r"num_workers: 2 TPU hosts requested; the TPU found has 1 host"),
])
def test_a_topology_the_tpu_does_not_have_is_refused(tpu_found, kwargs, match):
  del tpu_found
  with pytest.raises(ValueError, match=match):
    replicator.TpuReplicator(**kwargs)


@pytest.mark.parametrize("num_workers", [0, -1, 1.5, True])
def test_num_workers_must_be_a_positive_int(num_workers):
  with pytest.raises(ValueError, match="num_workers: expected an int >= 1"):
    replicator.TpuReplicator(num_workers=num_workers)


def test_the_emulator_runs_one_host():
  with pytest.raises(ValueError, match="num_workers: 2 TPU hosts requested with "
                     "emulate_on_cpu=True.*num_workers=1"):
    replicator.TpuReplicator(num_workers=2, emulate_on_cpu=True)


def test_the_emulator_is_the_strategy_engine_on_logical_cpus():
  repl = replicator.TpuReplicator(num_tpu_cores_per_worker=2, emulate_on_cpu=True)
  assert isinstance(repl._engine, strategy_engine.StrategyEngine)  # pylint: disable=protected-access
  assert repl.mesh.local_devices == ("CPU:0", "CPU:1")
  np.testing.assert_array_equal(
      repl.run(lambda: tf.cast(repl.replica_id, tf.float32) + 1.0), [1.0, 2.0])


_TOO_LATE = """
import tensorflow as tf
import replicator
tf.constant(1.0) + 1.0  # TensorFlow starts with one CPU device
try:
  replicator.TpuReplicator(num_tpu_cores_per_worker=4, emulate_on_cpu=True)
except RuntimeError as error:
  print(error)
"""


def test_the_emulator_says_when_the_cpu_can_no_longer_be_split():
  result = subprocess.run([sys.executable, "-c", _TOO_LATE], capture_output=True,
                          text=True, timeout=300, check=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert re.search(
      r"emulate_on_cpu: num_tpu_cores_per_worker=4 .* already started with 1 logical "
      r"CPU device\(s\)\. .*configure_logical_cpus\(4\).*--cpu_replicas 4.*"
      r"num_tpu_cores_per_worker=1\.", result.stdout), result.stdout + result.stderr


@pytest.mark.parametrize("num_replicas", [0, 2.0, "2"])
def test_the_stand_in_takes_a_count(num_replicas):
  with pytest.raises(ValueError, match="num_replicas: expected an int >= 1"):
    testing.tpu_engine_on_cpus(num_replicas)


def _step_error(step_fn, input_fn=None):
  repl = testing.tpu_engine_on_cpus(2)
  with pytest.raises(Exception) as info:
    repl.run(step_fn, input_fn)
  return repl, info.value


def test_a_string_output_fails_before_the_step_runs():
  repl = testing.tpu_engine_on_cpus(2)
  with repl.context():
    counter = tf.Variable(0)

  def step_fn():
    counter.assign_add(1)
    return tf.strings.as_string(counter)

  with pytest.raises(TypeError, match="returns a string tensor; a TPU step returns "
                     "numbers only"):
    repl.run(step_fn)
  assert int(counter) == 0  # nothing ran


def test_an_op_xla_cannot_compile_fails_on_the_stand_in_first():
  repl = testing.tpu_engine_on_cpus(2)
  with repl.context():
    counter = tf.Variable(0)

  def step_fn():
    counter.assign_add(1)
    tf.print("step", counter)
    return tf.constant(0.0)

  with pytest.raises(Exception, match="tf.print cannot run inside the compiled step"):
    repl.run(step_fn)
  assert int(counter) == 0  # the check comes before the step


@pytest.mark.parametrize("dataset,match", [
    (lambda: tf.data.Dataset.from_tensor_slices(["a", "b", "c", "d"]).batch(2),
     "a TPU step takes dense numeric tensors only"),
    (lambda: tf.data.Dataset.range(10).batch(3),
     r"a TPU\s+needs every dimension fixed.*drop_remainder=True"),
])
def test_inputs_a_tpu_cannot_take_are_refused(dataset, match):
  repl = testing.tpu_engine_on_cpus(2)
  with pytest.raises(ValueError, match=match):
    repl.run(lambda batch: tf.constant(0.0), lambda ctx: dataset())


def test_a_variable_from_the_data_is_refused_with_the_fix():
  repl = testing.tpu_engine_on_cpus(2)

  def step_fn(batch):
    scale = tf.Variable(tf.reduce_mean(batch))  # data-dependent initialization
    return scale * 2.0

  with pytest.raises(ValueError, match="depends on the step's input.*repl.context()"):
    repl.run(step_fn, lambda ctx: tf.data.Dataset.from_tensor_slices(
        np.ones([8, 2], np.float32)).batch(2, drop_remainder=True))


def test_a_variable_made_on_a_later_trace_is_refused():
  repl = testing.tpu_engine_on_cpus(2)
  made = []

  def step_fn(scale):
    if scale > 1:  # a new Python number: a new trace, which makes a variable
      made.append(tf.Variable(1.0))
    return tf.constant(scale)

  repl.run(step_fn, args=(1,))
  with pytest.raises(RuntimeError, match="on a later trace.*repl.context()"):
    repl.run(step_fn, args=(2,))


def test_a_checkpoint_moves_between_the_engines(tmp_path):
  """Written on the strategy engine, restored on MultiGpuReplicator and
  GpuReplicator, and back: one plain value per variable."""
  x, y = catalogue.classification_data(64)

  def trained(repl, steps):
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    step = catalogue.train_step(model, optimizer)
    input_fn = catalogue.input_fn_for(x, y, 16, repeat=True)
    if steps:
      repl.run(step, input_fn, steps=steps)
    else:
      repl.run(lambda batch: model(batch[0]), input_fn)  # built, not trained
    return model, optimizer

  source = testing.tpu_engine_on_cpus(2)
  model, optimizer = trained(source, 3)
  saved = replicator.Checkpointer(str(tmp_path / "tpu"), model=model, optimizer=optimizer)
  saved.save(3)
  want = [v.numpy() for v in model.variables]
  for make in (lambda: replicator.MultiGpuReplicator(devices=["/cpu:0", "/cpu:1"]),
               lambda: replicator.GpuReplicator(device="/cpu:0")):
    repl = make()
    other, other_optimizer = trained(repl, 0)
    restorer = replicator.Checkpointer(str(tmp_path / "tpu"), model=other,
                                       optimizer=other_optimizer)
    assert restorer.restore_latest() == 3
    for got, expected in zip(other.variables, want):
      np.testing.assert_array_equal(got.numpy(), expected)
  # And back: written on the in-graph engine, restored on the strategy engine.
  gpu = replicator.GpuReplicator(device="/cpu:0")
  model, optimizer = trained(gpu, 2)
  replicator.Checkpointer(str(tmp_path / "gpu"), model=model, optimizer=optimizer).save(2)
  target = testing.tpu_engine_on_cpus(2)
  other, other_optimizer = trained(target, 0)
  restorer = replicator.Checkpointer(str(tmp_path / "gpu"), model=other,
                                     optimizer=other_optimizer)
  assert restorer.restore_latest() == 2
  for got, expected in zip(other.variables, model.variables):
    for copy in got.replicas:
      np.testing.assert_array_equal(copy.numpy(), expected.numpy())


def test_one_replica_trains_as_one_device():
  """The engine on one core (a v5e-1): every collective is the identity."""
  x, y = catalogue.classification_data(64)
  results = []
  for repl in (testing.tpu_engine_on_cpus(1), replicator.GpuReplicator(device="/cpu:0")):
    with repl.context():
      model = catalogue.mlp()
      optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
    repl.run(catalogue.train_step(model, optimizer), catalogue.input_fn_for(x, y, 16),
             steps=3)
    gathered = repl.run(lambda: {"sum": repl.all_sum(tf.constant(2.0)),
                                 "gather": repl.all_gather(tf.constant([1.0, 2.0])),
                                 "broadcast": repl.broadcast(tf.constant(3))})
    results.append(([v.numpy() for v in model.variables],
                    {k: v.numpy() for k, v in gathered.items()}))
  (ours, ours_out), (oracle, oracle_out) = results
  for a, b in zip(ours, oracle):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  for key, value in oracle_out.items():
    np.testing.assert_array_equal(ours_out[key], value)


def test_a_gather_in_a_tf_function_with_a_signature_gathers_every_replica():
  """A tf.function with an input_signature keeps its boundary in the step; the
  stand-in's gather there is a sum of placed rows (MirroredStrategy's is a
  merge_call, which a function cannot hold); a TPU's gathers in place."""
  repl = testing.tpu_engine_on_cpus(2)

  @tf.function(input_signature=[tf.TensorSpec([2, 3], tf.float32)])
  def gather(x):
    return repl.all_gather(x, axis=1)

  out = repl.run(lambda: gather(tf.fill([2, 3], tf.cast(repl.replica_id, tf.float32))))
  want = np.concatenate([np.zeros([2, 3]), np.ones([2, 3])], axis=1)
  np.testing.assert_array_equal(out.numpy(), [want, want])


def test_only_the_replicators_variables_are_checked_for_sync():
  repl = testing.tpu_engine_on_cpus(2)
  with repl.context():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
  repl.assert_replicas_in_sync(layer.weights)  # Keras variables wrap ours
  with pytest.raises(TypeError, match="is not a replicated variable.*repl.context()"):
    repl.assert_replicas_in_sync([tf.Variable(1.0)])
