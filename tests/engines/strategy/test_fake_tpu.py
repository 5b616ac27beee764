"""The strategy engine under TensorFlow's real `TPUStrategy`, over a fake TPU.

`replicator.testing.tpu_engine_on_fake_tpu(8)` builds `TPUStrategy` (Sonnet's
`TpuReplicator`) over a TPU that exists only as metadata: its variables are
real `TPUDistributedVariable`s, and each `run` traces the call as a TPU host
would (the loop, `strategy.run` in the TPU's replicate context, every
collective as `cross_replica_sum`, the merged writes, the optimizer), then
returns zeros instead of executing. What these tests check against a
one-device oracle: that a step traces at all (what the stand-in, a
`MirroredStrategy`, let through before), the structure, shapes and dtypes of
what it returns, the variables and slots its first trace makes and the
initial values they hold (computed eagerly, so real numbers), a checkpoint
restored into them, and that every `cross_replica_sum` in the traced graph
has a dtype a TPU takes. What they cannot: the TPU compiler, execution.
`tpu_engine_on_cpus` executes the same engine; `test_exact_*` below run the
TPU's encodings of integers and infinities there against NumPy.
"""

import keras
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
import test_goldens_conformance as conformance
from replicator import testing
from replicator.collectives import wire
from tensorflow.python.distribute import tpu_values

CORES = 8
GLOBAL_BATCH = 16
# What a TPU's cross_replica_sum takes (tensorflow/core/ops/tpu_cross_replica_ops.cc).
TPU_SUM_DTYPES = {tf.bfloat16, tf.float16, tf.float32, tf.float64, tf.int32, tf.uint32}


def fake_tpu():
  return testing.tpu_engine_on_fake_tpu(CORES)


def traced_graphs(repl):
  """The GraphDefs of every call `repl` traced (its loops, with their
  nested functions in the library)."""
  graphs = []
  for step in repl._engine._steps.values():  # pylint: disable=protected-access
    for function in step._loop._list_all_concrete_functions():  # pylint: disable=protected-access
      graphs.append(function.graph.as_graph_def())
  assert graphs, "nothing was traced"
  return graphs


def cross_replica_sums(repl):
  """The dtype of each `CrossReplicaSum` op in what `repl` traced."""
  found = []
  for graph in traced_graphs(repl):
    nodes = list(graph.node)
    for function in graph.library.function:
      nodes += list(function.node_def)
    found += [tf.as_dtype(node.attr["T"].type) for node in nodes
              if node.op == "CrossReplicaSum"]
  return found


def assert_tpu_sums(repl, at_least=1):
  """Every collective traced is a cross_replica_sum of a dtype a TPU takes."""
  sums = cross_replica_sums(repl)
  assert len(sums) >= at_least, f"{len(sums)} cross_replica_sum ops traced"
  assert set(sums) <= TPU_SUM_DTYPES, sorted(d.name for d in set(sums) - TPU_SUM_DTYPES)


def images_input(shape, dtype=np.float32, seed=0):
  data = np.random.RandomState(seed).randn(GLOBAL_BATCH * 4, *shape).astype(dtype)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).repeat().batch(
        ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)
  return input_fn


def test_the_fake_tpu_is_tensorflows_tpu_strategy_with_packed_variables():
  repl = fake_tpu()
  strategy = repl._engine.strategy  # pylint: disable=protected-access
  assert isinstance(strategy, tf.distribute.TPUStrategy)
  assert repl.num_replicas == CORES
  with repl.context():
    variable = tf.Variable(1.0)
  assert isinstance(variable, tpu_values.TPUDistributedVariable)
  assert variable._packed_var is not None  # pylint: disable=protected-access
  assert [copy.numpy() for copy in variable.replicas] == [1.0] * CORES


