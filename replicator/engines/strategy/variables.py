"""The variables of the strategy engine: a copy per replica, kept identical.

Every variable is made replica-local (`ON_READ`, read as the first replica's
copy), as Sonnet's own `TpuReplicator` makes them, so that each replica
applies the optimizer's update to its own copy once the gradients are
averaged: no all-reduce per write. Any other write inside a step (a moving
average, a counter) is merged over the replicas at the write, by the rules
both engines share (`variables.merge_rules`).

Variables that the first trace of a step creates are made in a trace of
`step_fn` alone, before `tf.distribute` traces it (`VariableCreator.lifting`):
TPUStrategy cannot create variables inside its step, which is where Sonnet's
`TpuReplicator` fails on a lazily built model.
"""

import contextlib
import threading
from typing import List, Optional

import tensorflow as tf
from tensorflow.python.ops import tensor_getitem_override
from tensorflow.python.trackable import base as trackable

from replicator.collectives import replica_context
from replicator.variables import lifting
from replicator.variables import registry
from replicator.variables import merge_rules

_Aggregation = tf.VariableAggregation
_local = threading.local()
_ON_READ = tf.VariableSynchronization.ON_READ


class _MergedWrites:
  """Placed before a `tf.distribute` variable class: inside a step, a write
  that is not the optimizer's is merged over the replicas first."""

  aggregation = property(lambda self: self._replicator_aggregation)
  # (Keras' variables delegate their writes to ours where it is set.)
  _replicator_reduce_op = property(lambda self: self._replicator_rule.reduce_op)
  replicas = property(lambda self: tuple(self.values),
                      doc="The local copies, in replica order (as the in-graph engine's).")

  # Checkpoints: one plain value per variable (the first copy's, as the
  # in-graph engine saves), restored into every copy as it is. tf.distribute's
  # own restore would divide a SUM variable's value by the replica count (its
  # copies hold parts of a sum; ours hold the sum), and a Keras 3 variable
  # restores through `_restore_from_tensors`, which the delegate would hand to
  # the first copy alone. A restore marks the variable, so that a step's first
  # trace that made it keeps the restored value rather than its initial one.
  def _serialize_to_tensors(self):
    return {trackable.VARIABLE_VALUE_KEY: self._primary.read_value()}

  def _restore_from_tensors(self, restored_tensors):
    self._replicator_restored = True
    tensor = restored_tensors[trackable.VARIABLE_VALUE_KEY]
    writes = []
    for copy in self.values:
      with tf.device(copy.device):
        writes.append(copy.assign(tf.cast(tensor, copy.dtype), read_value=False))
    return tf.group(writes)

  def _use_packed_variable(self):
    # TPUStrategy packs the copies' handles into one (fewer inputs a call).
    # Read outside the TPU's replicate context, as in a trace of step_fn
    # alone, a packed copy is not what a GradientTape watches, so no gradient
    # would reach the variable: there each copy is read as itself.
    replica = replica_context.current()
    return (replica is None or not replica.alone) and super()._use_packed_variable()

  # As a tf.Variable outside a step: the value (the first replica's copy).
  def __int__(self):
    return int(self.read_value())

  def __float__(self):
    return float(self.read_value())

  def __bool__(self):
    return bool(self.read_value())

  def assign(self, value, use_locking=False, name=None, read_value=True):
    return super().assign(self._merged("assign", value), use_locking, name, read_value)

  def assign_add(self, delta, use_locking=False, name=None, read_value=True):
    return super().assign_add(self._merged("assign_add", delta), use_locking, name,
                              read_value)

  def assign_sub(self, delta, use_locking=False, name=None, read_value=True):
    return super().assign_sub(self._merged("assign_sub", delta), use_locking, name,
                              read_value)

  def __getitem__(self, slice_spec):
    # As tf.Variable's: a slice whose assign is this variable's (merged), not
    # the first copy's.
    return tensor_getitem_override._slice_helper_var(self, slice_spec)  # pylint: disable=protected-access

  def _strided_slice_assign(self, begin, end, strides, value, name, begin_mask,
                            end_mask, ellipsis_mask, new_axis_mask,
                            shrink_axis_mask):
    """`var[...].assign(value)`: the slice's value is merged as `assign`'s."""
    del name
    # Written densely: replica-local variables take no slice assignment.
    new = tf.raw_ops.TensorStridedSliceUpdate(
        input=self.read_value(), begin=begin, end=end, strides=strides,
        value=tf.convert_to_tensor(self._merged("slice", value), self.dtype),
        begin_mask=begin_mask, end_mask=end_mask, ellipsis_mask=ellipsis_mask,
        new_axis_mask=new_axis_mask, shrink_axis_mask=shrink_axis_mask)
    return super().assign(new)

  def _merged(self, method, value):
    """`value`, merged over the replicas as `merge_rules` says (`method`: one of
    `merge_rules.DENSE`), where a write in a step merges."""
    replica = self._merging_replica()
    if replica is None:
      return value
    return self._replicator_rule.dense(method, tf.convert_to_tensor(value, self.dtype),
                                       self.read_value, replica)

  def _merging_replica(self):
    """The replica of the step traced here, if this write merges (else None)."""
    replica = replica_context.current()
    if replica is None or replica_context.local_writes() or replica.num_replicas == 1:
      return None
    return replica


