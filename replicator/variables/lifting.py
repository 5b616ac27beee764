"""Variables that a step's first trace creates: made outside it, initialized after it.

Both engines trace step_fn once before its first run (the in-graph engine the
replicated step itself, the strategy engine step_fn alone), and both make the
variables that trace creates the one way this module says (the rules:
docs/design.md, "Lifting"). `Lifting.create` makes each outside the trace at
once, holding no value yet, with the `VariableMaker` its engine plugs in. When
the trace ends, `Lifting.initialize` computes every initial value in one
function, run once and so without Grappler, from the initializer ops the
trace recorded (copied out with `lift_to_graph`, in creation order, so that
`tf.Variable(w)` of a variable made earlier in the step works), and has the
maker assign them, unless something gave a variable its value meanwhile (a
checkpoint's deferred restore).

`no_creation` refuses a variable made where a step may not make one (a later
trace, another replica's), naming it as `describe` does.
"""

import collections
import contextlib
import threading
from typing import Callable, List, Optional, Protocol, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.eager import context as eager_context
from tensorflow.python.eager import lift_to_graph
from tensorflow.python.ops import op_selector
from tensorflow.python.trackable import base as trackable
from tensorflow.python.util import object_identity


class VariableMaker(Protocol):
  """What an engine plugs into `Lifting`: how its variables are made and written."""

  def make(self, next_creator: Callable, kwargs: dict, shape: tf.TensorShape,
           value: tf.Tensor) -> tf.Variable:
    """The variable `kwargs` ask for, of `shape` and `value`'s dtype, made
    outside the trace; its value is assigned later (`assign`)."""

  def holds_value(self, variable: tf.Variable) -> bool:
    """Whether something gave `variable` its value since it was made (a
    checkpoint's deferred restore): it keeps that value."""

  def assign(self, variable: tf.Variable, value: tf.Tensor) -> None:
    """Writes `variable`'s initial value `value` (every copy of it)."""


class Lifting:
  """The variables one trace creates, and the initial values it computed.

  Args:
    maker: the engine's `VariableMaker`.
  """

  def __init__(self, maker: VariableMaker):
    self._maker = maker
    # (variable, its initial value, the ops computing it), in creation order.
    self._lifted: List[Tuple[tf.Variable, tf.Tensor, frozenset]] = []
    # Those left to the chief's values (`initialize(left_to_chief=True)`).
    self.left: List[Tuple[tf.Variable, tf.Tensor, frozenset]] = []

  def create(self, next_creator: Callable, kwargs: dict) -> Optional[tf.Variable]:
    """The variable that `kwargs` (a variable creator's) ask for inside the
    trace, made outside it; None for a checkpoint's deferred value, which the
    caller makes its own way. Calls a callable initial value here, in the
    trace, so that its ops are lifted as any other's (`kwargs` then holds the
    value). Raises `op_selector.UnliftableError` for a value the trace's
    inputs feed."""
    initial_value = kwargs.get("initial_value")
    if isinstance(initial_value, trackable.CheckpointInitialValueCallable):
      return None
    if callable(initial_value):
      initial_value = initial_value()
      kwargs["initial_value"] = initial_value
    if initial_value is None or isinstance(initial_value, trackable.CheckpointInitialValue):
      return None
    value = tf.convert_to_tensor(initial_value, dtype=kwargs.get("dtype"))
    shape = kwargs.get("shape")
    shape = value.shape if shape is None else tf.TensorShape(shape)
    ops = subgraph(value) if tf.is_symbolic_tensor(value) else frozenset()
    variable = self._maker.make(next_creator, kwargs, shape, value)
    self._lifted.append((variable, value, ops))
    return variable

  def initializer_names(self) -> set:
    """The names of the trace's ops that only compute initial values, whose
    values nothing else uses (they run once, not in the step)."""
    ops = frozenset().union(*(ops for _, _, ops in self._lifted))
    return {op.name for op in ops
            if all(consumer in ops for output in op.outputs for consumer in output.consumers())}

  def initialize(self, background: bool = False,
                 left_to_chief: bool = False) -> Optional["Running"]:
    """Assigns the initial values of the variables made so far (see above).

    With `background`, the function that computes them runs on a thread of
    its own (its kernels release Python's lock), so the caller can trace on
    meanwhile: returns the `Running` to wait for, or None where nothing runs.

    With `left_to_chief` (a worker other than the chief, which sends its
    values after), values drawn by stateful ops (random initializers) are
    not computed, as MultiWorkerMirroredStrategy's other workers compute
    none: those variables stay uninitialized until the chief's values come,
    or `initialize_left` computes them here. Only where no value reads a
    variable made in the step (that one would need the value first), and of
    variables of a known shape (the others' shapes travel with the value).
    """
    lifted, self._lifted = self._lifted, []
    lifted = self._without_values(lifted)
    with tf.init_scope():
      for variable, value, _ in lifted:
        if not tf.is_symbolic_tensor(value):
          self._maker.assign(variable, value)
    lifted = [entry for entry in lifted if tf.is_symbolic_tensor(entry[1])]
    if not lifted:
      return None
    earlier = frozenset()
    for variable, _, ops in lifted:
      earlier |= ops
      _drop_orderings_added_later(variable, ops, earlier)
    if left_to_chief and not any(op.type == "Placeholder" for entry in lifted
                                 for op in entry[2]):
      drawn = [_drawn(entry) for entry in lifted]
      self.left = [entry for entry, d in zip(lifted, drawn) if d]
      lifted = [entry for entry, d in zip(lifted, drawn) if not d]
    return self._run(lifted, background)

  def initialize_left(self):
    """Computes here the values `initialize(left_to_chief=True)` left to the
    chief's, of the variables that got none (the chief's did not come)."""
    left, self.left = self.left, []
    self._run(self._without_values(left), background=False)

  def _without_values(self, entries):
    """`entries` less those whose variable something gave a value meanwhile
    (a checkpoint's deferred restore, the chief's values)."""
    with tf.init_scope():
      return [entry for entry in entries if not self._maker.holds_value(entry[0])]

  def _run(self, lifted, background: bool) -> Optional["Running"]:
    """Computes and assigns the values of `lifted` (see `initialize`)."""
    if not lifted:
      return None
    batches = list(lift_batches(lifted))

    def initialize():
      copies = object_identity.ObjectIdentityDictionary()  # trace's op or tensor -> copy
      for batch in batches:
        if not imported(batch, copies):
          copies = lift_to_graph.lift_to_graph(
              [value for _, value, _ in batch], tf.compat.v1.get_default_graph(),
              op_map=copies, disallowed_placeholders=Inputs(batch[0][1].graph),
              handle_captures=True)
        if batch is not batches[-1]:  # a later batch may read these variables
          for variable, value, _ in batch:
            self._maker.assign(variable, copies[value])
      return [copies[value] for _, value, _ in batches[-1]]

    with tf.init_scope():
      # Called as a concrete function: tf.function warns of "retracing" when
      # closures of one code object are traced again and again (one per step
      # that builds a model; a sweep builds many).
      function = tf.function(initialize, autograph=False).get_concrete_function()

    def run():
      with _without_grappler():
        values = function()
      # The last batch's values are assigned eagerly: an assign op apiece
      # costs a deep model's initializers more to trace than to run.
      with tf.init_scope():
        for (variable, _, _), value in zip(batches[-1], values):
          self._maker.assign(variable, value)

    if background:
      return Running(run)
    run()
    return None