def test_a_user_built_tpu_strategy_is_taken_as_it_is_on_the_fake_tpu():
  strategy = snt.distribute.TpuReplicator(testing.FakeTpuResolver(num_cores=4))
  repl = replicator.TpuReplicator(strategy=strategy, num_tpu_cores_per_worker=4)
  assert repl._engine.strategy is strategy  # pylint: disable=protected-access
  assert repl.num_replicas == 4
  with pytest.raises(ValueError, match="num_tpu_cores_per_worker: 8 requested.*4 cores"):
    replicator.TpuReplicator(strategy=strategy, num_tpu_cores_per_worker=8)
  with pytest.raises(ValueError, match="tpu: given together with strategy="):
    replicator.TpuReplicator(strategy=strategy, tpu="local")
  with pytest.raises(TypeError, match="strategy: expected a tf.distribute.TPUStrategy.*"
                     "MirroredStrategy"):
    replicator.TpuReplicator(strategy=tf.distribute.MirroredStrategy(["/cpu:0"]))


# --- The goldens: made lazily, trained with Momentum, restored. --------------

CASES = [pytest.param(case, id=f"{case.name}-fake_tpu") for case in conformance.CASES]


@pytest.mark.parametrize("case", CASES)
def test_golden_traces_on_the_fake_tpu(case):
  """Made by the first run with the one-device module's variables and initial
  values; outputs, mean gradients and loss of the one-device shapes; slots
  made; every collective a TPU's."""
  golden = case.golden
  repl = fake_tpu()
  inputs = golden.inputs(GLOBAL_BATCH)
  plain = case.make_plain()
  shard = np.split(inputs, CORES)[0]
  # Built in a tf.function, where seeded initializers draw as in a step.
  tf.function(lambda: golden.forward(plain, tf.constant(shard)))()
  want_output = golden.forward(plain, tf.constant(shard))

  with repl.context():
    module = golden.make()
    optimizer = repl.wrap_optimizer(snt.optimizers.Momentum(0.1, 0.9))

  def step_fn(x):
    with tf.GradientTape() as tape:
      output = golden.forward(module, x)
      loss = conformance._loss(output)  # pylint: disable=protected-access
    variables = module.trainable_variables
    grads = conformance._dense(tape.gradient(loss, variables))  # pylint: disable=protected-access
    optimizer.apply(grads, variables)
    return {"output": output, "grads": repl.all_mean(grads), "loss": repl.all_mean(loss)}

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(inputs).batch(
        ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).repeat()

  got = repl.run(step_fn, input_fn)
  kinds = conformance._kinds  # pylint: disable=protected-access
  assert kinds(module.variables) == kinds(plain.variables)
  assert kinds(optimizer.optimizer.variables) == [
      (tuple(v.shape), v.dtype) for v in plain.trainable_variables]
  # (The plain module's call moved its moving averages: trainable ones only.)
  for variable, want in zip(module.trainable_variables, plain.trainable_variables):
    for copy in conformance._copies(variable):  # pylint: disable=protected-access
      # every core starts from the one-device value
      np.testing.assert_array_equal(copy.numpy(), want.numpy(), err_msg=variable.name)
  assert got["output"].shape == (CORES,) + tuple(want_output.shape)
  assert got["output"].dtype == want_output.dtype
  assert [tuple(g.shape) for g in got["grads"]] == [
      (CORES,) + tuple(v.shape) for v in plain.trainable_variables]
  assert got["loss"].shape == (CORES,)
  again = repl.run(step_fn, input_fn, steps=2)
  assert tf.nest.map_structure(lambda t: (t.shape, t.dtype), again) == \
      tf.nest.map_structure(lambda t: (t.shape, t.dtype), got)
  assert_tpu_sums(repl, at_least=2)  # the gradients' mean, the loss' mean


