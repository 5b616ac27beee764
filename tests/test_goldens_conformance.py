"""Sonnet's conformance checks of a module under a replicator, for every golden.

What Sonnet's own conformance suite asks of a module under a distribution
strategy (sonnet/src/conformance: `distribute_test.py`, `checkpoint_test.py`),
asked of `repl.context()` and `repl.run`, over goldens x replicators:
- the variables a plain module makes on its first call are made by the first
  `run`, with no call before it: as many, of the same shapes and dtypes, as on
  one device; the optimizer's slots too;
- each replica's output is the module's on one device applied to that
  replica's shard (for a module that normalizes over the global batch, the
  whole batch's, cut);
- the gradient averaged over replicas is the one-device gradient of the mean
  of the replicas' losses, that mean (`repl.all_mean`) is the one-device loss,
  and a wrapped `snt.optimizers.Momentum` (slots made in the first step) steps
  as on one device;
- every variable and slot is identical on every replica afterwards;
- `tf.train.Checkpoint` round trips: the replicated module's checkpoint
  restores into a plain module whose variables are made after the restore
  (Sonnet's `test_restore_on_create`), and a plain module's checkpoint into
  every copy of the replicated one (`test_restore_from_non_distributed`);
  and one restored before the first `run` fills the variables that run makes
  (`test_restore_on_create_in_replica_context`).
Besides `goldens.GOLDENS`: `snt.BatchNorm`, which normalizes each replica's
batch alone, and `replicator.nn.CrossReplicaBatchNorm`, the global batch.

The replicators are the catalogue's and `GpuReplicator(jit_compile=True)`
(one step compiled whole with XLA). Four replicas on the in-graph engine
(`multi_gpu_4`) run the batch norms only, whose statistics depend on the
replica count; every other module computes there as on two (`multi_gpu_2`),
and the catalogue's other tests run there whole. The product takes minutes on
2 cores: one replicator's column of each test is unmarked, the others are
marked slow. `test_goldens.py` checks a `replicator.Checkpointer` round trip.
"""

import dataclasses
from typing import Callable, Optional

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import goldens
import replicator

GLOBAL_BATCH = 8
STEPS = 2
LEARNING_RATE = 0.1
MOMENTUM = 0.9


class LinearThenNorm(snt.Module):
  """A linear layer, then a batch norm in training mode: gradients of the
  linear weights flow through the batch statistics."""

  def __init__(self, norm):
    super().__init__()
    self.linear = snt.Linear(4, w_init=snt.initializers.VarianceScaling(seed=1))
    self.norm = norm

  def __call__(self, x):
    return self.norm(self.linear(x), is_training=True)


def _vectors(batch, features=5):
  return np.random.RandomState(0).randn(batch, features).astype(np.float32)


def _batch_norm():
  return LinearThenNorm(snt.BatchNorm(True, True, decay_rate=0.9))


def _cross_replica_batch_norm():
  return LinearThenNorm(replicator.nn.CrossReplicaBatchNorm(True, True, decay_rate=0.9))


@dataclasses.dataclass(frozen=True)
class Case:
  """A golden, and how one device computes what each replica should.

  `plain` makes the one-device module (default: the golden's own); with
  `whole_batch` it is applied to the global batch and its output cut into the
  replicas' shards, else applied to each shard alone. `by_replica_count`: its
  numbers depend on how many replicas share the global batch (a batch norm's
  statistics), so it runs on 4 replicas too.
  """
  golden: goldens.Golden
  plain: Optional[Callable] = None
  whole_batch: bool = False
  by_replica_count: bool = False

  @property
  def name(self):
    return self.golden.name

  def make_plain(self):
    return (self.plain or self.golden.make)()


CASES = [Case(golden) for golden in goldens.GOLDENS] + [
    # snt.BatchNorm normalizes each replica's batch by its own statistics.
    Case(goldens.Golden("snt.BatchNorm per replica", _batch_norm, _vectors),
         by_replica_count=True),
    Case(goldens.Golden("replicator.nn.CrossReplicaBatchNorm", _cross_replica_batch_norm,
                        _vectors), plain=_batch_norm, whole_batch=True, by_replica_count=True),
]


