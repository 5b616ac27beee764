"""`Replicator`: context, wrap_optimizer, run and the collectives, written once.

A subclass only chooses the mesh and the engine that runs the steps: the
in-graph engine (`engines.in_graph.engine.InGraphEngine`, XLA-compiled or not) or a
`tf.distribute` strategy's (`engines.strategy.engine.StrategyEngine`).
"""

import contextlib
import itertools
import weakref
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from replicator import errors
from replicator import optimizers
from replicator.collectives import in_step
from replicator.collectives import reduce_options
from replicator.engines.in_graph import divergence
from replicator.engines import protocol
from replicator.engines.in_graph import engine as in_graph
from replicator.inputs import positions
from replicator.inputs import streams
from replicator.mesh import Mesh
from replicator.multiworker import cluster
from replicator.multiworker import peers

ReduceOp = reduce_options.ReduceOp


class Replicator:
  """Runs a single-device step on every replica of a `Mesh`.

  Args:
    mesh: where the replicas live.
    jit_compile: compile each step (all replicas) as one XLA computation.
    all_reduce: default `AllReduceOptions` of `all_reduce` and optimizers.
    engine: what runs the steps, where not the in-graph engine (a
      `StrategyEngine`, on one worker).
  """

  def __init__(self, mesh: Mesh, *, jit_compile: bool = False,
               all_reduce: Optional[reduce_options.AllReduceOptions] = None,
               engine: Optional[protocol.Engine] = None):
    all_reduce = reduce_options.check_options(all_reduce)
    self._mesh = mesh
    self._keys = None
    self._peers = None
    self._steps_completed = 0
    if mesh.num_workers > 1:
      # Collectives wait as long as it takes; the heartbeat decides liveness.
      self._keys = cluster.CollectiveKeys(mesh.num_workers, mesh.worker_index,
                                             timeout_s=0)
      self._keys.crowded = cluster.host_is_crowded(mesh)
      self._placement = tuple(mesh.devices[r] for r in mesh.local_replica_ids)
      self._peers = peers.Peers(mesh, self._keys, self._placement[0],
                                all_reduce.timeout_s)
    else:
      self._placement = tuple(f"/device:{d}" for d in mesh.local_devices)
    self._created = next(Replicator._creation_order)
    Replicator.live.add(self)
    self._all_reduce = all_reduce
    if engine is None:
      engine = in_graph.InGraphEngine(
          self._placement, mesh.local_replica_ids, mesh.num_replicas,
          jit_compile=jit_compile, compiled_by=self._compiled_by,
          keys=self._keys, peers=self._peers,
          steps_completed=lambda: self._steps_completed)
    self._engine = engine
    self._inputs = streams.InputStreams(mesh, engine.iterator)
    self._closed = False
    if self._peers is not None:
      try:
        self._peers.join()
      except BaseException:
        self.shutdown()  # or a Checkpointer would wait on workers never joined
        raise

  live = weakref.WeakSet()  # every replicator not yet garbage collected
  # Says how steps are compiled, in errors about ops that XLA lacks.
  _compiled_by = "this replicator compiles each step as one XLA computation"
  _creation_order = itertools.count()

  # Topology.
  mesh = property(lambda self: self._mesh, doc="The `Mesh`: workers and devices.")
  num_replicas = property(lambda self: self._mesh.num_replicas,
                          doc="Replicas on every worker together.")
  num_local_replicas = property(lambda self: self._mesh.devices_per_worker,
                                doc="Replicas of this worker (one per local device).")
  num_workers = property(lambda self: self._mesh.num_workers,
                         doc="Worker processes (1 unless TF_CONFIG or `cluster` names more).")
  is_chief = property(lambda self: self._mesh.is_chief,
                      doc="Whether this is worker 0, the one that writes checkpoints and logs.")

  def init(self):
    """Kept for TF-Replicator parity: the constructor already connected."""

  def __repr__(self):
    return (f"{type(self).__name__}(num_replicas={self.num_replicas}, "
            f"num_workers={self.num_workers}, "
            f"devices={list(self._mesh.local_devices)})")

  @contextlib.contextmanager
  def context(self):
    """Variables created inside are replicated on every replica."""
    self._check_open("context")
    with self._engine.scope():
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

  def random_generator(self, seed: int):
    """A random generator that gives each replica its own stream from `seed`
    (`tf.random.Generator`'s methods, drawn in a step; a `Checkpointer` saves it)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
      raise TypeError(f"seed: expected an int, got {seed!r}.")
    return self._engine.random_generator(seed)

  # Collectives (only inside a step).
  @property
  def replica_id(self) -> tf.Tensor:
    """This replica's global id, a scalar int32 tensor."""
    return in_step.replica_id()

  def all_reduce(self, value, op=ReduceOp.SUM, *, options=None,
                 method="all_reduce"):
    """Reduces `value` (a tensor or nest) over all replicas with `op`.

    `options` (an `AllReduceOptions`) overrides the replicator's for this call,
    e.g. to compress one large reduction.
    """
    options = self._all_reduce if options is None else reduce_options.check_options(options)
    return in_step.all_reduce(value, op, options, method)

  def all_sum(self, value):
    """Inside a step: the sum of `value` (a tensor or nest) over all replicas."""
    return self.all_reduce(value, ReduceOp.SUM, method="all_sum")

  def all_mean(self, value):
    """Inside a step: the mean of `value` (a tensor or nest) over all replicas."""
    return self.all_reduce(value, ReduceOp.MEAN, method="all_mean")

  def all_max(self, value):
    """Inside a step: the elementwise maximum of `value` over all replicas."""
    return self.all_reduce(value, ReduceOp.MAX, method="all_max")

  def all_min(self, value):
    """Inside a step: the elementwise minimum of `value` over all replicas."""
    return self.all_reduce(value, ReduceOp.MIN, method="all_min")

  def reduce_scatter(self, value, op=ReduceOp.SUM):
    """Inside a step: this replica's slice of the SUM or MEAN of `value` over
    all replicas.

    Each tensor of `value` (a tensor or nest) is reduced over the replicas,
    and replica r receives rows r * k to (r + 1) * k - 1 of it (axis 0, in
    replica-id order), k its rows over `num_replicas`: axis 0 must be a
    multiple of `num_replicas`, known when the step is traced. Differentiable:
    each replica's input gets every replica's upstream slice, in replica
    order (divided by `num_replicas` for a MEAN). The sum is all_reduce's,
    without compression, and then sliced: it moves an all-reduce's bytes.

    Args:
      value: a tensor or a nest of tensors (numbers; integers with SUM).
      op: `ReduceOp.SUM` or `ReduceOp.MEAN`.
    """
    return in_step.reduce_scatter(value, op)

  def all_gather(self, value, axis: int = 0):
    """Inside a step: every replica's `value` concatenated along `axis`, in
    replica-id order (the same result on every replica)."""
    return in_step.all_gather(value, axis)

  def broadcast(self, value, source_replica: int = 0):
    """Inside a step: replica `source_replica`'s `value`, on every replica."""
    return in_step.broadcast(value, source_replica)

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
    if (isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or
        not 1 <= steps <= 2**63 - 1):
      raise ValueError(
          f"steps: expected an int in [1, 2**63 - 1] (the compiled loop counts "
          f"steps in an int64), got {steps!r}. Pass the number of steps to run.")
    if not isinstance(args, (tuple, list)):
      raise TypeError(f"args: expected a tuple of step_fn arguments, got {args!r}.")
    iterator, element_spec = self._inputs.get(input_fn, self._check_dataset)

    def count(ran: int):  # the replicator's steps, and input_fn's position
      self._steps_completed += ran
      if input_fn is not None:
        self._inputs.count_steps(input_fn, ran)

    completed, outputs, uneven = self._engine.run(
        step_fn, input_fn, iterator, element_spec, int(steps), args, count=count,
        uneven_batches=self._inputs.allows_uneven_batches(input_fn))
    if completed < steps:
      raise errors.InputExhausted(completed, outputs if completed else None,
                                   uneven_batches=uneven)
    return outputs

  def _replicated_variables(self):
    """Every variable made in `context()` or in a step, in creation order."""
    return self._engine.created

  def _across_workers(self, values, merge_op: str) -> np.ndarray:
    """`values` (int64s) merged over the workers with `merge_op`, eagerly.

    Every worker must call it, in the same order (as `Checkpointer` does).
    """
    return self._peers.merge(values, merge_op, self._steps_completed)

  def _check_dataset(self, dataset, input_fn):
    """Hook for subclasses that need stricter datasets (TPU: static shapes)."""

  def input_positions(self) -> dict:
    """Steps taken from each input since it started (what a checkpoint keeps)."""
    return self._inputs.positions()

  def resume_inputs(self, saved: positions.SavedPositions) -> None:
    """Makes each input start after the steps a checkpoint recorded.

    This replicator claims the record of `saved` (shared by every replicator
    the checkpoint is restored into) that names the first input it runs
    afterwards. Inputs started before the restore start again at their next
    use, from the checkpoint's position (the beginning if it has none).
    """
    self._inputs.resume(saved)

  def reset_input(self, input_fn: Callable):
    """Starts `input_fn`'s data again from the beginning (calls it anew)."""
    self._check_open("reset_input")
    self._inputs.reset(input_fn, self._check_dataset)

  def assert_replicas_in_sync(self, variables_to_check):
    """Raises `ReplicasDiverged` naming the first variable whose copies differ."""
    divergence.assert_in_sync(variables_to_check, self._mesh.local_replica_ids,
                              self._engine.copies)

  def shutdown(self):
    """Releases the devices; idempotent. `run` afterwards raises."""
    self._closed = True
    if self._peers is not None:
      self._peers.stop()
    self._engine.clear()
    self._inputs.clear()

  def _check_open(self, method):
    if self._closed:
      raise RuntimeError(
          f"{method}: this {type(self).__name__} was shut down; create a new "
          "replicator to run more steps.")

