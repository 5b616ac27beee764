"""A compiled step: `steps` iterations of step_fn on every replica, one call.

Compilation happens in two traces. The first traces replica 0 alone inside a
throwaway `tf.function`, with a variable factory active: modules built on first
call and optimizer slots are created there and initialized by `tf.function`'s
own lifting, exactly as in single-device code, then copied to every replica.
The second traces all replicas into the real loop, where creating a variable
is an error.
"""

import contextlib
import logging
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import op_selector

from replicator import collectives
from replicator import context
from replicator import variables

# AutoGraph converts step_fn and what it calls; the library's own code is plain
# Python that must run as written (as TensorFlow's, Keras's and Sonnet's do).
if not any(getattr(rule, "module_prefix", None) == "replicator"
           for rule in autograph_config.CONVERSION_RULES):
  autograph_config.CONVERSION_RULES = (
      (autograph_config.DoNotConvert("replicator"),)
      + tuple(autograph_config.CONVERSION_RULES))


# "No registered 'PrintV2' OpKernel for XLA_CPU_JIT devices": XLA's refusal.
_XLA_MISSING_KERNEL = re.compile(r"No registered '(\w+)' OpKernel for XLA_\w+_JIT")
_PRINT_OPS = frozenset({"PrintV2", "Print", "StringFormat"})


def xla_unsupported(error: tf.errors.OpError, step_fn, compiled_by: str):
  """A clear error for ops XLA cannot compile, or None for other errors.

  TensorFlow's message names the op type deep inside a graph dump; this one
  names step_fn, the ops and what to do instead.
  """
  ops = sorted(set(_XLA_MISSING_KERNEL.findall(str(error))))
  if not ops:
    return None
  name = getattr(step_fn, "__name__", step_fn)
  if _PRINT_OPS.intersection(ops):
    fix = ("tf.print cannot run inside the compiled step: return the values "
           "from step_fn and print what run returns (one row per replica)")
  else:
    fix = ("move that computation out of the step: into input_fn "
           "(dataset.map) or after run, on what run returns")
  return type(error)(
      error.node_def, error.op,
      f"step_fn: {name} uses {', '.join(ops)}, which XLA cannot compile; "
      f"{compiled_by}. Fix: {fix}.")


def _to_spec(value):
  if isinstance(value, tf.Tensor):
    return tf.TensorSpec(value.shape, value.dtype)
  return value


def check_outputs(outputs, step_fn):
  def check(leaf):
    if leaf is None or isinstance(leaf, tf.Tensor):
      return leaf
    if isinstance(leaf, tf.Variable):
      return tf.convert_to_tensor(leaf)
    raise TypeError(
        f"step_fn: {getattr(step_fn, '__name__', step_fn)} returned "
        f"{type(leaf).__name__} {leaf!r} in {outputs!r}; return tensors (wrap "
        "Python numbers with tf.constant, or leave them out).")
  return tf.nest.map_structure(check, outputs)


_STACKED_OUTPUTS = "outputs_of_every_replica"


def different_output_shapes(step_fn, shapes=None) -> str:
  """The error for replicas whose outputs differ in shape."""
  found = f" ({', '.join(str(s) for s in shapes)})" if shapes else ""
  return (
      f"step_fn: {getattr(step_fn, '__name__', step_fn)} returned an output "
      f"whose shape differs from replica to replica{found}; run stacks each "
      "output over the replicas, so it must have one shape on all of them. "
      "Reduce it inside the step (repl.all_sum, a mean), or pad it to a fixed "
      "size and return a mask with it.")


def output_shape_error(error: tf.errors.OpError, step_fn):
  """A clear error when stacking the replicas' outputs failed at run time."""
  if _STACKED_OUTPUTS not in str(error):
    return None
  return type(error)(error.node_def, error.op, different_output_shapes(step_fn))


# Why a step did or did not run (`_fetch`'s status).
READY = 1  # every replica has a batch, all one size
OUT_OF_DATA = 0  # some replica, on some worker, has none
UNEVEN = -1  # every replica has one, not all one size
DONE = 2  # the loop ran the steps it was asked for
STEPS_DIFFER = -2  # workers asked for different numbers of steps: none ran


def _status(value: int) -> tf.Tensor:
  return tf.constant(value, tf.int64)


