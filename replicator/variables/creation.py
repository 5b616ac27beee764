"""Where replicated variables come from: the factory of `repl.context()`.

Under `VariableFactory.scope()` a variable is created once, on the first
replica's device, and wrapped in a `ReplicatedVariable` whose copies are made
as soon as its value exists (at once when eager, after the trace otherwise).

Variables that the first trace of a step creates (under `creating()`) are made
outside the trace at once, uninitialized, and get their initial values from one
function run after the trace, as `tf.function` initializes its own. Left to
`tf.function`, each would be an `UnliftedInitializerVariable`, which builds a
`tf.cond` per variable into the trace and makes `tf.function` trace the step a
second time, which for a lazily built deep model is more than half of the
first trace (see benchmarks/RESULTS.md, "Time to the first training step").

`no_creation` refuses a variable made where a step may not make one (a later
trace, another replica's), naming it as `describe` does.
"""

import collections
import contextlib
import threading
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import lift_to_graph
from tensorflow.python.ops import op_selector
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable

from replicator.variables import registry
from replicator.variables import replicated as variables

_local = threading.local()


class VariableFactory:
  """Creates `ReplicatedVariable`s for variables made under `scope()`."""

  def __init__(self, devices: Sequence[str]):
    self._devices = tuple(devices)
    self._pending: List[variables.ReplicatedVariable] = []
    self.created: List[variables.ReplicatedVariable] = []  # in creation order
    # (variable, its initial value, the ops computing it), made in a trace.
    self._lifted: List[Tuple[tf.Variable, tf.Tensor, frozenset]] = []
    self._lifting = False
    self._to_fill: List[variables.ReplicatedVariable] = []  # copies to fill

  def _create(self, next_creator: Callable, **kwargs) -> variables.ReplicatedVariable:
    if registry.in_replica_local() or getattr(_local, "creating", False):
      return next_creator(**kwargs)  # nested scopes: replicate only once
    _local.creating = True
    try:
      primary = None
      if self._lifting and tf.inside_function():
        kwargs = dict(kwargs)
        primary = self._create_outside_the_trace(kwargs)
      if primary is None:
        with tf.device(self._devices[0]):
          primary = next_creator(**kwargs)
    finally:
      _local.creating = False
    variable = variables.ReplicatedVariable(primary, self._devices,
                                            kwargs.get("aggregation"))
    self.created.append(variable)
    if tf.executing_eagerly() or self._lifting:
      # In a trace under `creating()` the copies are made now, uninitialized (the
      # other replicas' traces use them), and filled when the trace ends.
      variable._materialize()  # pylint: disable=protected-access
      if not tf.executing_eagerly():
        self._to_fill.append(variable)
    else:
      self._pending.append(variable)
    return variable

  @contextlib.contextmanager
  def scope(self):
    with tf.variable_creator_scope(self._create):
      yield

  def _create_outside_the_trace(self, kwargs) -> Optional[tf.Variable]:
    """The variable, made outside the trace and not initialized; or None.

    `_initialize_lifted` assigns its initial value (computed in the trace, as
    `tf.function` computes it) unless something (a checkpoint's deferred
    restore) did meanwhile. A value of unknown shape, a checkpoint's deferred
    value, or one that depends on the trace's inputs (data-dependent
    initialization) goes `tf.function`'s way, with the same results and errors.
    """
    initial_value = kwargs.get("initial_value")
    if callable(initial_value):
      initial_value = initial_value()
      kwargs["initial_value"] = initial_value
    if initial_value is None or isinstance(initial_value, trackable.CheckpointInitialValue):
      return None
    initial_value = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
    shape = kwargs.get("shape")
    shape = initial_value.shape if shape is None else tf.TensorShape(shape)
    if not shape.is_fully_defined():
      return None
    ops = subgraph(initial_value) if tf.is_symbolic_tensor(initial_value) else ()
    if ops is None:
      return None
    # As `tf.function`'s own variables (which ignore other creators alike).
    with tf.device(self._devices[0]):
      variable = resource_variable_ops.UninitializedVariable(
          trainable=kwargs.get("trainable"), caching_device=kwargs.get("caching_device"),
          name=kwargs.get("name"), shape=shape, dtype=initial_value.dtype,
          constraint=kwargs.get("constraint"),
          synchronization=kwargs.get("synchronization", tf.VariableSynchronization.AUTO),
          aggregation=kwargs.get("aggregation", tf.VariableAggregation.NONE),
          extra_handle_data=initial_value)
    self._lifted.append((variable, initial_value, ops))
    return variable

  @contextlib.contextmanager
  def creating(self):
    """Inside, a trace may create variables (see above); they are ready after.

    Yields a set that gets the names of the trace's ops that compute the initial
    values (they run once, not in the step).

    On leaving, even by an error, the variables made inside get their initial
    values and their copies: a step that raised after building the model
    leaves it whole.
    """
    self._lifting = True
    initializers = set()
    try:
      with self.scope():
        yield initializers
    finally:
      self._lifting = False
      initializers.update(_used_only_to_initialize([ops for _, _, ops in self._lifted]))
      try:
        self._initialize_lifted()
      finally:
        self._fill_copies()
        self._materialize_pending()

  def _initialize_lifted(self):
    """Assigns the initial values of the variables a trace made under `creating()`.

    One function for all, as `tf.function` initializes its variables: their
    initializers, copied out of the trace, then the assignments; a variable
    already initialized (restored) keeps its value.
    """
    lifted, self._lifted = self._lifted, []
    with tf.init_scope():
      lifted = [entry for entry in lifted
                if not resource_variable_ops.var_is_initialized_op(entry[0].handle)]
      for variable, value, _ in lifted:
        if not tf.is_symbolic_tensor(value):
          variable.assign(value, read_value=False)
    lifted = [entry for entry in lifted if tf.is_symbolic_tensor(entry[1])]
    if not lifted:
      return
    earlier = frozenset()
    for variable, _, subgraph in lifted:
      earlier |= subgraph
      _drop_orderings_added_later(variable, subgraph, earlier)

    def initialize():
      copies = None
      for batch in lift_batches(lifted):
        copies = lift_to_graph.lift_to_graph(
            [value for _, value, _ in batch], tf.compat.v1.get_default_graph(),
            op_map=copies, disallowed_placeholders=Inputs(batch[0][1].graph),
            handle_captures=True)
        for variable, value, _ in batch:
          variable.assign(copies[value], read_value=False)

    with tf.init_scope(), _without_grappler():
      # Called as a concrete function: tf.function warns of "retracing" when
      # closures of one code object are traced again and again (one per step
      # that builds a model; a sweep builds many).
      tf.function(initialize, autograph=False).get_concrete_function()()

  def _fill_copies(self):
    """Gives the copies made in a trace their variable's initial value.

    Copies that something initialized meanwhile (a checkpoint's deferred
    restore writes every copy) keep theirs.
    """
    made, self._to_fill = self._to_fill, []
    with tf.init_scope():
      for variable in made:
        primary = variable.replicas[0]
        if not resource_variable_ops.var_is_initialized_op(primary.handle):
          continue  # left uninitialized, as the trace's error left it
        value = primary.read_value()
        for copy in variable.replicas[1:]:
          if not resource_variable_ops.var_is_initialized_op(copy.handle):
            copy.assign(value, read_value=False)

  def _materialize_pending(self):
    """Copies the variables created while tracing, once they are initialized."""
    pending, self._pending = self._pending, []
    for variable in pending:
      variable._materialize()  # pylint: disable=protected-access