# The catalogue's replicators, and one step compiled whole with XLA.
REPLICATORS = dict(catalogue.REPLICATORS, gpu_xla=(
    lambda: replicator.GpuReplicator(device="/cpu:0", jit_compile=True), 1))


FOUR = "multi_gpu_4"  # where only the cases `by_replica_count` run


def _cases_by_replicator(fast, names=tuple(catalogue.REPLICATORS)):
  """Every case on the replicators `names` (on `FOUR`, the batch norms only),
  all but `fast`'s marked slow; ids `case-replicator`."""
  return [pytest.param(case, name, id=f"{case.name}-{name}",
                       marks=() if name == fast else pytest.mark.slow)
          for case in CASES for name in sorted(names)
          if name != FOUR or case.by_replica_count]


def _compiles_with_xla(replicator_name) -> bool:
  """Whether XLA computes the steps: the in-graph engine compiled whole. (The
  strategy engine's stand-in, the TPU emulator, compiles each step with XLA
  only to check it, then runs TensorFlow's kernels.)"""
  return replicator_name == "gpu_xla"


MAIN_FAST = "multi_gpu_2"
RESTORE_FAST = "tpu_engine_2"  # the TPU emulator


def _loss(output):
  return tf.reduce_mean(tf.square(tf.cast(output, tf.float32) - 0.5))


def _dense(gradients):
  # Sonnet's sparse Momentum updates only the rows looked up (and Keras
  # variables lack its `scatter_sub`): both sides take dense gradients.
  return [tf.convert_to_tensor(g) for g in gradients]


_ORACLES = {}


def _oracle(case, num_replicas, jit_compile, inputs):
  """`_train_oracle`'s result, computed once per case, replica count and compiler
  (two replicators of 2 replicas without XLA share it): read only, never trained on."""
  key = (case.name, num_replicas, jit_compile)
  if key not in _ORACLES:
    _ORACLES[key] = _train_oracle(case, num_replicas, jit_compile, inputs)
  return _ORACLES[key]


def _train_oracle(case, num_replicas, jit_compile, inputs):
  """One device, no replicator: `(module, slots, [(outputs, grads, loss)] per step)`.

  The module is built in a `tf.function`, where Sonnet's seeded initializers
  draw what they draw in a replicator's step (eagerly, each call draws anew).
  Momentum is written out (`snt.optimizers.Momentum`'s rule): on one device a
  Sonnet optimizer cannot make slots for Keras variables.
  """
  module = case.make_plain()
  shards = np.split(inputs, num_replicas)
  forward = case.golden.forward
  tf.function(lambda: forward(module, tf.constant(shards[0])))()
  slots = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
           for v in module.trainable_variables]

  def step():
    with tf.GradientTape() as tape:
      if case.whole_batch:
        outputs = tf.split(forward(module, tf.constant(inputs)), num_replicas)
      else:
        outputs = [forward(module, tf.constant(shard)) for shard in shards]
      loss = tf.add_n([_loss(output) for output in outputs]) / num_replicas
    variables = module.trainable_variables
    grads = _dense(tape.gradient(loss, variables))
    for grad, variable, slot in zip(grads, variables, slots):
      slot.assign(MOMENTUM * slot + grad)
      variable.assign_sub(LEARNING_RATE * slot)
    return outputs, grads, loss

  if jit_compile:  # eagerly otherwise: a trace costs more than the steps
    step = tf.function(step, jit_compile=True)
  return module, slots, [step() for _ in range(STEPS)]


def _copies(variable):
  """The per-replica copies of a replicated `tf.Variable` or Keras variable."""
  inner = getattr(variable, "value", None)  # a Keras 3 variable wraps ours
  if isinstance(inner, tf.Variable) and hasattr(inner, "replicas"):
    variable = inner
  # The in-graph engine's ReplicatedVariable, or the strategy engine's
  # replica-local one: each lists its copies in replica order.
  assert isinstance(variable, replicator.ReplicatedVariable) or (
      isinstance(variable, tf.Variable) and hasattr(type(variable), "replicas")), variable
  return variable.replicas