@pytest.mark.parametrize("case", CASES)
def test_a_checkpoint_restored_before_the_first_trace_fills_every_core_on_the_fake_tpu(
    case, tmp_path):
  """Sonnet's `test_restore_on_create_in_replica_context`, on TPUStrategy's
  own variables: every core's copy holds the saved values once made."""
  golden = case.golden
  inputs = golden.inputs(GLOBAL_BATCH)
  _, saved, path = conformance.saved_plain_module(case, inputs, tmp_path)

  repl = fake_tpu()
  with repl.context():
    module = golden.make()
  status = tf.train.Checkpoint(module=module).restore(path)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(inputs).batch(
        ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)

  repl.run(lambda x: golden.forward(module, x), input_fn)
  status.assert_consumed()
  for variable, value in zip(conformance._checkpointed(module), saved):  # pylint: disable=protected-access
    for r, copy in enumerate(conformance._copies(variable)):  # pylint: disable=protected-access
      np.testing.assert_array_equal(copy.numpy(), value, err_msg=f"{variable.name}, core {r}")


# --- Optimizers. -------------------------------------------------------------

OPTIMIZERS = {
    "snt_sgd": lambda: snt.optimizers.SGD(0.1),
    "snt_momentum": lambda: snt.optimizers.Momentum(0.1, 0.9),
    "snt_adam": lambda: snt.optimizers.Adam(0.01),
    "snt_rmsprop": lambda: snt.optimizers.RMSProp(0.01, momentum=0.5),
    "keras_sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "keras_adam": lambda: keras.optimizers.Adam(0.01),
    "keras_adamw": lambda: keras.optimizers.AdamW(0.01),
    "keras_rmsprop": lambda: keras.optimizers.RMSprop(0.01),
    "keras_adagrad": lambda: keras.optimizers.Adagrad(0.01),
    "keras_nadam": lambda: keras.optimizers.Nadam(0.01),
    "keras_lion": lambda: keras.optimizers.Lion(0.01),
    "keras_adam_clipnorm_ema": lambda: keras.optimizers.Adam(0.01, global_clipnorm=1.0,
                                                             use_ema=True),
}


@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}-fake_tpu") for n in OPTIMIZERS])
def test_an_optimizer_traces_its_update_on_the_fake_tpu(name):
  """The optimizer's slots are those one device makes; its gradients are
  averaged by one float32 cross_replica_sum each step."""
  repl = fake_tpu()
  with repl.context():
    model = catalogue.mlp()
    optimizer = repl.wrap_optimizer(OPTIMIZERS[name]())
  x, y = catalogue.classification_data(num_examples=64)
  got = repl.run(catalogue.train_step(model, optimizer),
                 catalogue.input_fn_for(x, y, GLOBAL_BATCH, repeat=True), steps=3)
  assert got.shape == (CORES,) and got.dtype == tf.float32

  plain_model, plain_optimizer = catalogue.mlp(), OPTIMIZERS[name]()
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        y[:2], plain_model(x[:2])))
  grads = tape.gradient(loss, plain_model.trainable_variables)
  plain_optimizer.apply(grads, plain_model.trainable_variables)
  def kinds(optimizer):  # (Sonnet refuses `.variables` of a module without any)
    variables = (optimizer.variables if isinstance(optimizer, keras.optimizers.Optimizer)
                 else tf.Module.variables.fget(optimizer))
    return [(tuple(v.shape), tf.as_dtype(v.dtype)) for v in variables]
  assert kinds(optimizer.optimizer) == kinds(plain_optimizer)
  assert_tpu_sums(repl)


# --- Collectives, of every dtype a step may hold. ----------------------------

DTYPES = [tf.float32, tf.bfloat16, tf.float16, tf.float64, tf.int32, tf.int64,
          tf.uint8, tf.int8, tf.int16, tf.uint16, tf.uint32, tf.uint64, tf.bool,
          tf.complex64]


def _collective_cases():
  cases = []
  for dtype in DTYPES:
    ops = ["all_gather", "broadcast"]
    if dtype != tf.bool:
      ops.append("all_sum")
    if not dtype.is_complex:
      ops += ["all_max", "all_min"]
    if dtype.is_floating or dtype.is_complex:
      ops.append("all_mean")
    cases += [pytest.param(op, dtype, id=f"{op}-{dtype.name}-fake_tpu") for op in ops]
  return cases