def lift_batches(lifted):
  """`lifted` (variable, initial value, its ops), in creation order, cut into
  batches whose values lift into one graph together.

  A value that reads a captured variable (`tf.Variable(w)`, w made before it
  in the step) is lifted alone, after the batches before it: each batch must
  be assigned before the next is taken.
  """
  batch = []
  for entry in lifted:
    reads_captured = any(op.type == "Placeholder" for op in entry[2])
    if batch and (reads_captured or batch[0][1].graph is not entry[1].graph):
      yield batch
      batch = []
    batch.append(entry)
    if reads_captured:
      yield batch
      batch = []
  if batch:
    yield batch


# Ops that take a variable's handle and do not change it.
READS = frozenset({"ReadVariableOp", "VarIsInitializedOp", "VariableShape",
                    "ResourceGather", "ResourceGatherNd"})


@contextlib.contextmanager
def _without_grappler():
  """Functions first called in it, in this thread, are not optimized by Grappler.

  The initializers run once; optimizing their function (thousands of nodes
  for a deep model and its optimizer) delays the first step and saves
  nothing. Function call options are per thread.
  """
  context = eager_context.context()
  saved = context.function_call_options
  config = config_pb2.ConfigProto()
  if saved.config_proto_serialized is not None:
    config.ParseFromString(saved.config_proto_serialized)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  context.function_call_options = eager_context.FunctionCallOptions(
      executor_type=saved.executor_type, config_proto=config)
  try:
    yield
  finally:
    context.function_call_options = saved


