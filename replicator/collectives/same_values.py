"""Whether the local replicas' values of a traced tensor are the same bits.

A variable update made inside a step is aggregated so that the copies never
drift. Where every replica assigns what it computed from its own copies of the
same variables and from equal constants, by the same elementwise ops, the
copies cannot drift and the aggregation changes nothing: `snt.BatchNorm`'s
moving averages are such for two of their three updates (the step counter,
and the average debiased from the hidden one; 212 of a ResNet-50's 318 per
step), and on GPUs each would be an NCCL call.

The comparison walks every replica's graph back from the value at once and
stops at the first difference. Besides constants, shared tensors (one sum
handed to every replica, `run`'s `args`) and reads of each replica's own copy
of one variable, only ops that compute each element alone, by the same
kernel on every device of one process, count as the same: not reductions or
matrix products, whose GPU kernels may sum in another order from one run to
the next, nor random or stateful ops.

Between workers (`same_on_every_worker`) only values made from constants and
reads of variables, whose copies every worker holds alike, count; and only
integer and boolean values made by exact ops, unless the workers run the
same TensorFlow on the same hardware (checked when they join): another
machine's CPU may round a float op differently (an `Exp` by other vector
instructions), and the copies would drift by a bit at a time.
Another process may differ in its constants (a worker's index, a value it
drew), which nothing in one process sees: the constants met are returned,
for the workers to compare before the step first runs
(`step_errors.check_same_program`). `snt.BatchNorm`'s step counters are such
(106 of a ResNet-50's 318 merges a step). Its debiased averages were such on
alike workers (106 more) until the hidden averages they are computed from
came to be merged at the step's end (`context.DeferredMerges`): a read of
those before the merge is not the same anywhere, so they are merged there
too, in the same all-reduce.
"""

import hashlib
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

# A captured handle -> (its variable's key, the local replica whose copy it is), or None.
CopyOf = Callable[[object], Optional[Tuple[int, int]]]
# Whether a ReadVariableOp reads a copy written in the step but not merged yet
# (`context.DeferredMerges.read_after_write`): replicas may hold different values.
ReadAfterWrite = Callable[[tf.Operation], bool]
_NEVER = lambda op: False

# Ops that compute each output element from the same elements of their inputs
# (or only move them), with no state: the same inputs give the same bits.
_ELEMENTWISE = frozenset({
    "Identity", "Cast", "StopGradient", "Snapshot",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv",
    "FloorMod", "Neg", "Reciprocal", "Square", "SquaredDifference", "Sqrt",
    "Rsqrt", "Pow", "Exp", "Log", "Log1p", "Abs", "Sign", "Floor", "Ceil", "Round",
    "Maximum", "Minimum", "Equal", "NotEqual", "Less", "LessEqual", "Greater",
    "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "Select", "SelectV2",
    "Reshape", "ExpandDims", "Squeeze", "ZerosLike", "OnesLike", "Fill", "Shape",
    "Size", "Rank", "BroadcastTo", "ReadVariableOp",
})


# The name of `repl.replica_id`'s constant, which differs from replica to replica.
REPLICA_ID = "replica_id"

# Ops whose integer or boolean results are the same bits on any machine.
_EXACT = frozenset({
    "Identity", "Cast", "StopGradient", "Snapshot", "Add", "AddV2", "Sub", "Mul",
    "Neg", "FloorDiv", "FloorMod", "Abs", "Sign", "Square", "Maximum", "Minimum",
    "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
    "LogicalAnd", "LogicalOr", "LogicalNot", "Select", "SelectV2", "Reshape",
    "ExpandDims", "Squeeze", "ZerosLike", "OnesLike", "Fill", "BroadcastTo",
    "ReadVariableOp",
})