def _per_replica_value(repl, dtype):
  value = tf.reshape(tf.range(6), [2, 3]) + repl.replica_id
  return tf.cast(value > 2, tf.bool) if dtype == tf.bool else tf.cast(value, dtype)


@pytest.mark.parametrize("op,dtype", _collective_cases())
def test_a_collective_of_every_dtype_traces_as_tpu_sums_on_the_fake_tpu(op, dtype):
  repl = fake_tpu()
  collective = getattr(repl, op)

  def step_fn():
    return collective(_per_replica_value(repl, dtype))

  got = repl.run(step_fn, steps=2)
  rows = 2 * CORES if op == "all_gather" else 2
  assert got.shape == (CORES, rows, 3) and got.dtype == dtype
  assert_tpu_sums(repl)


@pytest.mark.parametrize("op", [pytest.param(op, id=f"{op}-fake_tpu") for op in (
    "all_sum", "all_mean", "all_max", "all_min", "all_gather", "broadcast")])
def test_a_collectives_gradient_traces_on_the_fake_tpu(op):
  repl = fake_tpu()
  with repl.context():
    weight = tf.Variable(tf.ones([2, 3]))
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))

  def step_fn():
    with tf.GradientTape() as tape:
      value = weight * tf.cast(repl.replica_id + 1, tf.float32)
      loss = tf.reduce_sum(tf.square(getattr(repl, op)(value)))
    grad = tape.gradient(loss, weight)
    optimizer.apply([grad], [weight])
    return grad

  got = repl.run(step_fn)
  assert got.shape == (CORES, 2, 3) and got.dtype == tf.float32
  assert_tpu_sums(repl, at_least=2)


@pytest.mark.parametrize("dtype", [pytest.param(d, id=f"{d.name}-fake_tpu") for d in (
    tf.float32, tf.bfloat16, tf.int32, tf.int64)])
def test_reduce_scatter_and_its_gradient_trace_as_tpu_sums_on_the_fake_tpu(dtype):
  """Each core's slice ([2, 3] of a [16, 3] sum), picked by a replica id
  known only when the step runs, and the gradient of a mean's slice."""
  repl = fake_tpu()

  def step_fn():
    value = tf.cast(tf.reshape(tf.range(2 * CORES * 3), [2 * CORES, 3]) + repl.replica_id,
                    dtype)
    if not dtype.is_floating:
      return {"slice": repl.reduce_scatter(value)}
    with tf.GradientTape() as tape:
      tape.watch(value)
      mine = repl.reduce_scatter(value, replicator.ReduceOp.MEAN)
      loss = tf.reduce_sum(tf.square(tf.cast(mine, tf.float32)))
    return {"slice": mine, "grad": tape.gradient(loss, value)}

  got = repl.run(step_fn, steps=2)
  assert got["slice"].shape == (CORES, 2, 3) and got["slice"].dtype == dtype
  if dtype.is_floating:
    assert got["grad"].shape == (CORES, 2 * CORES, 3) and got["grad"].dtype == dtype
  assert_tpu_sums(repl, at_least=2 if dtype.is_floating else 1)


