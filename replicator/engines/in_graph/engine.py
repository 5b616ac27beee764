"""`InGraphEngine`: the `engines.protocol.Engine` of `GpuReplicator` and
`MultiGpuReplicator`, which traces every local replica of a step into one graph."""

import logging
from typing import Any, Callable, ContextManager, Optional, Sequence

import tensorflow as tf

from replicator import errors
from replicator.engines.in_graph import creation
from replicator.engines.in_graph import generators
from replicator.engines.in_graph import interrupts
from replicator.engines import step_checks
from replicator.engines.in_graph import steps as steps_lib
from replicator.variables import replicated as variables
from replicator.inputs import fetch
from replicator.inputs import streams
from replicator.multiworker import peers as peers_lib


class InGraphEngine:
  """Runs replicated steps as one graph with every local replica in it.

  Args:
    placement: each local replica's device.
    replica_ids: each local replica's global id.
    num_replicas: replicas on every worker together.
    jit_compile: compile each step (all replicas) as one XLA computation;
      `compiled_by` says so in the errors about ops XLA lacks.
    keys: the `multiworker.cluster.CollectiveKeys` of several workers, else
      None; `peers` (their `multiworker.peers.Peers`) and `steps_completed`
      (the replicator's count, for their errors) come with it.
  """

  def __init__(self, placement: Sequence[str], replica_ids: Sequence[int],
               num_replicas: int, *, jit_compile: bool, compiled_by: str,
               keys=None, peers: Optional[peers_lib.Peers] = None,
               steps_completed: Callable[[], int] = lambda: 0):
    self._placement = tuple(placement)
    self._replica_ids = tuple(replica_ids)
    self._num_replicas = num_replicas
    self._jit_compile = jit_compile
    self._compiled_by = compiled_by
    self._keys = keys
    self._peers = peers
    self._steps_completed = steps_completed
    self.factory = creation.VariableFactory(self._placement)
    # Several workers: what the chief's initial values still have to reach.
    self._new_variables = (None if peers is None else peers_lib.NewVariables(
        peers, self.factory.created, steps_completed))
    self._steps = {}  # (step_fn, input_fn) -> CompiledStep

  @property
  def created(self):
    return self.factory.created

  def scope(self) -> ContextManager:
    return self.factory.scope()

  def iterator(self, dataset: tf.data.Dataset, for_host=None):
    del for_host  # each worker is a process of its own
    return iter(dataset)

  def run(self, step_fn: Callable, input_fn: Optional[Callable], iterator,
          element_spec, steps: int, args: Sequence[Any], *,
          count: Callable[[int], None], uneven_batches: bool):
    """As `Engine.run`; `count(ran)` is called before the handlers of a signal
    that ended the call run (`interrupts`)."""
    compiled = self._steps.get((step_fn, input_fn))
    if compiled is None:
      compiled = steps_lib.CompiledStep(
          step_fn, element_spec, devices=self._placement,
          first_replica_id=self._replica_ids[0], num_replicas=self._num_replicas,
          factory=self.factory, jit_compile=self._jit_compile, keys=self._keys,
          new_variables=self._new_variables, uneven_batches=uneven_batches)
      self._steps[(step_fn, input_fn)] = compiled
      streams.warn_if_new_each_call(step_fn, input_fn, self._steps)
    completed, outputs, status = self._run_counted(compiled, step_fn, input_fn,
                                                   iterator, steps, args, count)
    # Where the workers differ (without input, after the first step):
    ran = "no step ran" if completed == 0 else "only the first step ran, on every worker"
    why, _ = fetch.decode(int(status))
    if why is fetch.StepStatus.STEPS_DIFFER:
      raise ValueError(
          f"steps: this worker called run({errors.name_of(step_fn)}, "
          f"steps={steps}) and another worker asked for a different number of "
          f"steps, so {ran}. Every worker must call run with the same "
          "step_fn, input_fn and steps, in the same order.")
    if why is fetch.StepStatus.VARIABLES_DIFFER:
      made = peers_lib.variable_kinds(compiled.variables_differ)
      raise ValueError(
          f"repl.context(): this worker made {len(made)} variable(s) since its "
          f"last run ({peers_lib.listed(made)}) "
          "and another worker other ones, so the chief's initial values cannot "
          "be given to every worker and each keeps its own; of "
          f"run({errors.name_of(step_fn)}, steps={steps}), {ran}. Every worker "
          "must make the same variables in repl.context(), in the same order.")
    uneven = completed < steps and why is fetch.StepStatus.UNEVEN
    if uneven:
      logging.warning(
          "replicator: run(%s, %s) stopped after %d step(s): the next step's "
          "batches were not all the same size on every replica. %s",
          errors.name_of(step_fn), errors.name_of(input_fn), completed,
          errors.UNEVEN_BATCHES_FIX)
    return completed, outputs, uneven

  def _run_counted(self, compiled, step_fn, input_fn, iterator, steps: int, args,
                   count):
    """`compiled`'s `(completed, outputs, status)` for `steps` steps, counted.

    A signal ends a call of several steps between two steps (`interrupts`),
    and its handlers run once the steps are counted. Where none raises (a
    handler that only takes note), the remaining steps run in a further call,
    as Python retries a system call that a signal interrupted (PEP 475).
    `outputs` are those of the last step that ran (None if none did).
    TensorFlow's errors are explained in terms of step_fn.
    """
    completed, outputs = 0, None
    while True:
      hold = interrupts.Hold(compiled.stop_flag) if steps - completed > 1 else None
      signum = 0  # the signal that stopped the call, on this worker or another
      try:
        ran, last, status = compiled(iterator, steps - completed, args, hold)
      except step_checks.ProgramsDiffer:
        del self._steps[(step_fn, input_fn)]  # its traces' keys are the wrong ones
        raise
      except (tf.errors.OpError, ValueError, TypeError) as error:  # (a trace's too)
        op_error = isinstance(error, tf.errors.OpError)
        clearer = (step_checks.xla_unsupported(error, step_fn, self._compiled_by)
                   if op_error and self._jit_compile else None)
        if clearer is None:
          clearer = step_checks.explained(error, step_fn, input_fn, compiled.element_spec)
        if clearer is not None:
          raise clearer from error
        if op_error and self._peers is not None:
          self._peers.raise_if_lost(error, self._steps_completed())  # WorkerLost
        raise
      else:
        ran = int(ran)
        count(ran)
        why, signal = fetch.decode(int(status))
        signum = signal if why is fetch.StepStatus.INTERRUPTED else 0
      finally:
        if hold is not None:
          hold.release(also=signum)  # the signals' handlers run here
      completed, outputs = completed + ran, last if ran else outputs
      if not signum or completed == steps:
        return completed, outputs, status

  def copies(self, variable) -> Sequence[tf.Variable]:
    inner = getattr(variable, "value", None)  # a Keras 3 variable wraps ours
    if isinstance(inner, variables.ReplicatedVariable):
      variable = inner
    if not isinstance(variable, variables.ReplicatedVariable):
      raise TypeError(
          f"variables: {getattr(variable, 'name', variable)!r} is not a "
          "replicated variable; create it inside repl.context().")
    return tuple(variable.replicas)

  def random_generator(self, seed: int) -> generators.ReplicaGenerator:
    return generators.ReplicaGenerator(seed, self._replica_ids, self._num_replicas,
                                       self._placement)

  def clear(self):
    self._steps.clear()
