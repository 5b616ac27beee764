"""A compiled step: `steps` iterations of step_fn on every replica, one call.

The replicated step is traced first, on its own, replica 0 with a variable
factory (`creation`: variables step_fn makes are made outside the trace and
initialized from the initializers it computed); the one-step function and the
loop reuse that trace, and later traces may not create variables. On several
workers the traced collectives are compared (`step_checks.check_same_program`)
before the chief's initial values go to every worker.
"""

import contextlib
import functools
from typing import Any, Callable, Sequence

import tensorflow as tf
from tensorflow.python.ops import op_selector

from replicator.variables import deferred
from replicator.collectives import replica_context
from replicator.engines import calls
from replicator.engines import step_args
from replicator.patches import registry as patches
from replicator.engines import step_checks
from replicator.inputs import fetch
from replicator.variables import lifting
from replicator.engines.in_graph import creation
from replicator.engines.in_graph import effects
from replicator.engines.in_graph import interrupts


class _Traced:
  """What one trace of step_fn (one signature of its `args`) found."""

  def __init__(self, output_spec, draws_random: bool):
    self.output_spec = output_spec  # step_fn's outputs, None leaves included
    # the leaves that are tensors, in flat order
    self.tensor_specs = tuple(spec for spec in tf.nest.flatten(output_spec)
                              if spec is not None)
    self.draws_random = draws_random  # whether step_fn has stateful random ops
    # On several workers, with input: the instance keys of the first fetch's
    # collective, which the one-step function and the loop share
    # (`CompiledStep._first_collective`).
    self.first_keys = None