def test_exact_integer_sums_gathers_and_broadcasts_run_on_the_stand_in():
  """The encodings a TPU traces, executed: 64-bit sums beyond 32 bits,
  wrapping narrow ints, bits of inf and NaN, against NumPy."""
  repl = testing.tpu_engine_on_cpus(2)
  big = np.array([2**40 + 3, -(2**50) - 7, 2**62], np.int64)
  unsigned = np.array([2**63 + 5, 2**64 - 1, 7], np.uint64)
  narrow = np.array([100, -100, 127], np.int8)
  specials = np.array([np.inf, -np.inf, np.nan], np.float32)

  def step_fn():
    r = repl.replica_id
    mine_big = tf.constant(big) * tf.cast(r + 1, tf.int64)
    mine_unsigned = tf.constant(unsigned) + tf.cast(r, tf.uint64)
    mine_narrow = tf.constant(narrow) + tf.cast(r, tf.int8)
    return {"sum_int64": repl.all_sum(mine_big),
            "sum_uint64": repl.all_sum(mine_unsigned),
            "sum_int8": repl.all_sum(mine_narrow),
            "max_int64": repl.all_max(mine_big),
            "gather_int64": repl.all_gather(mine_big),
            "broadcast_uint64": repl.broadcast(mine_unsigned, 1),
            "gather_specials": repl.all_gather(tf.constant(specials) * tf.cast(r + 1, tf.float32)),
            "max_specials": repl.all_max(tf.constant(specials[:2]))}

  got = {k: v.numpy() for k, v in repl.run(step_fn).items()}
  with np.errstate(over="ignore"):
    want = {
        "sum_int64": big * 1 + big * 2,
        "sum_uint64": unsigned + (unsigned + np.uint64(1)),
        "sum_int8": (narrow + (narrow + np.int8(1))).astype(np.int8),
        "max_int64": np.maximum(big, big * 2),
        "gather_int64": np.concatenate([big, big * 2]),
        "broadcast_uint64": unsigned + np.uint64(1),
        "gather_specials": np.concatenate([specials, specials * 2]),
        "max_specials": specials[:2]}
  for key, value in want.items():
    for r in range(2):
      np.testing.assert_array_equal(got[key][r], value, err_msg=f"{key}, replica {r}")


def test_an_int64_counter_and_a_bool_flag_merge_exactly_on_the_stand_in():
  """Integer writes merge as replica 0's value, through the TPU's encodings."""
  repl = testing.tpu_engine_on_cpus(2)
  with repl.context():
    counter = tf.Variable(2**40, dtype=tf.int64)
    flag = tf.Variable(False)
    small = tf.Variable(250, dtype=tf.uint8)

  def step_fn():
    counter.assign_add(tf.cast(repl.replica_id + 1, tf.int64) * 2**33)
    flag.assign(tf.equal(repl.replica_id, 0))
    small.assign_add(tf.cast(repl.replica_id + 3, tf.uint8))

  repl.run(step_fn, steps=2)
  for r in range(2):
    assert counter.replicas[r].numpy() == 2**40 + 2 * 2**33
    assert bool(flag.replicas[r].numpy())
    assert small.replicas[r].numpy() == (250 + 6) % 256


# --- What users' steps hold: batch norm, dropout, counters, random numbers. ---

def _batch_norm_step(repl, make_norm, make_optimizer, output):
  """A batch norm, then a linear layer, trained; returns the loss and
  `output(norm)`."""
  with repl.context():
    norm, linear = make_norm(), snt.Linear(3)
    optimizer = repl.wrap_optimizer(make_optimizer())

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(linear(snt.flatten(norm(x, is_training=True))))
    variables = norm.trainable_variables + linear.trainable_variables
    optimizer.apply(tape.gradient(loss, variables), variables)
    return {"loss": loss, **output(norm)}
  return step_fn


def _sonnet_batch_norm(repl):
  return _batch_norm_step(
      repl, lambda: snt.BatchNorm(True, True), lambda: snt.optimizers.Adam(0.01),
      lambda norm: {"counter": norm.moving_mean._counter.read_value()})  # pylint: disable=protected-access


def _cross_replica_batch_norm(repl):
  return _batch_norm_step(
      repl, lambda: replicator.nn.CrossReplicaBatchNorm(True, True),
      lambda: snt.optimizers.SGD(0.1), lambda norm: {"mean": norm.moving_mean.value})


def _keras_dropout_adam(repl):
  with repl.context():
    model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(8),
                              keras.layers.Dropout(0.5), keras.layers.Dense(3)])
    optimizer = repl.wrap_optimizer(keras.optimizers.Adam(0.01))

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(model(x, training=True))
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return {"loss": loss}
  return step_fn