class Running:
  """A function of no arguments run once, on a thread of its own."""

  def __init__(self, function: Callable[[], object]):
    self._error = None
    self._thread = threading.Thread(target=self._run, args=(function,),
                                    name="replicator-initial-values", daemon=True)
    self._thread.start()

  def _run(self, function):
    try:
      function()
    except BaseException as error:  # pylint: disable=broad-except
      self._error = error  # raised by `wait`, on the caller's thread

  def wait(self):
    """Returns once the function ran; raises its error."""
    self._thread.join()
    if self._error is not None:
      raise self._error


def zeros_of(shape: tf.TensorShape, value: tf.Tensor) -> tf.Tensor:
  """Zeros of `shape` (`value`'s where `shape` has no rank), its unknown
  dimensions 0: a value to make a variable of `shape` with before its own."""
  if shape.rank is None:
    shape = value.shape
  dims = [] if shape.rank is None else [d or 0 for d in shape.as_list()]
  return tf.zeros(dims, value.dtype)


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


def imported(batch, copies) -> bool:
  """Copies the ops of `batch` (see `lift_batches`) into the default graph in
  one `import_graph_def`, adding each op and tensor's copy to `copies`, which
  holds those of earlier batches (which the batch's values share, not copied
  again: one random draw stays one); False, copying nothing, for a batch it
  does not take (one with captured values or function calls: `lift_to_graph`'s).

  One import is a fraction of `lift_to_graph`'s op by op copy (a deep model's
  initializers are thousands of ops). The copies are the same ops, attributes
  (random seeds too), devices and orderings, less colocation (as there).
  """
  ops = frozenset(op for entry in batch for op in entry[2] if op not in copies)
  graph_def = tf.compat.v1.GraphDef()
  graph_def.versions.CopyFrom(batch[0][1].graph.graph_def_versions)
  input_map = {}
  order = []
  for op in ops:
    if op.type == "Placeholder" or not hasattr(tf.raw_ops, op.type):
      return False  # a captured value, or a function called by its name
    node = op.node_def
    for key in list(node.attr):
      if key.startswith(("_class", "_tpu_replicate")):
        del node.attr[key]
      elif node.attr[key].WhichOneof("value") == "func" or node.attr[key].list.func:
        return False  # a function call: its function is not in the default graph
    for tensor in op.inputs:
      if tensor.op not in ops:
        if tensor not in copies:
          return False
        input_map[tensor.name] = copies[tensor]
    for control in op.control_inputs:
      if control not in ops:
        if control not in copies:
          return False
        input_map["^" + control.name] = copies[control]
    graph_def.node.append(node)
    order.append(op)
  if not order:
    return True  # (an earlier batch's ops compute these values too)
  made = tf.graph_util.import_graph_def(graph_def, input_map=input_map,
                                        return_elements=[op.name for op in order],
                                        name="initial_values")
  for op, copy in zip(order, made):
    copies[op] = copy
    for output, copied in zip(op.outputs, copy.outputs):
      copies[output] = copied
  return True


def _drawn(entry) -> bool:
  """Whether a (variable, initial value, its ops) entry's value is drawn: a
  stateful op computes it (a random initializer's), so workers may differ."""
  variable, _, ops = entry
  return variable.shape.is_fully_defined() and any(op.op_def.is_stateful for op in ops)


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


def subgraph(value: tf.Tensor) -> frozenset:
  """The ops that compute `value` in its trace; raises `op_selector.UnliftableError`
  if an input feeds it (values captured from outside the trace may)."""
  ops = set()
  op_selector.map_subgraph(value, sources=set(), disallowed_placeholders=Inputs(value.graph),
                           visited_ops=ops, op_outputs=collections.defaultdict(set),
                           add_sources=False)
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