def _drop_orderings_added_later(variable, subgraph: frozenset, initializers: frozenset):
  """Removes the control inputs the trace gave `subgraph`'s ops after it was made.

  At the end of the trace, TensorFlow orders each variable read after the
  step's earlier writes to it, and stateful ops (`tf.print`) in program order.
  Copied out with the initializer, those would run again. The trace is never
  run, so its ops can lose them; orderings among `initializers` (the ops of
  this and earlier initial values: two drawn from one `tf.random.Generator`)
  stay. Raises where a value reads a variable that step_fn wrote before: its
  initial value would need the step to run first.
  """
  handles = {id(t) for op in subgraph for t in op.inputs if t.dtype == tf.resource}
  for op in subgraph:
    later = [c for c in op.control_inputs if c not in initializers]
    if not later:
      continue
    for control in later:
      if control.type not in READS and any(id(t) in handles for t in control.inputs):
        raise ValueError(
            f"step_fn creates the variable {variable.name!r} from a value that "
            "depends on what the step did before (it reads a variable that "
            "step_fn changed earlier in the step). Its initial value must be "
            "known before the first step runs: create it before that change, "
            "or inside `with repl.context():` before run.")
    kept = [c for c in op.control_inputs if c in initializers]
    op._remove_all_control_inputs()  # pylint: disable=protected-access
    op._add_control_inputs(kept)  # pylint: disable=protected-access


class Inputs:
  """`op in Inputs(graph)`: whether `op` is the placeholder of one of `graph`'s
  inputs, not of a value it captured (those are looked up only for a
  placeholder met, since the captures are many and initializers rarely meet one)."""

  def __init__(self, graph):
    self._graph = graph

  def __contains__(self, op) -> bool:
    return op.type == "Placeholder" and not any(
        captured is op.outputs[0] for captured in self._graph.internal_captures)


def _used_only_to_initialize(subgraphs) -> set:
  """The names of the ops in `subgraphs` whose values nothing else uses."""
  ops = frozenset().union(*subgraphs)
  return {op.name for op in ops
          if all(consumer in ops for output in op.outputs for consumer in output.consumers())}


def subgraph(value: tf.Tensor) -> Optional[frozenset]:
  """The ops that compute `value` in its trace; None if an input feeds it.

  Values captured from outside the trace (variables, tensors) may.
  """
  ops = set()
  try:
    op_selector.map_subgraph(value, sources=set(), disallowed_placeholders=Inputs(value.graph),
                             visited_ops=ops, op_outputs=collections.defaultdict(set),
                             add_sources=False)
  except op_selector.UnliftableError:
    return None
  return frozenset(ops)


def describe(kwargs) -> str:
  """How errors name a variable being created (Sonnet's have no name)."""
  if kwargs.get("name"):
    return f"the variable {kwargs['name']!r}"
  initial_value = kwargs.get("initial_value")
  shape = kwargs.get("shape")
  if hasattr(initial_value, "shape"):
    shape = initial_value.shape
  elif initial_value is not None and not callable(initial_value):
    shape = np.shape(initial_value)  # a Python number or list
  return "a variable" + (f" of shape {tf.TensorShape(shape)}" if shape is not None else "")


def created_where(where: str) -> Callable[[str], str]:
  """`no_creation`'s message for a variable created `where` it may not be."""
  return lambda what: (
      f"step_fn created {what} {where}. Variables may be created on the first "
      "run of a step, or inside repl.context(); create it there, or make "
      "step_fn take the same path on every call.")


@contextlib.contextmanager
def no_creation(explain: Callable[[str], str]):
  """Inside, creating a variable raises `explain(what)`, `what` naming it."""

  def refuse(next_creator, **kwargs):
    del next_creator
    raise RuntimeError(explain(describe(kwargs)))

  with tf.variable_creator_scope(refuse):
    yield