def _int64_counter(repl):
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)
    linear = snt.Linear(3)
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(linear(snt.flatten(x)))
    optimizer.apply(tape.gradient(loss, linear.trainable_variables), linear.trainable_variables)
    counter.assign_add(1)
    return {"loss": loss, "counter": counter.read_value()}
  return step_fn


def _random_numbers(repl):
  generator = repl.random_generator(seed=3)
  with repl.context():
    noise = keras.layers.GaussianNoise(0.1, seed=4)
    seeds = keras.random.SeedGenerator(6)

  def step_fn(x):
    return {"uniform": generator.uniform([2]),
            "op_seeded": tf.random.uniform([2], seed=5),
            "noise": tf.reduce_mean(noise(x, training=True), 0)[0, 0],
            "keras": keras.random.normal([2], seed=seeds)}
  return step_fn


MODELS = {"sonnet_batch_norm": _sonnet_batch_norm,
          "cross_replica_batch_norm": _cross_replica_batch_norm,
          "keras_dropout_adam": _keras_dropout_adam,
          "int64_counter": _int64_counter,
          "random_numbers": _random_numbers}


@pytest.mark.parametrize("name", [pytest.param(n, id=f"{n}-fake_tpu") for n in MODELS])
def test_a_users_step_traces_on_the_fake_tpu_as_it_runs_on_the_stand_in(name):
  """What comes back has the structure, shapes and dtypes the stand-in's
  executed step gives (at 8 cores against 2 replicas); the TPU's trace
  holds only sums a TPU takes."""
  input_fn = images_input([4, 4, 3])
  repl = fake_tpu()
  got = repl.run(MODELS[name](repl), input_fn)
  got = repl.run(MODELS[name](repl), input_fn, steps=3)
  stand_in = testing.tpu_engine_on_cpus(2)
  want = stand_in.run(MODELS[name](stand_in), input_fn, steps=3)
  assert {k: (v.shape[1:], v.dtype) for k, v in got.items()} == \
      {k: (v.shape[1:], v.dtype) for k, v in want.items()}
  assert all(v.shape[0] == CORES for v in got.values())
  if name != "random_numbers":
    assert_tpu_sums(repl)


# --- Misuse: the errors a TPU gives, raised before anything runs. ------------

def test_a_variable_made_on_a_later_trace_is_refused_on_the_fake_tpu():
  repl = fake_tpu()
  made = []

  def step_fn(scale):
    if scale > 1:
      made.append(tf.Variable(1.0))
    return tf.constant(float(scale))

  repl.run(step_fn, args=(1,))
  with pytest.raises(RuntimeError, match="on a later trace"):
    repl.run(step_fn, args=(2,))


def test_a_string_output_is_refused_on_the_fake_tpu():
  repl = fake_tpu()
  with pytest.raises(TypeError, match="returns a string tensor; a TPU step returns "
                     "numbers only"):
    repl.run(lambda: tf.constant("text"))


@pytest.mark.parametrize("dataset,match", [
    pytest.param(lambda: tf.data.Dataset.from_tensor_slices(["a", "b"] * 8).batch(2),
                 "dense numeric tensors only", id="strings-fake_tpu"),
    pytest.param(lambda: tf.data.Dataset.range(16).batch(3),
                 "needs every dimension fixed", id="a_dynamic_batch-fake_tpu"),
])
def test_inputs_a_tpu_cannot_take_are_refused_on_the_fake_tpu(dataset, match):
  repl = fake_tpu()
  with pytest.raises(ValueError, match=match):
    repl.run(lambda x: x, lambda ctx: dataset())


def test_a_variable_initialized_from_the_data_is_refused_on_the_fake_tpu():
  repl = fake_tpu()
  made = []

  def step_fn(x):
    if not made:
      made.append(tf.Variable(tf.reduce_mean(x, 0)))
    return made[0].read_value()

  with pytest.raises(ValueError, match="data-dependent initialization"):
    repl.run(step_fn, images_input([3]))