def _is_ready(status: tf.Tensor) -> tf.Tensor:
  return status if status.dtype == tf.bool else tf.equal(status, READY)


def _why_stopped(status: tf.Tensor) -> tf.Tensor:
  """The status as an int64 (a bool status stops only when out of data)."""
  if status.dtype == tf.bool:
    return _status(OUT_OF_DATA)
  return status


def _batch_leaf(element_spec):
  """`(index, static batch size or None)` of the first batched element leaf.

  `(None, 0)` when no leaf has a batch dimension. A leaf of unknown rank
  (from `tf.py_function`, say) may have one, of a size known at run time.
  """
  for index, spec in enumerate(tf.nest.flatten(element_spec)):
    shape = getattr(spec, "shape", None)
    if shape is not None and shape.rank is None:
      return index, None
    if shape is not None and shape.rank:
      return index, shape[0]
  return None, 0


def _batch_size(value) -> tf.Tensor:
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int64)
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  # -1 for a scalar (a leaf of unknown rank may turn out to be one)
  return tf.concat([tf.shape(value, out_type=tf.int64), [-1]], 0)[0]


def _draws_from_kernel_state(graph) -> bool:
  """Whether `graph` has stateful random ops (`tf.random.uniform`, dropout).

  Each such op keeps its generator state in its kernel, and every compiled
  function has kernels of its own: two functions tracing the same step
  with the same seeds would each start the same stream again.
  """
  graph_def = graph.as_graph_def()
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  for op_type in {node.op for node in nodes}:
    op_def = op_def_registry.get(op_type)
    if op_def is not None and op_def.is_stateful and any(
        attr.name == "seed2" for attr in op_def.attr):
      return True
  return False


class _ByReference:
  """A variable in `args`, passed to the compiled step as a Python object.

  As a `tf.function` argument a variable would be one resource handle, the
  same on every replica (outside a step, a replicated variable's first
  copy), and its updates would not be aggregated. By reference, each replica
  uses its own copy, as for a variable that step_fn reads from its closure.
  """

  def __init__(self, variable):
    self.variable = variable

  def __eq__(self, other):
    return isinstance(other, _ByReference) and other.variable is self.variable

  def __hash__(self):
    return id(self.variable)


def _by_reference(args):
  if not any(isinstance(leaf, tf.Variable) for leaf in tf.nest.flatten(args)):
    return args
  return tf.nest.map_structure(
      lambda leaf: _ByReference(leaf) if isinstance(leaf, tf.Variable) else leaf, args)


def _dereference(args):
  return tf.nest.map_structure(
      lambda leaf: leaf.variable if isinstance(leaf, _ByReference) else leaf, args)


def _signature(args):
  """What decides step_fn's outputs: the nest, tensor types, other values."""
  def leaf_key(leaf):
    if isinstance(leaf, (tf.Tensor, np.ndarray)):
      return ("tensor", tuple(leaf.shape), tf.as_dtype(leaf.dtype))
    try:
      hash(leaf)
    except TypeError:
      return ("object", id(leaf))
    return ("value", type(leaf), leaf)
  flat = tf.nest.flatten(args)
  if len(flat) == len(args) and all(a is leaf for a, leaf in zip(args, flat)):
    structure = len(args)  # no nests: the common case, and quick
  else:
    structure = repr(tf.nest.map_structure(lambda _: 0, args))
  return structure, tuple(leaf_key(leaf) for leaf in flat)


class _Traced:
  """What one trace of step_fn (one signature of its `args`) found."""

  def __init__(self, output_spec, draws_random: bool):
    self.output_spec = output_spec  # step_fn's outputs, None leaves included
    # the leaves that are tensors, in flat order
    self.tensor_specs = tuple(spec for spec in tf.nest.flatten(output_spec)
                              if spec is not None)
    self.draws_random = draws_random  # whether step_fn has stateful random ops


# Ops that write a resource variable (their first input is its handle).
_VARIABLE_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                    "ResourceScatter", "ResourceApply", "ResourceSparseApply",
                    "ResourceStridedSliceAssign")


def _made_outside(what: str) -> str:
  """The error for a step that uses a variable of no replicator context."""
  return (f"step_fn {what} created outside every replicator context, so each "
          "replica would update one shared copy. Create it inside `with "
          "repl.context():` (or on the first run of the step).")


