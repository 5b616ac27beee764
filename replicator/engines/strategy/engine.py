"""`StrategyEngine`: the `engines.protocol.Engine` of `TpuReplicator`, which runs
its steps on a `tf.distribute` strategy."""

import contextlib
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf

from replicator.engines import step_checks
from replicator.engines.strategy import steps as steps_lib
from replicator.engines.strategy import variables


class StrategyEngine:
  """Runs replicated steps on `strategy` (a TPUStrategy, or a stand-in).

  Args:
    strategy: a `tf.distribute` strategy whose replica context has
      `all_reduce` and `all_gather` and whose variables made under
      `synchronization=ON_READ` are replica-local (Sonnet's `TpuReplicator`
      and `Replicator` are both, and Sonnet's optimizers accept them).
    stand_in: the strategy stands in for a TPU's on CPUs: each step is
      compiled with XLA before its first run (a TPU compiles it anyway), and
      the inputs are fed per replica (`iterator`).
    trace_only: each call traces the whole step (the host loop, the step,
      its collectives and merged writes) and returns zeros of the traced
      shapes instead of running it: a `TPUStrategy` over a TPU that exists
      only as metadata (`replicator.testing.tpu_engine_on_fake_tpu`).
  """

  def __init__(self, strategy, stand_in: bool, trace_only: bool = False):
    self.strategy = strategy
    self.hosts = hosts(strategy)
    self._stand_in = stand_in
    self.trace_only = trace_only
    self._creator = variables.VariableCreator()
    self._steps = {}  # (step_fn, input_fn) -> StrategyStep

  @property
  def created(self):
    return self._creator.created

  @contextlib.contextmanager
  def scope(self):
    """The strategy's scope, with this engine's variable creator."""
    with self.strategy.scope(), tf.variable_creator_scope(self._creator):
      yield

  def iterator(self, dataset: tf.data.Dataset, for_host=None):
    """A distributed iterator over `dataset` (consecutive elements to
    consecutive replicas); on several TPU hosts (a pod slice, one process
    feeding every host), over each host's dataset that `for_host` makes."""
    if self.hosts > 1:
      return iter(self.strategy.distribute_datasets_from_function(
          lambda context: self.host_dataset(for_host, context)))
    local = len(self.strategy.extended.worker_devices)
    grouped = _whole_groups(dataset, local)
    if not self._stand_in:
      return iter(self.strategy.distribute_datasets_from_function(
          lambda unused_context: grouped))
    # The stand-in gives each replica its shard of the same elements, from an
    # iterator of its own on the host, without tf.data's autotuning: deleting
    # the per-device iterators of the TPU's way (a MultiDeviceIterator) waits
    # for their autotuning threads to wake, up to minutes into a test suite.
    options = tf.data.Options()
    options.autotune.enabled = False
    grouped = grouped.with_options(options)
    return iter(self.strategy.distribute_datasets_from_function(
        lambda context: grouped.shard(local, context.input_pipeline_id),
        tf.distribute.InputOptions(
            experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
            experimental_fetch_to_device=False)))

  def host_dataset(self, for_host, context: tf.distribute.InputContext):
    """The dataset of the host `context` names, for its own cores."""
    per_host = self.strategy.num_replicas_in_sync // context.num_input_pipelines
    return _whole_groups(for_host(context.input_pipeline_id,
                                  context.num_input_pipelines, per_host), per_host)

  def run(self, step_fn: Callable, input_fn: Optional[Callable], iterator,
          element_spec, steps: int, args: Sequence[Any], *,
          count: Callable[[int], None], uneven_batches: bool):
    """As `Engine.run`; a TPU's batches are never uneven (their shapes are
    fixed), and nothing ends a call between its steps."""
    del uneven_batches  # TpuReplicator refuses datasets of unknown shapes
    step = self._steps.get((step_fn, input_fn))
    if step is None:
      step = steps_lib.StrategyStep(step_fn, element_spec, self.strategy,
                                    self._creator, self._stand_in,
                                    trace_only=self.trace_only)
      self._steps[(step_fn, input_fn)] = step
    try:
      completed, outputs = step(iterator, steps, args)
    except (tf.errors.OpError, ValueError, TypeError) as error:  # (a trace's too)
      clearer = step_checks.explained(error, step_fn, input_fn, element_spec)
      if clearer is not None:
        raise clearer from error
      raise
    count(completed)
    return completed, outputs, False

  def copies(self, variable) -> Sequence[tf.Variable]:
    inner = getattr(variable, "value", None)  # a Keras 3 variable wraps ours
    if isinstance(inner, tf.Variable) and hasattr(inner, "values"):
      variable = inner
    if not any(variable is v for v in self._creator.created):
      raise TypeError(
          f"variables: {getattr(variable, 'name', variable)!r} is not a "
          "replicated variable; create it inside repl.context().")
    return tuple(variable.values)

  def random_generator(self, seed: int) -> tf.random.Generator:
    """A generator made in the strategy's scope: each replica draws its own
    stream in a step (tf.distribute folds the replica into the key)."""
    with self.strategy.scope():
      return tf.random.Generator.from_seed(seed)

  def clear(self):
    self._steps.clear()


def hosts(strategy) -> int:
  """The TPU hosts (workers) `strategy` spans."""
  return len({d.split("/device:")[0] for d in strategy.extended.worker_devices})


def _whole_groups(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
  """`dataset` without a last group of elements too few for every replica:
  the data has run out, as on the in-graph engine (tf.distribute would give
  the replicas left over empty batches)."""
  return dataset.batch(replicas, drop_remainder=True).unbatch()