def test_a_gather_of_a_shape_known_only_at_run_time_is_refused_on_the_fake_tpu():
  repl = fake_tpu()

  def step_fn(x):
    return repl.all_gather(tf.boolean_mask(x, x > 0))

  with pytest.raises(ValueError, match="all_gather on a TPU needs static shapes.*pad"):
    repl.run(step_fn, images_input([3]))
  with pytest.raises(ValueError, match="all_reduce on a TPU needs static shapes.*pad"):
    repl.run(lambda x: repl.all_sum(tf.boolean_mask(x, x > 0)), images_input([3]))


@pytest.mark.parametrize("op", [pytest.param(op, id=f"{op}-fake_tpu")
                                for op in ("all_gather", "broadcast")])
def test_a_string_in_a_collective_is_refused_with_the_rule_on_the_fake_tpu(op):
  repl = fake_tpu()

  def step_fn():
    getattr(repl, op)(tf.constant(["a", "b"]))
    return tf.constant(0)

  with pytest.raises(TypeError, match=f"{op}: a TPU's collectives carry numbers and "
                     "booleans, got a string tensor"):
    repl.run(step_fn)


def test_running_out_of_data_and_a_step_without_input_trace_on_the_fake_tpu():
  repl = fake_tpu()
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)

  def count():
    counter.assign_add(1)
    return counter.read_value()

  assert repl.run(count, steps=4).shape == (CORES,)

  def finite(ctx):
    return tf.data.Dataset.range(8 * CORES).batch(2, drop_remainder=True)

  got = repl.run(lambda x: repl.all_sum(x), finite, steps=3)
  assert got.shape == (CORES, 2) and got.dtype == tf.int64
  assert_tpu_sums(repl)


# --- A pod slice: 2 hosts x 8 cores. ------------------------------------------

def test_a_pod_slice_counts_every_host_and_feeds_each_its_own_shard_on_the_fake_tpu():
  """What a fake pod can show: the hosts and cores counted, and the dataset
  each host's input pipeline is given (its InputContext, its own cores). Its
  hosts' devices do not exist in this process, so no dataset is placed
  there and no step traces: that needs a pod."""
  repl = testing.tpu_engine_on_fake_tpu(8, num_hosts=2)
  assert repl.num_replicas == 16
  engine = repl._engine  # pylint: disable=protected-access
  assert engine.hosts == 2
  contexts = []

  def input_fn(ctx):
    contexts.append((ctx.input_pipeline_id, ctx.num_input_pipelines,
                     ctx.per_replica_batch_size(64)))
    return tf.data.Dataset.range(640).shard(ctx.num_input_pipelines,
                                            ctx.input_pipeline_id).batch(4, drop_remainder=True)

  streams = repl._inputs  # pylint: disable=protected-access
  made = {}
  streams._iterator_of = lambda dataset, for_host: made.setdefault("for_host", for_host)  # pylint: disable=protected-access
  streams.get(input_fn, repl._check_dataset)  # pylint: disable=protected-access
  hosts = [engine.host_dataset(made["for_host"], tf.distribute.InputContext(2, h, 16))
           for h in range(2)]
  assert contexts[1:] == [(0, 2, 4), (1, 2, 4)]
  for host, dataset in enumerate(hosts):
    batches = [b.numpy() for b in dataset.take(9)]
    assert len(batches) == 9
    np.testing.assert_array_equal(batches[0], np.arange(640)[host::2][:4])
  with pytest.raises(ValueError, match="num_workers: 1 TPU hosts requested.*2 host"):
    replicator.TpuReplicator(strategy=engine.strategy)


def test_the_tpu_sum_table_is_the_one_the_strategy_engine_uses():
  assert wire.carried(wire.TPU_SUM, tf.float32) and wire.carried(wire.TPU_SUM, tf.int32)
  for dtype in (tf.int64, tf.bool, tf.uint8, tf.uint64, tf.complex64):
    assert not wire.carried(wire.TPU_SUM, dtype)