def same_on_every_worker(value: tf.Tensor, copy_of: CopyOf, alike: bool = False,
                         read_after_write: ReadAfterWrite = _NEVER
                         ) -> Optional[List[str]]:
  """The constants on which `value` is the same bits on every worker, or None.

  Not None: `value` is computed by exact integer or boolean ops from reads of
  variables (of which every worker holds the same copies) and from constants,
  and is the same on every worker where the returned descriptions of those
  constants are. Where the workers are `alike` (the same TensorFlow on the
  same hardware, `peers.kernel_fingerprint`), also by elementwise ops on
  floats: the same kernel on the same inputs gives the same bits. A read of
  a copy whose merge waits for the step's end (`read_after_write`) is not
  the same anywhere.
  """
  allowed = _ELEMENTWISE if alike else _EXACT
  if not tf.is_symbolic_tensor(value):
    return None
  captured = None  # built once a placeholder is met, as `_Walk` does
  constants = []  # in the walk's order, which the same program gives every worker
  seen = set()
  pending = [value]
  while pending:
    tensor = pending.pop()
    if id(tensor) in seen:
      continue
    seen.add(id(tensor))
    op = tensor.op
    if not alike and not all(t.dtype.is_integer or t.dtype.is_bool
                             for t in list(op.inputs) + op.outputs if t.dtype != tf.resource):
      return None
    if op.type == "Const":
      if re.fullmatch(REPLICA_ID + r"(_\d+)?", op.name.rsplit("/", 1)[-1]):
        return None  # one replica's id (one replica a worker: no local check saw it)
      values = tf.make_ndarray(op.get_attr("value"))
      constants.append(
          f"{tensor.dtype.name} {values.tolist()}" if values.size <= 8 else
          f"{tensor.dtype.name}{list(values.shape)} sha256 "
          + hashlib.sha256(values.tobytes()).hexdigest()[:12])
    elif op.type == "Placeholder":
      if captured is None:
        captured = _captured_by(value.graph)
      external = captured.get(id(tensor))
      if external is None or copy_of(external) is None:
        return None  # an argument, or a value captured from this process
    elif op.type in allowed and not read_after_write(op):
      pending.extend(op.inputs)
    else:
      return None
  return constants


def same_on_every_replica(values: Sequence[tf.Tensor], copy_of: CopyOf,
                          read_after_write: ReadAfterWrite = _NEVER) -> bool:
  """Whether `values` (local replica r's in place r) hold the same bits at run time.

  `copy_of` says which variable, and which replica's copy of it, a resource
  handle the step captured is (`variable_registry.copy_of_handle`);
  `read_after_write`, which reads see a copy before its merge.
  """
  if any(not tf.is_symbolic_tensor(value) for value in values):
    return False
  graph = values[0].graph
  if any(value.graph is not graph for value in values):
    return False
  return _Walk(graph, copy_of, read_after_write).same(tuple(values))


def _captured_by(graph) -> Dict[int, object]:
  """The id of each placeholder of `graph` that captured something -> that thing."""
  return {id(internal): external for external, internal in graph.captures}


def _attrs(op) -> dict:
  """`op`'s attributes but TensorFlow's own (`_class`: colocation, which differs by device)."""
  return {key: value for key, value in op.node_def.attr.items() if not key.startswith("_")}


class _Walk:
  """One comparison, memoized over tuples of tensors (one per replica)."""

  def __init__(self, graph, copy_of: CopyOf, read_after_write: ReadAfterWrite):
    self._graph = graph
    self._captured = None  # id of a placeholder -> what it captured, once needed
    self._copy_of = copy_of
    self._read_after_write = read_after_write
    self._known: Dict[Tuple[int, ...], bool] = {}

  def same(self, tensors: Tuple[tf.Tensor, ...]) -> bool:
    key = tuple(id(t) for t in tensors)
    if key not in self._known:
      self._known[key] = False  # (a cycle, through a loop's inputs, is not the same)
      self._known[key] = self._compare(tensors)
    return self._known[key]

  def _compare(self, tensors) -> bool:
    if all(t is tensors[0] for t in tensors):
      return True  # one tensor every replica uses: one value
    ops = [t.op for t in tensors]
    kind = ops[0].type
    if (any(op.type != kind for op in ops) or
        any(t.value_index != tensors[0].value_index for t in tensors)):
      return False
    if kind == "Placeholder":
      return self._same_copies(tensors)
    attrs = [_attrs(op) for op in ops]
    if any(a != attrs[0] for a in attrs):
      return False
    if kind == "Const":
      return True
    if kind == "IdentityN":  # (collectives' outputs, for their gradients) output i is input i
      return self.same(tuple(op.inputs[t.value_index] for op, t in zip(ops, tensors)))
    if kind not in _ELEMENTWISE or any(len(op.inputs) != len(ops[0].inputs) for op in ops):
      return False
    if any(self._read_after_write(op) for op in ops):
      return False
    return all(self.same(tuple(op.inputs[i] for op in ops))
               for i in range(len(ops[0].inputs)))

  def _same_copies(self, placeholders) -> bool:
    """Whether replica r's placeholder captures the handle of copy r of one variable."""
    if self._captured is None:
      self._captured = _captured_by(self._graph)
    owners = set()
    for replica, placeholder in enumerate(placeholders):
      external = self._captured.get(id(placeholder))
      copy = self._copy_of(external) if external is not None else None
      if copy is None or copy[1] != replica:
        return False
      owners.add(copy[0])
    return len(owners) == 1
