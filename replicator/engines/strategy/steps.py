"""A step of the strategy engine: `run(step_fn, input_fn, steps=k)` as one call.

The first call of a (step_fn, input_fn) pair traces step_fn alone once, to
make the variables it creates (`variables.VariableCreator.lifting`) and to
learn its outputs; on a stand-in strategy, step_fn is then compiled with XLA
(to HLO, not run), so that a step a TPU could not compile fails here too. The
last step's outputs leave the loop as plain tensors, one per replica: a
`PerReplica` cannot be a loop variable.
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
  """`step_fn` with one input (`element_spec`: one replica's batch, None without
  input), compiled for `strategy`, its variables made by `creator` (the engine's
  `VariableCreator`); `stand_in` and `trace_only` as `StrategyEngine` takes them."""

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
    self._traced = {}  # args signature -> (outputs, the specs of their tensor leaves)
    self._loop = tf.function(self._loop_fn, autograph=False)
    self._call_loop = calls.ConcreteCall(self._loop)

  def __call__(self, iterator, steps: int, args: Sequence[Any]):
    """`(steps completed, outputs of the last one, stacked)`."""
    args = step_args.by_reference(tuple(args))
    signature = step_args.signature(args)
    if signature not in self._traced:
      self._traced[signature] = self._trace_alone(args, creating=not self._traced)
    structure, specs = self._traced[signature]
    loop_args = (iterator, tf.constant(steps, tf.int64), args, signature)
    if self._trace_only:  # the loop traced, and zeros of the shapes the step returns
      self._loop.get_concrete_function(*loop_args)
      completed = steps
      leaves = [tuple(tf.zeros([1 if d is None else d for d in spec.shape.as_list()],
                               spec.dtype) for _ in range(self._num_local))
                for spec in specs]
    else:
      completed, leaves = self._call_loop(signature, *loop_args)
    return int(completed), step_checks.with_nones(structure, (
        step_checks.stack_over_replicas(list(per_replica), self._step_fn)
        for per_replica in leaves))

  def _call_step(self, batch, args):
    inputs = (() if batch is None else (batch,)) + tuple(step_args.dereference(args))
    return step_checks.check_outputs(step_args.converted_call(self._step_fn, *inputs),
                                     self._step_fn)

  def _trace_alone(self, args, creating: bool):
    """step_fn's outputs and their tensor leaves' specs, from a trace of it alone
    that makes its variables (the first only); on a stand-in, compiled with XLA."""
    graph = func_graph_lib.FuncGraph(f"{errors.name_of(self._step_fn)}_alone")
    made_here = self._creator.lifting() if creating else contextlib.nullcontext()
    no_creation = (contextlib.nullcontext() if creating else lifting.no_creation(
        lifting.created_where("on a later trace (run with new args)")))
    try:
      with made_here, self._strategy.scope(), graph.as_default(), \
          tf.variable_creator_scope(self._creator), no_creation, self._alone(), \
          patches.while_tracing():
        # As in a tf.function's trace, TensorFlow orders its stateful ops when it
        # ends (which the lifting of initial values reads, as the in-graph engine's).
        with auto_control_deps.AutomaticControlDependencies():
          batch = (None if self._element_spec is None else tf.nest.map_structure(
              lambda s: tf.compat.v1.placeholder(s.dtype, s.shape), self._element_spec))
          outputs = self._call_step(batch, args)
    except op_selector.UnliftableError as error:
      raise step_checks.data_dependent_initializer(error, self._step_fn) from error
    specs = [tf.TensorSpec(leaf.shape, leaf.dtype) for leaf in tf.nest.flatten(outputs)
             if leaf is not None]
    for spec in specs:
      if spec.dtype in (tf.string, tf.variant, tf.resource):
        raise TypeError(
            f"step_fn: {errors.name_of(self._step_fn)} returns a {spec.dtype.name} "
            "tensor; a TPU step returns numbers only. Return numeric tensors and "
            "turn them into text after run.")
    if self._stand_in:
      self._check_compiles(args)
    return outputs, specs

  @contextlib.contextmanager
  def _alone(self):
    """Replica 0's contexts, for a trace outside `strategy.run` (where a
    variable's handle is its first copy's), with collectives that keep shapes."""
    with tf.distribute.ReplicaContext(self._strategy, replica_id_in_sync_group=0), \
        replica_context.entered(collectives.StrategyReplica(self._num_replicas, alone=True)):
      yield

  def _check_compiles(self, args):
    """Compiles step_fn alone with XLA (to HLO), as a TPU compiles each step."""

    def step(*batch):
      with self._strategy.scope(), self._alone(), \
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
    _, specs = self._traced[signature]
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

    initial = [tuple(tf.zeros([d or 0 for d in spec.shape.as_list()], spec.dtype)
                     for _ in range(self._num_local)) for spec in specs]
    # The loop's outputs keep their rank: a batch dimension that the trace alone
    # saw fixed may be unknown in the distributed step.
    invariants = [tuple(tf.TensorShape([None] * spec.shape.rank)
                        if spec.shape.rank is not None else tf.TensorShape(None)
                        for _ in range(self._num_local)) for spec in specs]

    def body(completed, last):
      def run_step(*batch):
        with patches.while_tracing():
          results = strategy.run(replica_step, args=batch)
        return completed + 1, [tuple(strategy.experimental_local_results(leaf))
                               for leaf in results]
      if iterator is None:
        return run_step()
      batch = iterator.get_next_as_optional()
      # Out of data after `completed` steps: -(completed + 1) ends the loop.
      return tf.cond(batch.has_value(), lambda: run_step(batch.get_value()),
                     lambda: (-completed - 1, last))

    # One iteration at a time: nothing orders the draws of stateful random ops
    # (their state is in their kernels) of iterations run side by side. (A TPU's
    # XLA loop runs its iterations in order whatever this says.)
    completed, last = tf.while_loop(
        lambda completed, _: tf.logical_and(completed >= 0, completed < steps), body,
        (tf.constant(0, tf.int64), initial),
        shape_invariants=(tf.TensorShape([]), invariants), parallel_iterations=1)
    completed = tf.where(completed < 0, -completed - 1, completed)
    return completed, last
