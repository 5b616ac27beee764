"""A step of the strategy engine: `run(step_fn, input_fn, steps=k)` as one call.

The first call of a (step_fn, input_fn) pair traces step_fn alone once, to
make the variables it creates (`variables.VariableCreator.lifting`) and to
learn its outputs; on a stand-in strategy, step_fn is then compiled with XLA
(to HLO, not run), so that a step a TPU could not compile fails here too.
The loop is a `tf.function`: each of its k iterations takes one batch per
replica from the distributed iterator (`get_next_as_optional`, so running out
of data ends the loop between steps) and runs `strategy.run`. What the last
step returned travels out of the loop as plain tensors, one per replica
(`experimental_local_results`): a `PerReplica` cannot be a loop variable.
"""

import contextlib
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.framework import auto_control_deps
from tensorflow.python.framework import func_graph as func_graph_lib
from tensorflow.python.ops import op_selector

from replicator import errors
from replicator.collectives import replica_context
from replicator.variables import lifting
from replicator.engines import calls
from replicator.engines import step_args
from replicator.engines import step_checks
from replicator.patches import registry as patches
from replicator.engines.strategy import collectives


class StrategyStep:
  """`step_fn` with one input, compiled for a `tf.distribute` strategy.

  Args:
    step_fn: the user's step.
    element_spec: one replica's batch (None without input).
    strategy: the strategy that runs it.
    creator: the engine's `VariableCreator`.
    stand_in: the strategy stands in for a TPU's: compile step_fn with XLA
      before its first run, as a TPU does, and trace the tf.functions it
      calls inline in each replica's trace.
    trace_only: trace the call (its loop, `strategy.run` and all they hold)
      but do not run it: the outputs are zeros of the traced shapes and
      every call completes its `steps`.
  """

  def __init__(self, step_fn: Callable, element_spec, strategy, creator,
               stand_in: bool, trace_only: bool = False):
    self._step_fn = step_fn
    self._element_spec = element_spec
    self._strategy = strategy
    self._creator = creator
    self._stand_in = stand_in
    self._trace_only = trace_only
    self._num_replicas = strategy.num_replicas_in_sync
    self._num_local = len(strategy.extended.worker_devices)
    self._traced = {}  # args signature -> flat output specs (None for None leaves)
    self._loop = tf.function(self._loop_fn, autograph=False)
    self._call_loop = calls.ConcreteCall(self._loop)

  def __call__(self, iterator, steps: int, args: Sequence[Any]):
    """`(steps completed, outputs of the last one, stacked)`."""
    args = step_args.by_reference(tuple(args))
    signature = step_args.signature(args)
    if signature not in self._traced:
      self._traced[signature] = self._trace_alone(args, creating=not self._traced)
    structure, specs = self._traced[signature]
    if self._trace_only:
      completed, leaves = self._traced_only(iterator, steps, args, signature)
    else:
      completed, leaves = self._call_loop(signature, iterator,
                                          tf.constant(steps, tf.int64), args, signature)
    stacked = iter(step_checks.stack_over_replicas(list(per_replica), self._step_fn)
                   for per_replica in leaves)
    outputs = tf.nest.pack_sequence_as(
        structure, [None if spec is None else next(stacked) for spec in specs])
    return int(completed), outputs

  def _traced_only(self, iterator, steps, args, signature):
    """The loop traced for `steps`, and zeros of the shapes the step returns."""
    self._loop.get_concrete_function(iterator, tf.constant(steps, tf.int64), args,
                                     signature)
    _, specs = self._traced[signature]
    leaves = [tuple(tf.zeros([1 if d is None else d for d in spec.shape.as_list()],
                             spec.dtype) for _ in range(self._num_local))
              for spec in specs if spec is not None]
    return steps, leaves

  def _call_step(self, batch, args):
    converted = tf.__internal__.autograph.tf_convert(
        self._step_fn, tf.__internal__.autograph.control_status_ctx())
    inputs = (() if batch is None else (batch,)) + tuple(step_args.dereference(args))
    return step_checks.check_outputs(converted(*inputs), self._step_fn)

  def _trace_alone(self, args, creating: bool):
    """step_fn's output structure and leaf specs, from a trace of it alone.

    Variables it makes are made here (the first trace only); on a stand-in,
    step_fn is compiled with XLA too.
    """
    replica = collectives.StrategyReplica(self._num_replicas, alone=True)
    graph = func_graph_lib.FuncGraph(f"{errors.name_of(self._step_fn)}_alone")
    made_here = self._creator.lifting() if creating else contextlib.nullcontext()
    no_creation = (contextlib.nullcontext() if creating else lifting.no_creation(
        lifting.created_where("on a later trace (run with new args)")))
    try:
      with made_here, self._strategy.scope(), graph.as_default(), \
          tf.variable_creator_scope(self._creator), no_creation, \
          self._first_replica(), replica_context.entered(replica), \
          patches.while_tracing():
        # As in a tf.function's trace, TensorFlow orders its stateful ops when it
        # ends (which the lifting of initial values reads, as the in-graph engine's).
        with auto_control_deps.AutomaticControlDependencies():
          batch = (None if self._element_spec is None else tf.nest.map_structure(
              lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), self._element_spec))
          outputs = self._call_step(batch, args)
    except op_selector.UnliftableError as error:
      raise step_checks.data_dependent_initializer(error, self._step_fn) from error
    flat = tf.nest.flatten(outputs)
    specs = [None if leaf is None else tf.TensorSpec(leaf.shape, leaf.dtype)
             for leaf in flat]
    for spec in specs:
      if spec is not None and spec.dtype in (tf.string, tf.variant, tf.resource):
        raise TypeError(
            f"step_fn: {errors.name_of(self._step_fn)} returns a {spec.dtype.name} "
            "tensor; a TPU step returns numbers only. Return numeric tensors and "
            "turn them into text after run.")
    if self._stand_in:
      self._check_compiles(args)
    return outputs, specs

  def _first_replica(self):
    """The replica context of replica 0, for a trace outside `strategy.run`
    (where a variable's handle is its first copy's)."""
    return tf.distribute.ReplicaContext(self._strategy, replica_id_in_sync_group=0)

  def _check_compiles(self, args):
    """Compiles step_fn alone with XLA (to HLO), as a TPU compiles each step."""
    replica = collectives.StrategyReplica(self._num_replicas, alone=True)

    def step(*batch):
      with self._strategy.scope(), self._first_replica(), \
          replica_context.entered(replica), \
          lifting.no_creation(lifting.created_where("in the XLA check")):
        outputs = self._call_step(batch[0] if batch else None, args)
      return [leaf for leaf in tf.nest.flatten(outputs) if leaf is not None]

    compiled = tf.function(step, jit_compile=True, autograph=False)
    batch = (() if self._element_spec is None else
             (tf.nest.map_structure(lambda s: tf.zeros(
                 [d or 1 for d in s.shape.as_list()], s.dtype), self._element_spec),))
    try:
      with patches.while_tracing():
        compiled.experimental_get_compiler_ir(*batch)(stage="hlo")
    except (tf.errors.OpError, ValueError) as error:
      unsupported = step_checks.xla_unsupported(
          error, self._step_fn, "a TPU step is one XLA computation (the emulator "
          "compiles it the same way)")
      if unsupported is not None:
        raise unsupported from error
      raise

  def _loop_fn(self, iterator, steps, args, signature):
    structure, specs = self._traced[signature]
    del structure
    kept = [spec for spec in specs if spec is not None]
    # The stand-in traces each replica in a thread of its own, where a
    # tf.function that step_fn calls is traced for each (`patches.nested_functions`:
    # the replica's id is static there); a TPU traces the replicas once.
    replica = collectives.StrategyReplica(self._num_replicas)
    strategy = self._strategy


    def replica_step(*batch):
      if batch:  # the shapes the dataset promises (tf.distribute may relax them)
        batch = (tf.nest.map_structure(lambda t, spec: tf.ensure_shape(t, spec.shape),
                                       batch[0], self._element_spec),)
      with replica_context.entered(replica), \
          lifting.no_creation(lifting.created_where(
              "in the step traced by tf.distribute")):
        outputs = self._call_step(batch[0] if batch else None, args)
      return [leaf for leaf in tf.nest.flatten(outputs) if leaf is not None]

    def local(per_replica):
      return [tuple(strategy.experimental_local_results(leaf)) for leaf in per_replica]

    def zeros(spec):
      return tf.zeros([d or 0 for d in spec.shape.as_list()], spec.dtype)

    initial = [tuple(zeros(spec) for _ in range(self._num_local)) for spec in kept]
    # The loop's outputs keep their rank: a batch dimension that the trace alone
    # saw fixed may be unknown in the distributed step.
    invariants = [tuple(tf.TensorShape([None] * spec.shape.rank)
                        if spec.shape.rank is not None else tf.TensorShape(None)
                        for _ in range(self._num_local)) for spec in kept]

    def body(completed, last):
      if iterator is None:
        with patches.while_tracing():
          results = strategy.run(replica_step)
        return completed + 1, local(results)
      batch = iterator.get_next_as_optional()

      def run_step():
        with patches.while_tracing():
          results = strategy.run(replica_step, args=(batch.get_value(),))
        return completed + 1, local(results)

      # Out of data after `completed` steps: -(completed + 1) ends the loop.
      return tf.cond(batch.has_value(), run_step, lambda: (-completed - 1, last))

    def more(completed, last):
      del last
      return tf.logical_and(completed >= 0, completed < steps)

    # One iteration at a time: a stateful random op keeps its state in its
    # kernel, so nothing orders the draws of iterations run side by side, and
    # a step would return another step's numbers. (A TPU's XLA loop runs its
    # iterations in order whatever this says.)
    completed, last = tf.while_loop(
        more, body, (tf.constant(0, tf.int64), initial),
        shape_invariants=(tf.TensorShape([]), invariants), parallel_iterations=1)
    completed = tf.where(completed < 0, -completed - 1, completed)
    return completed, last