def _scatter(method: str):
  """`method` (a scatter): every replica applies the rows that
  `merge_rules.Rule.rows` gives, as a dense update of its copy
  (replica-local variables take no scatter)."""
  nd = method.startswith("scatter_nd")

  def write(self, *args, **kwargs):
    del kwargs  # use_locking, name
    if nd:
      indices, rows = args[0], args[1]
    else:
      delta = args[0]
      if not isinstance(delta, tf.IndexedSlices):
        raise TypeError(
            f"sparse_delta: {method} of {self.name!r} expects a tf.IndexedSlices, "
            f"got {type(delta).__name__}.")
      indices, rows = delta.indices, delta.values
    indices = tf.convert_to_tensor(indices)
    rows = tf.convert_to_tensor(rows, self.dtype)
    replica = self._merging_replica()
    if replica is not None:
      indices, rows = self._replicator_rule.rows(method, indices, rows, self.dtype, replica)
    if not nd:
      indices = tf.expand_dims(indices, -1)
    old = self.read_value()
    kind = method.split("_")[-1]
    if kind in ("mul", "div"):
      current = tf.gather_nd(old, indices)
      rows = current * rows if kind == "mul" else current / rows
      kind = "update"
    new = getattr(tf, f"tensor_scatter_nd_{kind}")(old, indices, rows)
    return super(_MergedWrites, self).assign(new)

  write.__name__ = method
  return write


for _method in merge_rules.SCATTERS:
  setattr(_MergedWrites, _method, _scatter(_method))

_classes = {}  # a tf.distribute variable class -> the class that merges its writes


class VariableCreator:
  """The variable creator of `repl.context()` and of a step's first trace.

  Also the `lifting.VariableMaker` of this engine: a variable that the first
  trace creates is made under the strategy's scope, outside the trace, from
  zeros (a replica-local variable cannot be made without a value), and each
  copy is assigned its initial value after the trace.
  """

  def __init__(self):
    self.created: List[tf.Variable] = []
    self._lifting: Optional[lifting.Lifting] = None  # while a trace may create

  def __call__(self, next_creator, **kwargs):
    if getattr(_local, "creating", False):  # scopes nested: make it once
      return next_creator(**kwargs)
    aggregation = kwargs.get("aggregation") or _Aggregation.NONE
    synchronization = kwargs.get("synchronization") or tf.VariableSynchronization.AUTO
    # The copies stay identical, so the first replica's copy is the value.
    kwargs["synchronization"] = _ON_READ
    if kwargs.get("trainable") is None:  # as tf.Variable decides it
      kwargs["trainable"] = synchronization != _ON_READ
    kwargs["aggregation"] = _Aggregation.ONLY_FIRST_REPLICA
    _local.creating = True
    try:
      if self._lifting is not None and tf.inside_function():
        variable = self._lifting.create(next_creator, kwargs)
        if variable is None:  # a checkpoint's deferred value, read where it is made
          with tf.init_scope():
            variable = next_creator(**kwargs)
      else:
        variable = next_creator(**kwargs)
    finally:
      _local.creating = False
    self.created.append(variable)
    cls = type(variable)
    if cls not in _classes:
      _classes[cls] = type(cls.__name__, (_MergedWrites, cls), {})
    variable.__class__ = _classes[cls]
    for index, copy in enumerate(variable.values):  # (patches.nested_functions)
      registry.register_copy(copy, index, variable)
    variable._replicator_aggregation = aggregation  # pylint: disable=protected-access
    variable._replicator_rule = merge_rules.Rule.of(  # pylint: disable=protected-access
        aggregation, variable.dtype, synchronization)
    return variable

  def make(self, next_creator, kwargs, shape, value) -> tf.Variable:
    with tf.init_scope():
      kwargs["initial_value"] = lifting.zeros_of(shape, value)
      kwargs["shape"] = shape
      kwargs["dtype"] = value.dtype
      return next_creator(**kwargs)

  def holds_value(self, variable) -> bool:
    return getattr(variable, "_replicator_restored", False)

  def assign(self, variable, value):
    for copy in variable.values:  # each copy as itself (not through a packed handle)
      copy.assign(value, read_value=False)

  @contextlib.contextmanager
  def lifting(self):
    """Inside, a trace of step_fn alone may create variables; they hold their
    initial values after (even when the trace raised)."""
    self._lifting = lifting.Lifting(self)
    try:
      yield
    finally:
      made, self._lifting = self._lifting, None
      made.initialize()