class CompiledStep:
  """The loop for one `(step_fn, input_fn)` pair on one replicator."""

  def __init__(self, step_fn: Callable, element_spec, *, devices: Sequence[str],
               first_replica_id: int, num_replicas: int,
               factory: creation.VariableFactory, jit_compile: bool,
               keys=None, new_variables=None, uneven_batches: bool = False):
    self._step_fn = step_fn
    self.element_spec = element_spec
    # what the traces see: dims that differ between workers are unknown
    self._traced_spec = fetch.agreed_element_spec(element_spec, keys, devices[0])
    self._devices = tuple(devices)
    self._first_replica_id = first_replica_id
    self._num_replicas = num_replicas
    self._factory = factory
    self._keys = keys
    # A `multiworker.peers.NewVariables`, given with `keys`.
    self._new_variables = new_variables
    self._python_numbers = step_args.PythonNumbers(step_fn)
    self._fetcher = fetch.BatchFetcher(self._devices, num_replicas, keys,
                                       uneven_batches)
    self._traced = {}  # signature of args -> _Traced
    self._creating = False  # while the real step is traced first (`_trace_first`)
    self._traced_output_spec = None  # step_fn's outputs in the last `_trace_step`
    self._current = None  # the _Traced of the call being run
    # What the last call's VARIABLES_DIFFER left unsent: this worker's pending
    # variables (repl.context()), for `Replicator.run`'s error.
    self.variables_differ = []
    self._no_pending = tf.constant(0, tf.int64)  # the loop's `pending` on most calls
    self._gate = effects.Gate()  # (`_trace_single`)
    self.stop_flag = interrupts.StopFlag()  # what the loop reads before each next step
    self._loop = tf.function(self._trace_loop, autograph=False)
    self._single = calls.ConcreteCall(tf.function(self._trace_single, autograph=False))
    self._call_loop = calls.ConcreteCall(self._loop)
    # A function of its own even without XLA: Grappler then optimizes the step
    # as one graph (inlined into the loop's `cond`, a GAN step runs slower).
    self._replicated_step = tf.function(self._trace_step, autograph=False,
                                        jit_compile=jit_compile)

  def __call__(self, iterator, steps: int, args: Sequence[Any], hold=None):
    self._python_numbers.warn_if_changed(args)
    args = step_args.by_reference(tuple(args))
    signature = step_args.signature(args)
    new = signature not in self._traced
    if new:  # step_fn's outputs may depend on args
      issued = self._keys.issued if self._keys is not None else 0
      self._traced[signature] = self._trace_first(iterator, args, creating=not self._traced)
    self._current = self._traced[signature]
    pending = 0  # the digest of variables to send after the call (none)
    # One step runs without the loop's overhead, unless it draws random numbers
    # (one stream advances whatever `steps` a call asks for); on several workers
    # only with input, where both compare `steps` in their first fetch, under one
    # key (`_first_collective`). Without input the loop's first step runs beside
    # that comparison, inside the loop, whose collectives pair only with its own.
    single = (steps == 1 and not self._current.draws_random
              and (self._keys is None or iterator is not None))
    if new:
      self._ready(signature, iterator, steps, args, issued, single)
    if not new and self._new_variables is not None:  # made in repl.context() since the last run
      # This step was traced before they existed, so it cannot use them: the
      # first collective's comparison of `steps` also compares them, and they
      # travel after the call, only where every worker made the same (else the
      # workers that made none would never join the collectives that send them).
      pending = self._new_variables.digest()
    pending = tf.constant(pending, tf.int64) if pending else self._no_pending
    if single:
      try:
        completed, tensors, status = self._single(signature, iterator, args, pending)
      except tf.errors.OutOfRangeError as error:
        if effects.RAN_OUT not in (error.message or ""):
          raise  # step_fn's own
        completed, tensors, status = 0, self._initial_outputs(), self._gate.why()
    else:
      loop_args = (iterator, tf.constant(steps, tf.int64), args, pending)
      if hold is not None:  # started once the loop is traced: until then, a signal
        # raises at once (no step has run).
        self._call_loop.prepare(signature, *loop_args)
        hold.start()
      completed, tensors, status = self._call_loop(signature, *loop_args)
    if self._new_variables is not None and self._new_variables.pending():
      why, _ = fetch.decode(int(status))
      if why is fetch.StepStatus.VARIABLES_DIFFER:
        self.variables_differ = self._new_variables.keep_each_workers()
      elif why is not fetch.StepStatus.STEPS_DIFFER:
        self._new_variables.send()
    return completed, step_checks.with_nones(self._current.output_spec, tensors), status

  def _ready(self, signature, iterator, steps, args, issued: int, single: bool):
    """A signature's first call, after its trace: the function that runs is traced
    (the programs compared) while the new variables get their initial values;
    they are waited for, then on several workers the chief's are sent."""
    try:
      try:
        if self._keys is not None:
          self._check_program(signature, iterator, steps, args, issued)
        else:
          self._prepare(signature, iterator, steps, args, single)
      finally:
        try:
          self._factory.ready()
        except BaseException:
          del self._traced[signature]  # its variables hold no values: traced anew
          raise
      if self._keys is not None:
        self._new_variables.send()
    except BaseException:
      self._factory.initialize_left()  # the chief's values did not all come
      raise
    self._factory.initialize_left(sent=True)

  def _check_program(self, signature, iterator, steps, args, issued: int):
    """On several workers, a signature's first call: traces the function whose
    keys are counted (whatever `steps` this worker asked for, so that the keys
    of later traces match everywhere; a loop traced later, where a worker first
    asks for several steps, counts none), then compares the workers' programs.

    The chief's initial values (of those made in repl.context() since the last
    run too) travel after the check, in collectives whose keys follow the
    step's, which workers that traced other programs share only once the check
    has realigned them; never where the variables differ (there would be a
    collective too many, or of another shape).
    """
    self._prepare(signature, iterator, steps, args, single=iterator is not None)
    try:
      step_checks.check_same_program(self._step_fn, self._keys, self._devices[0],
                                     issued, self._new_variables.pending())
    except step_checks.ProgramsDiffer as error:
      self._factory.ready()
      if error.variables_differ:
        self._new_variables.keep_each_workers()
      else:
        self._new_variables.send()
      raise

  def _prepare(self, signature, iterator, steps, args, single: bool):
    """Traces the one-step function (`single`) or the loop, without running it."""
    if single:
      self._single.prepare(signature, iterator, args, self._no_pending)
    else:
      self._call_loop.prepare(signature, iterator, tf.constant(steps, tf.int64), args,
                              self._no_pending)

  @contextlib.contextmanager
  def _first_collective(self):
    """Around the one-step function's first fetch, on several workers: its
    keys, which the loop takes again for its own (`_trace_loop`)."""
    if self._keys is None:
      yield
      return
    with self._keys.recorded() as keys:
      yield
    self._current.first_keys = keys

  def _replica_scope(self, creating: bool):
    summaries = effects.summary_state()

    @contextlib.contextmanager
    def scope(r):
      # Replica 0's too: Grappler rewrites by name; replicas named alike round alike.
      with tf.device(self._devices[r]), tf.name_scope(f"replica_{r}"), \
          effects.summaries(summaries, records=self._first_replica_id + r == 0):
        if creating and r == 0:  # the first replica makes the variables for all
          with self._factory.scope():
            yield
        else:
          explain = (functools.partial(step_checks.created_on_another_replica,
                                       self._first_replica_id + r, self._first_replica_id)
                     if creating else lifting.created_where("after its first run"))
          with lifting.no_creation(explain):
            yield
    return scope

  def _trace_first(self, iterator, args, creating: bool) -> _Traced:
    """The real step, traced before the loop, finding the outputs.

    The first (`creating`) also creates the variables that step_fn makes, on
    replica 0: the replicas are traced in lockstep, replica 0 first, so the
    others find them made (their copies are filled after the trace).
    """
    n = len(self._devices)
    batches = [None] * n if iterator is None else [(iterator.element_spec,)] * n
    self._creating = creating
    try:
      while True:
        with self._factory.creating(background=True, left_to_chief=getattr(
            self._new_variables, "left_to_chief", False)) if creating \
            else contextlib.nullcontext(set()) as initializers:
          try:
            concrete = self._replicated_step.get_concrete_function(batches, args, effects.GATE_SPEC)
            break
          except deferred.MergeAtWrite as read:
            # Again, merging these where they are written (deferred.StepWrites);
            # the variables the first trace made are made (`creating` fills them).
            for variable in read.variables:
              variable._merge_at_write = True  # pylint: disable=protected-access
    except op_selector.UnliftableError as error:
      raise step_checks.data_dependent_initializer(error, self._step_fn) from error
    finally:
      self._creating = False
    return _Traced(self._traced_output_spec,
                   effects.draws_from_kernel_state(concrete.graph, initializers))

  def _trace_step(self, batches, args, gate):
    """Every replica's step; nothing of it that has effects runs before `gate`
    (an int64 scalar: `_trace_single`'s raises where the data ran out)."""
    args = step_args.dereference(args)
    per_replica = [((fetch.relaxed(b[0], self._traced_spec),) if b is not None
                    else ()) + tuple(args) for b in batches]
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    group = replica_context.ReplicaGroup(self._devices, self._first_replica_id,
                                         self._num_replicas, keys=self._keys,
                                         trace=deferred.StepWrites())
    with patches.while_tracing():
      outputs = group.run(functools.partial(step_args.converted_call, self._step_fn),
                          per_replica, self._replica_scope(creating=self._creating))
    effects.hold_effects(graph.get_operations()[before:], gate)
    outputs = [step_checks.check_outputs(o, self._step_fn) for o in outputs]
    self._traced_output_spec = tf.nest.map_structure(
        lambda t: None if t is None else tf.TensorSpec(t.shape, t.dtype), outputs[0])
    step_checks.check_writes(graph, len(self._devices), self._num_replicas,
                             group.trace.library)
    return tuple(step_checks.stack_over_replicas(xs, self._step_fn)
                 for xs in zip(*map(tf.nest.flatten, outputs)) if xs[0] is not None)

  def _initial_outputs(self):
    n = len(self._devices)

    def zeros(spec):  # of any shape where the rank is unknown (tf.py_function's outputs)
      dims = [] if spec.shape.rank is None else spec.shape.as_list()
      return tf.zeros([n] + [d or 0 for d in dims], spec.dtype)
    return tuple(zeros(spec) for spec in self._current.tensor_specs)

  def _trace_single(self, iterator, args, pending):
    """One step, behind a gate that its ops with effects wait for
    (`effects.hold_effects`) and that raises `OutOfRangeError`, keeping the
    fetch's status, where the step may not run (caught in `__call__`). Unlike
    a `tf.cond`, it needs no `Switch` for each variable (fewer nodes for
    Grappler), and an OutOfRange is the error TensorFlow logs least. Its result
    is the loop's for `steps=1`.
    """
    n = len(self._devices)
    if iterator is None:  # (alone: on several workers the loop runs it)
      outputs = self._replicated_step([None] * n, args, effects.open_gate())
      status = fetch.status_tensor(fetch.StepStatus.READY)
    else:
      compared = {} if self._keys is None else dict(
          steps=tf.constant(1, tf.int64), pending=pending, signum=self.stop_flag.signal())
      with self._first_collective():
        optionals, status = self._fetcher.fetch(iterator, **compared)
      gate = self._gate(status)
      with tf.control_dependencies([gate]):  # (the batches wait too)
        batches = [(o.get_value(),) for o in optionals]
      outputs = self._replicated_step(batches, args, gate)
      status = fetch.status_tensor(fetch.StepStatus.DONE)
    step_checks.check_variables(tf.compat.v1.get_default_graph(), len(self._devices))
    return tf.constant(1, tf.int64), outputs, status

  def _trace_loop(self, iterator, steps, args, pending):
    """See `_while_loop`. On several workers, with input, its first fetch
    takes the one-step function's keys, and its other collectives keys derived
    from them, so that workers pair them whenever each traced it
    (`CollectiveKeys.replaying`); both fetch outside any `tf.while_loop`, where
    collectives pair only with those of the same loop."""
    if self._keys is None or iterator is None:
      return self._while_loop(iterator, steps, args, pending)
    with self._keys.replaying(self._current.first_keys):
      return self._while_loop(iterator, steps, args, pending)

  def _while_loop(self, iterator, steps, args, pending):
    """`steps` steps in a `tf.while_loop`, stopping early when data runs out.

    The next step's batches are fetched at the end of each iteration (only if
    a step is due: no element is lost) and carried into the next as optionals:
    the condition sees whether they arrived, and the step runs without a `cond`
    (which would switch every variable it touches, on every replica, per step).
    Returns `(completed, outputs, status)`: why it stopped (INTERRUPTED where
    `interrupts.StopFlag` ended it). On several workers the workers compare
    `steps` and `pending` (`multiworker.peers.NewVariables.digest`) first.
    """
    n = len(self._devices)
    zero = tf.constant(0, tf.int64)
    # The outputs' shapes through the loop: their rank, no dims (replica 0's specs;
    # another replica's may have other static sizes, rows picked by `replica_id`).
    invariants = tuple(tf.TensorShape([n]).concatenate(
        tf.TensorShape(None if spec.shape.rank is None else [None] * spec.shape.rank))
                       for spec in self._current.tensor_specs)
    # A random op's state is in its kernel: nothing orders its draws, so iterations
    # side by side could draw in either order (another step's numbers).
    parallel_iterations = 1 if self._current.draws_random else 10
    if iterator is None:
      # On several workers the first step runs while the workers compare `steps`
      # (each asked for one at least), off the step's path; the loop goes on
      # where they agree, else STEPS_DIFFER stops them after that first step.
      # Nor is there a fetch to agree on a stop: see `interrupts.AGREE_EVERY`.
      def body(i, agreed, status, unused_outputs):
        outputs = self._replicated_step([None] * n, args, effects.open_gate())
        if self._keys is not None:
          agreed, status = tf.cond(
              tf.equal(i % interrupts.AGREE_EVERY, 0),
              lambda: self._fetcher.agree_on_steps(steps, pending, i, self.stop_flag.signal()),
              lambda: (agreed, status))
        return i + 1, agreed, status, outputs

      def go_on(i, agreed, unused_status, unused_outputs):  # alone, the flag too
        return i < agreed if self._keys is not None else tf.logical_and(
            i < agreed, tf.equal(self.stop_flag.signal(), 0))

      ready = fetch.status_tensor(fetch.StepStatus.READY)
      first = steps if self._keys is None else tf.constant(1, tf.int64)
      completed, _, status, outputs = tf.while_loop(
          go_on, body, (zero, first, ready, self._initial_outputs()),
          shape_invariants=(tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([]),
                            invariants),
          parallel_iterations=parallel_iterations)
      if self._keys is None:  # READY: every step ran, or the flag stopped it
        status = tf.where(completed < steps,
                          fetch.interrupted(self.stop_flag.signal(after=[completed])), status)
    else:
      empty = [tf.experimental.Optional.empty(iterator.element_spec)] * n
      as_bool = self._fetcher.sizes_to_compare(iterator.element_spec) is None

      def fetch_next(**compared):  # on several workers, with this worker's flag
        if self._keys is not None:
          compared["signum"] = self.stop_flag.signal()
        return self._fetcher.fetch(iterator, **compared)

      def fetch_if_due(i, status):
        # Alone, the flag is read here; on several workers the last fetch said
        # whether one got a signal (LAST plus its number): all stop at one step.
        due = i < steps
        signum = (self.stop_flag.signal() if self._keys is None
                  else tf.maximum(status - fetch.StepStatus.LAST, 0))
        stopped = (lambda: tf.constant(False)) if as_bool else (lambda: tf.where(
            due, fetch.interrupted(signum), fetch.status_tensor(fetch.StepStatus.DONE)))
        return tf.cond(tf.logical_and(due, tf.equal(signum, 0)), fetch_next,
                       lambda: (empty, stopped()))

      def body(i, optionals, status, unused_outputs):
        outputs = self._replicated_step([(o.get_value(),) for o in optionals], args,
                                        effects.open_gate())
        optionals, status = fetch_if_due(i + 1, status)
        return i + 1, optionals, status, outputs

      optionals, status = (fetch_next() if self._keys is None
                           else fetch_next(steps=steps, pending=pending))
      completed, _, status, outputs = tf.while_loop(
          lambda i, optionals, status, outputs: fetch.is_ready(status), body,
          (zero, optionals, status, self._initial_outputs()),
          shape_invariants=(tf.TensorShape([]), [o._type_spec for o in optionals],  # pylint: disable=protected-access
                            tf.TensorShape([]), invariants),
          parallel_iterations=parallel_iterations)
      status = fetch.why_stopped(status, lambda: self.stop_flag.signal(after=[completed]))
    step_checks.check_variables(tf.compat.v1.get_default_graph(), len(self._devices))
    return completed, outputs, status