class ProgramsDiffer(ValueError):
  """Workers traced different collectives for one step: it must not run."""


class CompiledStep:
  """The loop for one `(step_fn, input_fn)` pair on one replicator."""

  def __init__(self, step_fn: Callable, element_spec, *, devices: Sequence[str],
               first_replica_id: int, num_replicas: int,
               factory: variables.VariableFactory, jit_compile: bool,
               workers=None, on_variables_created: Callable[[], None] = None,
               uneven_batches: bool = False):
    self._step_fn = step_fn
    self._uneven_batches = uneven_batches
    self._element_spec = element_spec
    self._devices = tuple(devices)
    self._first_replica_id = first_replica_id
    self._num_replicas = num_replicas
    self._factory = factory
    self._jit_compile = jit_compile
    self._workers = workers
    self._on_variables_created = on_variables_created or (lambda: None)
    self._python_numbers = None  # the Python numbers in the last call's args
    self._warned_python_numbers = False
    self._traced = {}  # signature of args -> _Traced
    self._current = None  # the _Traced of the call being run
    self._loop = tf.function(self._trace_loop, autograph=False)
    self._single = tf.function(self._trace_single, autograph=False)
    # A function of its own even without XLA: Grappler then optimizes the step
    # as one graph (inlined into the loop's `cond`, a GAN step ran 1.06-1.20x
    # slower; measured with benchmarks.gan_step).
    self._replicated_step = tf.function(self._trace_step, autograph=False,
                                        jit_compile=jit_compile)

  @property
  def element_spec(self):
    return self._element_spec

  def __call__(self, iterator, steps: int, args: Sequence[Any]):
    self._warn_if_python_numbers_change(args)
    args = _by_reference(tuple(args))
    signature = _signature(args)
    new = signature not in self._traced
    if new:  # step_fn's outputs may depend on args
      issued = self._workers.issued if self._workers is not None else 0
      self._traced[signature] = self._build(args, creating=not self._traced)
    self._current = self._traced[signature]
    if new and self._workers is not None:
      self._loop.get_concrete_function(iterator, tf.constant(steps, tf.int64), args)
      self._check_same_program(issued)
    # The common case, without the loop's per-call overhead; a step that
    # draws random numbers always runs in the loop, so one stream advances
    # whatever `steps` each call asks for. So does every step on several
    # workers: the loop checks that every worker asked for the same `steps`
    # (two compiled functions' collectives have different keys, and a loop's
    # are told apart by iteration, so workers running different numbers of
    # steps would wait for each other forever).
    if steps == 1 and not self._current.draws_random and self._workers is None:
      completed, tensors, status = self._single(iterator, args)
    else:
      completed, tensors, status = self._loop(
          iterator, tf.constant(steps, tf.int64), args)
    return completed, self._with_nones(tensors), status

  def _check_same_program(self, issued_before: int):
    """On several workers: raises unless every worker traced as many collectives.

    Workers whose step_fn took other Python branches (an extra collective on
    the chief, say) would pair collectives with different keys and wait for
    each other forever; compared before the step first runs, they raise
    `ProgramsDiffer`, with their keys aligned again for the steps that follow.
    """
    traced = self._workers.issued - issued_before
    with tf.device(self._devices[0]):
      fewest, most = (int(x) for x in collectives.min_and_max_across_workers(
          tf.constant(traced, tf.int64), self._workers,
          instance_key=self._workers.next_check()))
    if fewest != most:
      self._workers.issued = issued_before + most
      raise ProgramsDiffer(
          f"step_fn: {getattr(self._step_fn, '__name__', self._step_fn)} traced "
          f"{traced} cross-worker collective(s) on worker "
          f"{self._workers.worker_index} and from {fewest} to {most} on the "
          "workers, so they would wait for each other forever. Every worker must "
          "run the same program: take the same Python branches in step_fn (branch "
          "on tensors, not on the worker index), build the same models and call "
          "run with the same step_fn, input_fn and args, in the same order.")

  def _warn_if_python_numbers_change(self, args):
    """Python numbers in `args` are compiled in: a new value compiles again."""
    numbers = tuple(
        leaf if isinstance(leaf, (int, float, np.number))
        and not isinstance(leaf, (bool, np.bool_)) else None
        for leaf in tf.nest.flatten(args))
    previous, self._python_numbers = self._python_numbers, numbers
    if (previous is None or len(previous) != len(numbers) or
        self._warned_python_numbers or
        not any(a is not None and b is not None and a != b
                for a, b in zip(previous, numbers))):
      return
    self._warned_python_numbers = True
    logging.warning(
        "replicator: run(%s, args=...) got Python numbers that changed since the "
        "last call (%s -> %s). A Python number is compiled into the step, so each "
        "new value compiles it again (seconds each time); pass values that change "
        "from call to call as tensors, e.g. args=(tf.constant(lr),).",
        getattr(self._step_fn, "__name__", self._step_fn), previous, numbers)

  def _with_nones(self, tensors):
    """step_fn's output structure, from the tensors the compiled step returns.

    The compiled functions carry only the tensor leaves, so a step that returns
    nothing (or a nest with `None` in it) runs as one that returns tensors.
    """
    tensors = iter(tensors)
    output_spec = self._current.output_spec
    return tf.nest.pack_sequence_as(
        output_spec,
        [None if spec is None else next(tensors)
         for spec in tf.nest.flatten(output_spec)])

  def _group(self, build_only: bool) -> context.ReplicaGroup:
    return context.ReplicaGroup(self._devices, self._first_replica_id,
                                self._num_replicas, build_only=build_only,
                                workers=self._workers)

  def _replica_scope(self, creating: bool):
    @contextlib.contextmanager
    def scope(r):
      with tf.device(self._devices[r]), tf.name_scope(f"replica_{r}"):
        if creating:
          with self._factory.scope():
            yield
        else:
          with variables.no_creation("after its first run"):
            yield
    return scope

  def _build(self, args, creating: bool) -> _Traced:
    """A trace of replica 0 alone, finding the outputs for these `args`.

    The first (`creating`) also creates the variables that step_fn makes.
    """
    step_fn = self._converted_in_function()
    args = _dereference(args)

    def trace(*batch):
      inputs = tuple(batch) + tuple(args)
      outputs = self._group(build_only=True).run(
          step_fn, [inputs], self._replica_scope(creating=creating))[0]
      return check_outputs(outputs, self._step_fn)

    specs = () if self._element_spec is None else (self._element_spec,)
    try:
      with self._factory.scope() if creating else contextlib.nullcontext():
        concrete = tf.function(trace, autograph=False).get_concrete_function(*specs)
    except op_selector.UnliftableError as error:
      raise ValueError(
          f"step_fn: {getattr(self._step_fn, '__name__', self._step_fn)} "
          "creates a variable whose initial value depends on the step's input "
          "(data-dependent initialization, as in ActNorm); variables made in "
          "the step are initialized before any batch arrives. Create it before "
          "run: call the module once on a sample batch inside `with "
          "repl.context():`, or create it with a placeholder value and assign "
          f"the data's value in the step. ({str(error).splitlines()[0][:300]})"
      ) from error
    if creating:
      self._factory.materialize_pending()
      self._on_variables_created()
    return _Traced(tf.nest.map_structure(_to_spec, concrete.structured_outputs),
                   _draws_from_kernel_state(concrete.graph))

  def _converted_in_function(self):
    step_fn = self._step_fn

    def call(*inputs):
      return tf.__internal__.autograph.tf_convert(
          step_fn, tf.__internal__.autograph.control_status_ctx())(*inputs)
    return call

  def _trace_step(self, batches, args):
    step_fn = self._converted_in_function()
    args = _dereference(args)
    per_replica = [(tuple(b) if b is not None else ()) + tuple(args)
                   for b in batches]
    outputs = self._group(build_only=False).run(
        step_fn, per_replica, self._replica_scope(creating=False))
    leaves = [tf.nest.flatten(check_outputs(o, self._step_fn)) for o in outputs]
    self._check_writes(tf.compat.v1.get_default_graph())
    return tuple(self._stack_over_replicas(xs) for xs in zip(*leaves)
                 if xs[0] is not None)

  def _check_writes(self, graph):
    """Refuses writes to a variable made outside every replicator context.

    `_check_variables` sees the variables a step reads; one that is only
    written (`assign_add(x, read_value=False)`) is found here, as a captured
    resource that no replicated or replica-local variable owns, written by
    an op of the step's own graph (not inside a `tf.cond` of it).
    """
    if len(self._devices) < 2:
      return
    known = variables.component_handles()
    foreign = {internal.name for external, internal in graph.captures
               if external.dtype == tf.resource and id(external) not in known}
    for op in graph.get_operations() if foreign else ():
      if (op.type.startswith(_VARIABLE_WRITES) and op.inputs and
          op.inputs[0].name in foreign):
        value = op.inputs[1] if len(op.inputs) > 1 else None
        what = f" of dtype {value.dtype.name}" if value is not None else ""
        raise ValueError(_made_outside(
            f"writes a variable{what} ({op.type} {op.name!r}) that was"))

  def _stack_over_replicas(self, values):
    """One output leaf of every replica, stacked (its shape checked first)."""
    shapes = [value.shape for value in values]
    if not all(shape.is_compatible_with(shapes[0]) for shape in shapes):
      raise ValueError(different_output_shapes(self._step_fn, shapes))
    return tf.stack(values, name=_STACKED_OUTPUTS)

  def _initial_outputs(self):
    n = len(self._devices)

    def zeros(spec):
      shape = [n] + [d if d is not None else 0 for d in spec.shape.as_list()]
      return tf.zeros(shape, spec.dtype)
    return tuple(zeros(spec) for spec in self._current.tensor_specs)

  def _invariants(self):
    n = len(self._devices)
    return tuple(tf.TensorShape([n]).concatenate(spec.shape)
                 for spec in self._current.tensor_specs)

  def _sizes_to_compare(self, element_spec):
    """`(leaf, static batch size or None)` whose size `_fetch` compares.

    None where it compares none (one replica, or one worker with a static batch
    size): `_fetch`'s status is then a bool. With `allow_uneven_batches` the
    size counts as static (0) and only workers' data is compared.
    """
    leaf, static_size = _batch_leaf(element_spec)
    if self._uneven_batches:
      static_size = 0
    if self._num_replicas == 1 or (self._workers is None and static_size is not None):
      return None
    return leaf, static_size

  def _fetch(self, iterator, steps=None):
    """Takes one element per local replica: `(optionals, status)`.

    Where batches cannot be uneven, `status` is a bool (true: ready), as cheap
    as can be in the loop. Elsewhere it is READY when every replica, on every
    worker, got a batch and all those batches are the same size; else
    OUT_OF_DATA, or UNEVEN when every replica got a batch but of different
    sizes. The mean over replicas weights every replica's batch alike, so a
    step with a short last batch on some replicas would not be the step of one
    replica on the whole batch: such a step does not run, unless the input
    allows uneven batches (`replicator.allow_uneven_batches`). Sizes are
    compared at run time only where the batch size is not static; between
    workers always, in the one collective that also says whether every worker
    got data, so that every worker runs the same collectives whatever its
    dataset's shapes. Given `steps` (on several workers), that collective
    also compares the workers' `steps`: STEPS_DIFFER where they differ.
    """
    optionals = [iterator.get_next_as_optional() for _ in self._devices]
    got_all = tf.reduce_all(tf.stack([o.has_value() for o in optionals]))
    compared = self._sizes_to_compare(iterator.element_spec)
    if compared is None:
      return optionals, got_all  # a bool: the one way to stop is to run out
    leaf, static_size = compared
    with tf.device(self._devices[0]):
      if static_size is not None:
        sizes = tf.constant([static_size], tf.int64)
      else:
        sizes = tf.stack([
            tf.cond(o.has_value(),
                    lambda o=o: _batch_size(tf.nest.flatten(o.get_value())[leaf]),
                    lambda: tf.constant(-1, tf.int64))
            for o in optionals])
      # min over workers of (got a batch, smallest size, -largest size)
      state = [tf.cast(got_all, tf.int64), tf.reduce_min(sizes), -tf.reduce_max(sizes)]
      if steps is not None:  # and (min, -max) over workers of steps
        state += [steps, -steps]
      state = collectives.across_workers(tf.stack(state), "Min", self._workers)
      status = tf.where(
          state[0] > 0,
          tf.where(tf.equal(state[1], -state[2]), _status(READY), _status(UNEVEN)),
          _status(OUT_OF_DATA))
      if steps is not None:
        status = tf.where(tf.equal(state[3], -state[4]), status, _status(STEPS_DIFFER))
    return optionals, status

  def _agree_on_steps(self, steps):
    """`(steps, status)`: 0 and STEPS_DIFFER where workers asked for different ones."""
    with tf.device(self._devices[0]):
      fewest, most = collectives.min_and_max_across_workers(steps, self._workers)
      same = tf.equal(fewest, most)
      return (tf.where(same, steps, tf.constant(0, tf.int64)),
              tf.where(same, _status(READY), _status(STEPS_DIFFER)))

  def _trace_single(self, iterator, args):
    n = len(self._devices)
    if iterator is None:
      outputs = self._replicated_step([None] * n, args)
      completed, status = tf.constant(1, tf.int64), _status(READY)
    else:
      optionals, status = self._fetch(iterator)
      completed, outputs = tf.cond(
          _is_ready(status),
          lambda: (tf.constant(1, tf.int64), self._replicated_step(
              [(o.get_value(),) for o in optionals], args)),
          lambda: (tf.constant(0, tf.int64), self._initial_outputs()))
    self._check_variables(tf.compat.v1.get_default_graph())
    return completed, outputs, _why_stopped(status)

  def _trace_loop(self, iterator, steps, args):
    """`steps` steps in a `tf.while_loop`, stopping early when data runs out.

    The next step's batches are fetched at the end of each iteration and
    carried into the next as optionals, so the loop condition sees whether they
    arrived and the step itself runs without a `cond` around it (a `cond`
    would switch every variable the step touches, on every replica, per step).
    They are fetched only if a next step is due, so no element is lost.
    Returns `(completed, outputs, status)`: status is why the loop stopped
    (READY when it ran every step).
    """
    n = len(self._devices)
    zero = tf.constant(0, tf.int64)
    invariants = self._invariants()
    # A random op's state is in its kernel, not in a variable, so nothing
    # orders its draws: iterations running side by side could draw in either
    # order, and the step would return another step's numbers.
    parallel_iterations = 1 if self._current.draws_random else 10
    if iterator is None:
      status = _status(READY)
      if self._workers is not None:
        steps, status = self._agree_on_steps(steps)
      completed, outputs = tf.while_loop(
          lambda i, _: i < steps,
          lambda i, _: (i + 1, self._replicated_step([None] * n, args)),
          (zero, self._initial_outputs()),
          shape_invariants=(tf.TensorShape([]), invariants),
          parallel_iterations=parallel_iterations)
    else:
      empty = [tf.experimental.Optional.empty(iterator.element_spec)] * n

      def fetch_if_due(i):
        done = (tf.constant(False)
                if self._sizes_to_compare(iterator.element_spec) is None
                else _status(DONE))
        return tf.cond(i < steps, lambda: self._fetch(iterator),
                       lambda: (empty, done))

      def body(i, optionals, unused_status, unused_outputs):
        outputs = self._replicated_step([(o.get_value(),) for o in optionals], args)
        optionals, status = fetch_if_due(i + 1)
        return i + 1, optionals, status, outputs

      optionals, status = self._fetch(
          iterator, steps if self._workers is not None else None)
      completed, _, status, outputs = tf.while_loop(
          lambda i, optionals, status, outputs: _is_ready(status), body,
          (zero, optionals, status, self._initial_outputs()),
          shape_invariants=(tf.TensorShape([]), [o._type_spec for o in optionals],  # pylint: disable=protected-access
                            tf.TensorShape([]), invariants),
          parallel_iterations=parallel_iterations)
    self._check_variables(tf.compat.v1.get_default_graph())
    return completed, outputs, _why_stopped(status)

  def _check_variables(self, graph):
    if len(self._devices) < 2:
      return
    for variable in graph._watched_variables:  # pylint: disable=protected-access
      # (a function loaded from a SavedModel watches the ReplicatedVariable itself)
      if not (variables.is_component(variable) or
              isinstance(variable, variables.ReplicatedVariable)):
        generator = ("" if "StateVar" not in variable.name else
                     " If it is a tf.random.Generator's state (such as "
                     "tf.random.get_global_generator()'s), make the generator "
                     "inside the context, or use repl.random_generator(seed).")
        raise ValueError(_made_outside(f"uses the variable {variable.name!r}, which was")
                         + generator)