def _distinct_values(variables):
  """Values unlike any a module starts or trains with (Sonnet's `range_like`)."""
  values = []
  for index, variable in enumerate(variables):
    count = int(np.prod(variable.shape))
    value = (np.arange(count) % 7 + index + 1).reshape(variable.shape.as_list())
    dtype = tf.as_dtype(variable.dtype).as_numpy_dtype
    values.append((value * 0.125 if np.issubdtype(dtype, np.floating) else value).astype(dtype))
  return values


def _variables_so_far(module):
  """`module.variables`, also before its first call."""
  if isinstance(module, snt.Module):  # Sonnet refuses `.variables` before a call
    return tf.Module.variables.fget(module)
  return module.variables


def _checkpointed(module):
  """What `tf.train.Checkpoint` saves of `module`: its variables but a Keras
  SeedGenerator's state, which plain Keras does not save either."""
  return [v for v in module.variables
          if not getattr(v, "path", "").endswith("seed_generator_state")]


def _kinds(variables):
  return [(tuple(v.shape), tf.as_dtype(v.dtype)) for v in variables]


def _assert_all_close(got, want, what, rtol=2e-5):
  """Equal within `rtol`, or within `rtol` of the largest magnitude in `want`
  (a gradient that is zero but for rounding: a bias before a batch norm)."""
  assert len(got) == len(want), what
  want = [np.asarray(w) for w in want]
  atol = rtol * max([np.max(np.abs(w), initial=1e-6 / rtol) for w in want])
  for index, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol,
                               err_msg=f"{what} {index}")


@pytest.mark.parametrize("case, replicator_name", _cases_by_replicator(MAIN_FAST, REPLICATORS))
def test_golden_conforms_on_every_replica(case, replicator_name, tmp_path):
  """Made lazily; outputs, mean gradients, the mean loss and two Momentum
  steps as on one device; in sync; tf.train.Checkpoint to a plain module and
  back."""
  golden = case.golden
  repl = REPLICATORS[replicator_name][0]()
  n = repl.num_replicas
  inputs = golden.inputs(GLOBAL_BATCH)
  # XLA rounds (and Sonnet's UnrolledLSTM computes) differently: the oracle
  # is compiled as the replicator compiles.
  jit_compile = _compiles_with_xla(replicator_name)
  oracle, oracle_slots, oracle_steps = _oracle(case, n, jit_compile, inputs)

  with repl.context():
    module = golden.make()
    optimizer = repl.wrap_optimizer(snt.optimizers.Momentum(LEARNING_RATE, MOMENTUM))
  # What the constructor makes (Embed's given table, a Keras layer's seed
  # state) exists now, as on one device; the rest is made by the first run.
  made_by_constructor = _kinds(_variables_so_far(case.make_plain()))
  assert _kinds(_variables_so_far(module)) == made_by_constructor

  def step_fn(x):
    with tf.GradientTape() as tape:
      output = golden.forward(module, x)
      loss = _loss(output)
    variables = module.trainable_variables
    grads = _dense(tape.gradient(loss, variables))
    optimizer.apply(grads, variables)
    return {"output": output, "grads": repl.all_mean(grads), "loss": repl.all_mean(loss)}

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(inputs).batch(
        ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True).repeat()

  for step, (want_outputs, want_grads, want_loss) in enumerate(oracle_steps):
    got = repl.run(step_fn, input_fn)
    if step == 0:  # made in the first run, as one device makes them
      assert _kinds(module.variables) == _kinds(oracle.variables)
      assert _kinds(optimizer.optimizer.variables) == _kinds(oracle_slots)
    _assert_all_close(got["output"].numpy(), [o.numpy() for o in want_outputs],
                      f"step {step}: the output of replica")
    for r in range(n):
      _assert_all_close([g[r] for g in got["grads"]], want_grads,
                        f"step {step}, replica {r}: the mean gradient of variable")
    np.testing.assert_allclose(got["loss"].numpy(), [float(want_loss)] * len(got["loss"]),
                               rtol=2e-5, err_msg=f"step {step}: the mean loss")
  _assert_all_close(module.trainable_variables, oracle.trainable_variables,
                    "after training: variable")
  _assert_all_close(optimizer.optimizer.variables, oracle_slots,
                    "after training: slot")
  repl.assert_replicas_in_sync(module.variables)
  repl.assert_replicas_in_sync(optimizer.optimizer.variables)

  # The replicated module's checkpoint restores into a plain module whose
  # variables are made after the restore, by its first call. Outside a step
  # the replicated module computes as on one device (its first copy): both
  # give one output, and a batch norm's moving averages advance alike.
  x = tf.constant(inputs)
  path = tf.train.Checkpoint(module=module).save(str(tmp_path / "replicated"))
  plain = case.make_plain()
  status = tf.train.Checkpoint(module=plain).restore(path)
  plain_output = golden.forward(plain, x)
  status.assert_consumed()
  np.testing.assert_array_equal(golden.forward(module, x).numpy(), plain_output.numpy())
  for variable, want in zip(_checkpointed(plain), _checkpointed(module)):
    np.testing.assert_array_equal(variable.numpy(), want.numpy(), err_msg=variable.name)

  # A plain module's checkpoint restores into every copy of the replicated one.
  distinct = _distinct_values(_checkpointed(plain))
  for variable, value in zip(_checkpointed(plain), distinct):
    variable.assign(value)
  path = tf.train.Checkpoint(module=plain).save(str(tmp_path / "plain"))
  tf.train.Checkpoint(module=module).restore(path).assert_consumed()
  for variable, value in zip(_checkpointed(module), distinct):
    for r, copy in enumerate(_copies(variable)):
      np.testing.assert_array_equal(copy.numpy(), value,
                                    err_msg=f"{variable.name}, replica {r}")
  np.testing.assert_array_equal(golden.forward(module, x).numpy(),
                                golden.forward(plain, x).numpy())
  repl.shutdown()


