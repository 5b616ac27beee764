"""`Replicator`: context, wrap_optimizer, run and the collectives, written once.

A subclass only chooses the mesh (and whether the step is XLA-compiled).
"""

import contextlib
import itertools
import logging
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from replicator import cluster
from replicator import collectives
from replicator import context
from replicator import inputs
from replicator import keras_compat
from replicator import nested_functions
from replicator import optimizers
from replicator import randomness
from replicator import replica_ops
from replicator import resume
from replicator import step_errors
from replicator import step_fetch
from replicator import steps as steps_lib
from replicator import variables
from replicator.mesh import Mesh

ReduceOp = collectives.ReduceOp


class ReplicasDiverged(AssertionError):
  """Raised by `assert_replicas_in_sync` when copies of a variable differ."""


class Replicator:
  """Runs a single-device step on every replica of a `Mesh`.

  Args:
    mesh: where the replicas live.
    placement: device of each local replica's ops and variables (defaults to
      the mesh's devices; TPU emulation puts every replica on the CPU).
    jit_compile: compile each step (all replicas) as one XLA computation.
    all_reduce: default `AllReduceOptions` of `all_reduce` and optimizers.
  """

  def __init__(self, mesh: Mesh, *, placement: Optional[Sequence[str]] = None,
               jit_compile: bool = False,
               all_reduce: Optional[collectives.AllReduceOptions] = None):
    all_reduce = collectives.check_options(all_reduce)
    self._mesh = mesh
    self._workers = None
    self._heartbeat = None
    self._steps_completed = 0
    if mesh.num_workers > 1:
      # Collectives wait as long as it takes; the heartbeat decides liveness.
      self._workers = cluster.CollectiveKeys(mesh.num_workers, mesh.worker_index,
                                             timeout_s=0)
      self._placement = tuple(cluster.device_name(mesh.worker_index, d)
                              for d in (placement or mesh.local_devices))
    else:
      self._placement = tuple(f"/device:{d}" for d in (placement or mesh.local_devices))
    self._synced_variables = 0
    self._consumed = {}  # input key -> steps taken from it since its start
    self._saved_positions = None  # a checkpoint's, until this replicator claims one
    self._skip = {}  # input key -> steps to skip when it starts (restored)
    self._restored = set()  # input_fns to start again at their next use
    self._input_keys = {}  # input_fn -> its key in checkpoints
    self._created = next(Replicator._creation_order)
    Replicator.live.add(self)
    self._jit_compile = jit_compile
    self._all_reduce = all_reduce
    self._factory = variables.VariableFactory(self._placement)
    self._inputs = {}  # input_fn -> (iterator, element_spec)
    self._uneven_inputs = set()  # input_fns marked by allow_uneven_batches
    self._steps = {}  # (step_fn, input_fn) -> CompiledStep
    self._closed = False
    randomness.install()
    nested_functions.install()
    keras_compat.install()
    if self._workers is not None:
      self._wait_for_workers()

  live = weakref.WeakSet()  # every replicator not yet garbage collected
  # Says how steps are compiled, in errors about ops that XLA lacks.
  _compiled_by = "this replicator compiles each step as one XLA computation"
  _creation_order = itertools.count()

  @classmethod
  def newest(cls) -> Optional["Replicator"]:
    """The most recently created replicator that is not shut down."""
    open_ = [r for r in list(cls.live) if not r._closed]  # pylint: disable=protected-access
    return max(open_, key=lambda r: r._created, default=None)  # pylint: disable=protected-access

  # Topology.
  mesh = property(lambda self: self._mesh)
  num_replicas = property(lambda self: self._mesh.num_replicas)
  num_local_replicas = property(lambda self: self._mesh.devices_per_worker)
  num_workers = property(lambda self: self._mesh.num_workers)
  is_chief = property(lambda self: self._mesh.is_chief)

  def init(self):
    """Kept for TF-Replicator parity: the constructor already connected."""

  def __repr__(self):
    return (f"{type(self).__name__}(num_replicas={self.num_replicas}, "
            f"devices={list(self._mesh.local_devices)})")

  @contextlib.contextmanager
  def context(self):
    """Variables created inside are replicated on every replica."""
    self._check_open("context")
    with self._factory.scope():
      yield self

  def wrap_optimizer(self, optimizer, *, clip_global_norm=None,
                     gradient_reduction=ReduceOp.MEAN, accumulate_steps=1,
                     all_reduce=None) -> optimizers.ReplicatedOptimizer:
    """Returns `optimizer` made replica-aware (see `ReplicatedOptimizer`).

    Gradients are averaged over replicas (`ReduceOp.MEAN`): a loss that is a
    per-replica mean gives the update of one replica on the global batch.
    **If your loss is already divided by the global batch size (as in
    tf.distribute), pass `gradient_reduction=ReduceOp.SUM`.**
    """
    return optimizers.ReplicatedOptimizer(
        optimizer, clip_global_norm=clip_global_norm,
        gradient_reduction=gradient_reduction,
        accumulate_steps=accumulate_steps,
        all_reduce=all_reduce or self._all_reduce)

  def random_generator(self, seed: int) -> randomness.ReplicaGenerator:
    """A random generator that gives each replica its own stream from `seed`."""
    return randomness.ReplicaGenerator(seed, self._mesh.local_replica_ids,
                                       self.num_replicas, self._placement)

  # Collectives (only inside a step).
  @property
  def replica_id(self) -> tf.Tensor:
    """This replica's global id, a scalar int32 tensor."""
    return replica_ops.replica_id()

  def all_reduce(self, value, op=ReduceOp.SUM, *, options=None,
                 method="all_reduce"):
    """Reduces `value` (a tensor or nest) over all replicas with `op`.

    `options` (an `AllReduceOptions`) overrides the replicator's for this call,
    e.g. to compress one large reduction.
    """
    options = self._all_reduce if options is None else collectives.check_options(options)
    return replica_ops.all_reduce(value, op, options, method)

  def all_sum(self, value):
    return self.all_reduce(value, ReduceOp.SUM, method="all_sum")

  def all_mean(self, value):
    return self.all_reduce(value, ReduceOp.MEAN, method="all_mean")

  def all_max(self, value):
    return self.all_reduce(value, ReduceOp.MAX, method="all_max")

  def all_min(self, value):
    return self.all_reduce(value, ReduceOp.MIN, method="all_min")

  def all_gather(self, value, axis: int = 0):
    return replica_ops.all_gather(value, axis)

  def broadcast(self, value, source_replica: int = 0):
    return replica_ops.broadcast(value, source_replica)

  # Running steps.
  def run(self, step_fn: Callable, input_fn: Optional[Callable] = None, *,
          args: Sequence[Any] = (), steps: int = 1):
    """Runs `steps` steps of `step_fn` on every replica in one compiled call.

    Returns what `step_fn` returned on the last step, each leaf stacked over
    this worker's replicas (leading axis in replica-id order); `None` leaves,
    and a step that returns nothing, come back as `None`. Raises
    `InputExhausted` when `input_fn`'s data ran out before `steps` steps.
    """
    self._check_open("run")
    if not tf.executing_eagerly():
      raise RuntimeError(
          "run: called inside a tf.function (or a graph). run compiles the steps "
          "itself and is called from plain Python: remove the tf.function around "
          "it, and pass steps=k to run k steps in one compiled call.")
    if not callable(step_fn):
      raise TypeError(f"step_fn: expected a callable, got {step_fn!r}.")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
      raise ValueError(f"steps: expected an int >= 1, got {steps!r}.")
    if not isinstance(args, (tuple, list)):
      raise TypeError(f"args: expected a tuple of step_fn arguments, got {args!r}.")
    iterator, element_spec = self._input(input_fn)
    try:
      self._sync_new_variables()
    except tf.errors.OpError as error:
      self._raise_if_worker_lost(error)
      raise
    compiled = self._steps.get((step_fn, input_fn))
    if compiled is None:
      keras_compat.install()  # Keras may have been imported since the constructor
      compiled = steps_lib.CompiledStep(
          step_fn, element_spec, devices=self._placement,
          first_replica_id=self._mesh.local_replica_ids[0],
          num_replicas=self.num_replicas, factory=self._factory,
          jit_compile=self._jit_compile, workers=self._workers,
          on_variables_created=self._sync_new_variables,
          uneven_batches=input_fn in self._uneven_inputs)
      self._steps[(step_fn, input_fn)] = compiled
      self._warn_if_input_fn_is_new_each_call(step_fn, input_fn)
    try:
      completed, outputs, status = compiled(iterator, int(steps), args)
    except step_errors.ProgramsDiffer:
      del self._steps[(step_fn, input_fn)]  # its traces' keys are the wrong ones
      raise
    except tf.errors.OpError as error:
      unsupported = (step_errors.xla_unsupported(error, step_fn, self._compiled_by)
                     if self._jit_compile else None)
      if unsupported is not None:
        raise unsupported from error
      shapes = step_errors.output_shape_error(error, step_fn)
      if shapes is not None:
        raise shapes from error
      self._raise_if_worker_lost(error)
      raise
    completed = int(completed)
    self._steps_completed += completed
    if input_fn is not None:
      key = self._input_key(input_fn)
      self._consumed[key] = self._consumed.get(key, 0) + completed
    if completed < steps:
      if int(status) == step_fetch.STEPS_DIFFER:
        raise ValueError(
            f"steps: this worker called run({getattr(step_fn, '__name__', step_fn)}, "
            f"steps={steps}) and another worker asked for a different number of "
            "steps, so no step ran. Every worker must call run with the same "
            "step_fn, input_fn and steps, in the same order.")
      uneven = int(status) == step_fetch.UNEVEN
      if uneven:
        logging.warning(
            "replicator: run(%s, %s) stopped after %d step(s): the next step's "
            "batches were not all the same size on every replica. %s",
            getattr(step_fn, "__name__", step_fn),
            getattr(input_fn, "__name__", input_fn), completed,
            context.UNEVEN_BATCHES_FIX)
      raise context.InputExhausted(completed, outputs if completed else None,
                                   uneven_batches=uneven)
    return outputs

  def _warn_if_input_fn_is_new_each_call(self, step_fn, input_fn):
    """A new `input_fn` object per call restarts the data: say so, once."""
    if input_fn is None:
      return
    count = sum(1 for s, i in self._steps if s is step_fn and i is not None)
    if count == 3:
      logging.warning(
          "replicator: run(%s, input_fn) got a third different input_fn object. "
          "Each new input_fn (for example a lambda written inside the training "
          "loop) is a new input that starts from its first batch, and compiles "
          "the step again. Define input_fn once, outside the loop, unless you "
          "mean to restart the data (reset_input does that).",
          getattr(step_fn, "__name__", step_fn))

  def _wait_for_workers(self):
    """Returns once every worker has started, then watches them.

    Workers start minutes apart on a busy cluster (and imports alone take tens
    of seconds), so each waits for the others' servers up to 10 x
    `AllReduceOptions.timeout_s`, then raises naming those still missing.
    """
    join_timeout_s = 10 * self._all_reduce.timeout_s
    missing = cluster.unjoined_peers(self._mesh, join_timeout_s)
    if missing:
      names = ", ".join(f"{w} ({self._mesh.worker_addresses[w]})" for w in missing)
      raise TimeoutError(
          f"cluster: worker {self._mesh.worker_index} waited {join_timeout_s:g} s "
          f"(10 x AllReduceOptions.timeout_s) and worker(s) {names} did not join. "
          "Start every worker of TF_CONFIG's cluster (python -m replicator.launch "
          "starts local ones), check that it did not fail before creating its "
          "replicator, or raise AllReduceOptions(timeout_s=...) for slow starts.")
    self._heartbeat = cluster.Heartbeat(self._mesh, self._all_reduce.timeout_s / 2)
    self._across_workers([1], "Add")  # after it, every worker's runtime is ready

  def _across_workers(self, values, merge_op: str) -> np.ndarray:
    """`values` (int64s) merged over the workers with `merge_op`, eagerly.

    Every worker must call it, in the same order (as `Checkpointer` does).
    """
    try:
      with tf.device(self._placement[0]):
        return collectives.across_workers(
            tf.constant(values, tf.int64), merge_op, self._workers).numpy()
    except tf.errors.OpError as error:
      self._raise_if_worker_lost(error)
      raise

  def _raise_if_worker_lost(self, error):
    """Raises `WorkerLost` for `error` if a worker is gone.

    Gone: the heartbeat saw it, or a peer fails a health check now (the error
    may come before the heartbeat's next look). Any other error (a failed
    check_numerics on every worker, say) is the step's own: the caller
    re-raises it.
    """
    if self._workers is None:
      return
    worker = self._heartbeat.lost if self._heartbeat else None
    if worker is None:
      worker = cluster.first_unhealthy_peer(
          self._mesh, timeout_s=min(5.0, self._all_reduce.timeout_s))
      if worker is None:
        return
    raise cluster.WorkerLost(worker, self._steps_completed,
                             self._mesh.worker_addresses[worker],
                             type(error).__name__) from error

  def _sync_new_variables(self):
    """Gives every worker the chief's initial values of new variables."""
    new = self._factory.created[self._synced_variables:]
    self._synced_variables = len(self._factory.created)
    if self._workers is None or not new:
      return
    chief = self._mesh.is_chief

    @tf.function(autograph=False)
    def sync():
      for variable in new:
        with tf.device(self._placement[0]):
          value = variable.replicas[0].read_value()
          wire = tf.int32 if value.dtype.is_bool else value.dtype
          value = tf.cast(value, wire) if chief else tf.zeros_like(value, wire)
          value = tf.cast(collectives.across_workers(value, "Add", self._workers),
                          variable.dtype)
        for copy in variable.replicas:
          copy.assign(value)

    sync()

  def _input_key(self, input_fn) -> str:
    """A name for `input_fn` that is stable across restarts of the same script.

    Its qualified name and closure constants (`resume.input_name`), numbered
    in order of first use, with a warning, when several inputs share one.
    """
    if input_fn not in self._input_keys:
      name = resume.input_name(input_fn)
      taken = set(self._input_keys.values())
      key, number = name, 1
      while key in taken:
        number += 1
        key = f"{name}#{number}"
      if number == 2:
        resume.warn_indistinct(name)
      self._input_keys[input_fn] = key
    return self._input_keys[input_fn]

  def _input(self, input_fn):
    if input_fn is None:
      return None, None
    if input_fn in self._restored:  # started before a restore: start it again
      self._restored.discard(input_fn)
      self._inputs[input_fn] = self._make_input(input_fn, self._inputs[input_fn][1])
    elif input_fn not in self._inputs:
      self._inputs[input_fn] = self._make_input(input_fn)
    return self._inputs[input_fn]

  def _make_input(self, input_fn, expected_spec=None):
    if not callable(input_fn):
      raise TypeError(f"input_fn: expected a callable, got {input_fn!r}.")
    ctx = context.InputContext(
        num_input_pipelines=self.num_workers,
        input_pipeline_id=self._mesh.worker_index,
        num_replicas_in_sync=self.num_replicas)
    dataset = input_fn(ctx)
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(
          f"input_fn: {getattr(input_fn, '__name__', input_fn)} returned "
          f"{type(dataset).__name__}, expected a tf.data.Dataset of per-replica "
          "batches (e.g. ds.batch(ctx.per_replica_batch_size(GLOBAL_BATCH))).")
    self._check_dataset(dataset, input_fn)
    if inputs.allows_uneven_batches(dataset):
      self._uneven_inputs.add(input_fn)
    key = self._input_key(input_fn)
    self._claim_saved_positions(key)
    skip = self._skip.pop(key, 0)
    if skip:  # resuming: each step took one element per local replica
      dataset = dataset.skip(skip * self.num_local_replicas)
      self._consumed[self._input_key(input_fn)] = skip
    if expected_spec is not None and dataset.element_spec != expected_spec:
      raise ValueError(
          f"input_fn: the dataset's element structure changed from "
          f"{expected_spec} to {dataset.element_spec}; the compiled step "
          "expects the first. Return the same structure on every call.")
    with tf.device("/device:CPU:0"):
      return iter(dataset), dataset.element_spec

  def _check_dataset(self, dataset, input_fn):
    """Hook for subclasses that need stricter datasets (TPU: static shapes)."""

  def input_positions(self) -> dict:
    """Steps taken from each input since it started (what a checkpoint keeps)."""
    return dict(self._consumed)

  def resume_inputs(self, saved: resume.SavedPositions) -> None:
    """Makes each input start after the steps a checkpoint recorded.

    `saved` is shared by every replicator the checkpoint is restored into;
    this one claims the record of the first input it runs afterwards that a
    record names (`SavedPositions.claim`), so each replicator resumes the
    inputs it runs. Inputs started before the restore start again at their
    next use, from the checkpoint's position (the beginning if it has none).
    Exact when the record's topology is this job's and the input is
    deterministic; otherwise the same number of steps is skipped and a
    warning says so.
    """
    self._saved_positions, self._skip, self._consumed = saved, {}, {}
    self._restored = set(self._inputs)

  def _claim_saved_positions(self, key: str):
    """Takes the checkpoint's record that names input `key`, if none is taken."""
    if self._saved_positions is None:
      return
    record = self._saved_positions.claim(
        key, (self.num_workers, self.num_local_replicas))
    if record is not None:
      self._saved_positions, self._skip = None, dict(record["inputs"])

  def reset_input(self, input_fn: Callable):
    """Starts `input_fn`'s data again from the beginning (calls it anew)."""
    self._check_open("reset_input")
    self._consumed.pop(self._input_key(input_fn), None)
    self._restored.discard(input_fn)
    previous = self._inputs.get(input_fn)
    self._inputs[input_fn] = self._make_input(
        input_fn, previous[1] if previous else None)

  def assert_replicas_in_sync(self, variables_to_check):
    """Raises `ReplicasDiverged` naming the first variable whose copies differ."""
    for variable in tf.nest.flatten(variables_to_check):
      inner = getattr(variable, "value", None)  # a Keras 3 variable wraps ours
      if isinstance(inner, variables.ReplicatedVariable):
        variable = inner
      if not isinstance(variable, variables.ReplicatedVariable):
        raise TypeError(
            f"variables: {getattr(variable, 'name', variable)!r} is not a "
            "replicated variable; create it inside repl.context().")
      sums = [_checksum(copy) for copy in variable.replicas]
      for r, value in enumerate(sums[1:], start=1):
        if value != sums[0]:
          raise ReplicasDiverged(
              f"Variable {variable.name!r} differs between replica "
              f"{self._mesh.local_replica_ids[0]} and replica "
              f"{self._mesh.local_replica_ids[r]} (checksums {sums[0]} vs "
              f"{value}).")

  def shutdown(self):
    """Releases the devices; idempotent. `run` afterwards raises."""
    self._closed = True
    if self._heartbeat is not None:
      self._heartbeat.stop()
    self._steps.clear()
    self._inputs.clear()

  def _check_open(self, method):
    if self._closed:
      raise RuntimeError(
          f"{method}: this {type(self).__name__} was shut down; create a new "
          "replicator to run more steps.")


def _checksum(variable) -> int:
  """A position-weighted sum of the raw bits of `variable`, on its device."""
  with tf.device(variable.device):
    value = tf.reshape(variable.read_value(), [-1])
    if value.dtype.is_bool:
      value = tf.cast(value, tf.uint8)
    bits = {1: tf.uint8, 2: tf.uint16, 4: tf.uint32, 8: tf.uint64}[value.dtype.size]
    words = tf.cast(tf.bitcast(value, bits), tf.int64) if value.dtype != bits else tf.cast(value, tf.int64)
    weights = tf.range(1, tf.size(words, out_type=tf.int64) + 1) % 65521 + 1
    return int(tf.reduce_sum(words * weights))