def saved_plain_module(case, inputs, tmp_path):
  """`(plain module, its distinct values, its checkpoint's path)`: a one-device
  module built eagerly, given values unlike any it starts with, and saved."""
  plain = case.make_plain()
  case.golden.forward(plain, tf.constant(inputs[:1]))  # built, eagerly
  saved = _distinct_values(_checkpointed(plain))
  for variable, value in zip(_checkpointed(plain), saved):
    variable.assign(value)
  return plain, saved, tf.train.Checkpoint(module=plain).save(str(tmp_path / "plain"))


@pytest.mark.parametrize("case, replicator_name", _cases_by_replicator(RESTORE_FAST))
def test_a_checkpoint_restored_before_the_first_run_fills_the_variables_it_makes(
    case, replicator_name, tmp_path):
  """Sonnet's `test_restore_on_create_in_replica_context`: a plain module's
  checkpoint, restored into a replicated module before the `run` that makes
  its variables, gives every copy the saved values when they are made."""
  golden = case.golden
  inputs = golden.inputs(GLOBAL_BATCH)
  plain, saved, path = saved_plain_module(case, inputs, tmp_path)

  repl = catalogue.make(replicator_name)
  n = repl.num_replicas
  with repl.context():
    module = golden.make()
  status = tf.train.Checkpoint(module=module).restore(path)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(inputs).batch(
        ctx.per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)

  output = repl.run(lambda x: golden.forward(module, x), input_fn).numpy()
  status.assert_consumed()
  # (A batch norm's step moves its moving averages on: the trainable ones.)
  for variable, value in zip(_checkpointed(module), saved):
    if variable.trainable:
      for r, copy in enumerate(_copies(variable)):
        np.testing.assert_array_equal(copy.numpy(), value,
                                      err_msg=f"{variable.name}, replica {r}")
  repl.assert_replicas_in_sync(module.variables)
  if case.whole_batch:
    want = np.split(golden.forward(plain, tf.constant(inputs)).numpy(), n)
  else:
    want = [golden.forward(plain, tf.constant(shard)).numpy()
            for shard in np.split(inputs, n)]
  _assert_all_close(output, want, "the output of replica")
  repl.shutdown()
