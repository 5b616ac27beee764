"""Replicated variables: one copy per local replica, kept identical.

Inside a step, replica `r` reads and writes its own copy; a write is merged
over the replicas first (`merge_rules`), so the copies never drift (a mean or
the first replica's value, where merges are collectives, at the step's end:
`deferred`). Outside a step, reads see copy 0 and writes go to every copy.
"""

import functools
from typing import List, Sequence

import tensorflow as tf
from tensorflow.python.eager import record
from tensorflow.python.framework import tensor_conversion_registry
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable
from tensorflow.python.types import core

from replicator.variables import deferred
from replicator.collectives import reductions
from replicator.collectives import replica_context
from replicator.collectives import gathering
from replicator.collectives import reduce_options
from replicator.variables import merge_rules
from replicator.variables import registry

_Aggregation = tf.VariableAggregation


class _Collectives:
  """The collectives of the in-graph replica `replica` that `merge_rules` uses,
  as `Replica`'s but each a rendezvous named `what` (as errors name the
  write), with no gradient: a write never needs one."""

  def __init__(self, replica, what: str):
    self.num_replicas = replica.group.num_replicas
    self._group = replica.group
    self._collective = functools.partial(replica.collective, what)

  def all_reduce(self, flat, op, options):
    group = self._group
    return self._collective(flat, lambda values: reductions.all_reduce(
        values, op, group.devices, options, num_replicas=group.num_replicas,
        keys=group.keys))

  def all_gather(self, flat, axis):
    group = self._group
    return self._collective(flat, lambda values: gathering.all_gather(
        values, axis, group.devices, group.keys))

  def broadcast(self, flat, source):
    group = self._group
    return self._collective(flat, lambda values: reductions.broadcast(
        values, source, group.devices, group.first_replica_id, group.keys))


class ReplicatedVariable(tf.Variable, core.Tensor):
  """A `tf.Variable` with one copy on each local replica's device.

  A `core.Tensor`, as a `tf.Variable` and tf.distribute's variables are, so
  that `tf.is_tensor` is true for it and TensorFlow's ops take it where they
  check for a tensor (`tf.nn.dropout`'s `rate`, say).
  """

  def __init__(self, primary: tf.Variable, devices: Sequence[str],
               aggregation=_Aggregation.NONE):
    # pylint: disable=super-init-not-called
    self._vars = [primary]
    self._devices = tuple(devices)
    self._aggregation = aggregation or _Aggregation.NONE
    self._rule = merge_rules.Rule.of(self._aggregation, primary.dtype,
                                     primary.synchronization)
    # A step read this variable between a write and the step's end, where it
    # matters: its writes are merged where they are made (`_defers`).
    self._merge_at_write = False
    registry.register_copy(primary, 0, self)

  def _materialize(self):
    """Creates the copies of replicas 1.. from the (initialized) primary."""
    primary = self._vars[0]
    name = primary.name.split(":")[0] + "_replica"
    with tf.init_scope():
      # `tf.saved_model.load` creates variables without a value and restores
      # them afterwards (through `_restore_from_tensors`, into every copy).
      uninitialized = not bool(resource_variable_ops.var_is_initialized_op(
          primary.handle))
      value = None if uninitialized else primary.read_value()
      for device in self._devices[len(self._vars):]:
        with tf.device(device):
          if uninitialized:
            copy = resource_variable_ops.UninitializedVariable(
                trainable=primary.trainable, shape=primary.shape,
                dtype=primary.dtype, name=name)
          else:
            copy = resource_variable_ops.ResourceVariable(
                value, trainable=primary.trainable, dtype=primary.dtype,
                shape=primary.shape, name=name)
        registry.register_copy(copy, len(self._vars), self)
        self._vars.append(copy)

  def _should_act_as_resource_variable(self):
    """Makes `resource_variable_ops.is_resource_variable` accept it."""

  @property
  def replicas(self) -> List[tf.Variable]:
    """The per-replica copies, in local replica order."""
    return list(self._vars)

  @property
  def _current(self) -> tf.Variable:
    replica = replica_context.current()
    if replica is None:
      return self._vars[0]
    # `% copies` serves a step of a replicator on other devices than the one
    # that made the variable (evaluating on one device a model trained on
    # several, say): the copies are identical, so any one reads right.
    return self._vars[replica.index % len(self._vars)]

  def _copy_to_write(self, replica) -> tf.Variable:
    """This replica's copy, if the step runs on the variable's own devices."""
    if replica.group.devices != self._devices:
      raise ValueError(
          f"A step on {len(replica.group.devices)} replica(s) "
          f"({', '.join(replica.group.devices)}) updates the variable "
          f"{self.name!r}, which was made for {len(self._devices)} replica(s) "
          f"({', '.join(self._devices)}) by another replicator's context: only "
          "some copies would change and they would drift apart. Create the "
          "model (and optimizer) inside this replicator's context, or restore "
          "a checkpoint into one made there; reading it (evaluation) is fine.")
    return self._vars[replica.index]

  # Reads and identity: delegated to this replica's copy.
  name = property(lambda self: self._vars[0].name)
  dtype = property(lambda self: self._vars[0].dtype)
  shape = property(lambda self: self._vars[0].shape)
  trainable = property(lambda self: self._vars[0].trainable,
                       doc="Whether gradients are taken for it (as tf.Variable).")
  constraint = property(lambda self: self._vars[0].constraint)
  synchronization = property(lambda self: self._vars[0].synchronization,
                             doc="The `tf.VariableSynchronization` it was made with.")
  _reduce_op = property(lambda self: self._rule.reduce_op)
  aggregation = property(lambda self: self._aggregation,
                         doc="How a write inside a step merges over replicas "
                             "(`tf.VariableAggregation`; NONE: a float mean).")
  _unique_id = property(lambda self: self._vars[0]._unique_id)  # pylint: disable=protected-access
  _shared_name = property(lambda self: self._vars[0]._shared_name)  # pylint: disable=protected-access
  _in_graph_mode = property(lambda self: self._vars[0]._in_graph_mode)  # pylint: disable=protected-access
  device = property(lambda self: self._current.device)
  handle = property(lambda self: self._current.handle,
                    doc="The resource handle of the copy on the current replica's device.")
  graph = property(lambda self: self._current.graph)
  initializer = property(lambda self: self._vars[0].initializer)
  initial_value = property(lambda self: self._vars[0].initial_value)

  def value(self):
    return self._current.value()

  def read_value(self):
    return self._current.read_value()

  def numpy(self):
    """The value as a NumPy array (every copy holds the same value)."""
    return self._vars[0].numpy()

  def __array__(self, dtype=None):
    return self._vars[0].__array__(dtype)

  def __int__(self):
    return int(self.numpy())

  def __float__(self):
    return float(self.numpy())

  def __bool__(self):
    return bool(self.numpy())

  def __tf_tracing_type__(self, signature_context):
    """As a `tf.function` argument: this replica's copy (outside a step, the first)."""
    spec = self._current.__tf_tracing_type__(signature_context)
    return _CopySpec(spec.shape, spec.dtype, trainable=spec.trainable,
                     alias_id=spec.alias_id)

  def sparse_read(self, indices, name=None):
    return self._current.sparse_read(indices, name=name)

  def gather_nd(self, indices, name=None):
    return self._current.gather_nd(indices, name=name)

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    return self._current._dense_var_to_tensor(  # pylint: disable=protected-access
        dtype=dtype, name=name, as_ref=as_ref)

  def __repr__(self):
    return (f"<replicator.ReplicatedVariable {self.name!r} shape={self.shape} "
            f"dtype={self.dtype.name} replicas={len(self._vars)}>")

  # Writes: merged as `merge_rules` says, then written to this replica's copy.
  def _write(self, write, value, merge, outside=lambda results: results[0]):
    """`write(copy, value)`: on every copy outside a step (`outside` picks what
    to return); inside, on this replica's copy, once `merge(replica, value)`
    has made the value common to every replica."""
    replica = replica_context.current()
    if replica is None:
      return outside([write(v, value) for v in self._vars])
    copy = self._copy_to_write(replica)
    if not replica_context.local_writes() and replica.group.num_replicas > 1:
      value = merge(replica, value)
    return deferred.written_here(replica, copy, lambda: write(copy, value))

  def _update(self, method: str, value, read_value: bool):
    def merge(replica, value):
      value = tf.convert_to_tensor(value, self.dtype)
      if self._defers(replica):  # written here, merged at the step's end
        return self._deferred(replica, value)
      return self._rule.dense(method, value, self._vars[replica.index].read_value,
                              _Collectives(replica, f"an update of variable {self.name}"))
    return self._write(lambda copy, value: getattr(copy, method)(value, read_value=read_value),
                       value, merge, outside=lambda ops: ops[0] if read_value else tf.group(ops))

  def _defers(self, replica) -> bool:
    """Whether this write's merge waits for the step's end (`deferred.StepWrites`).

    A mean's and a first replica's value's may, where merges are collectives
    (between GPUs or workers: one launch or round trip for all the step's
    writes); where they are sums in the graph (the CPUs of one worker),
    packing them only adds ops that Grappler pays for in the first step
    (benchmarks.runs.first_step). Not inside a `tf.cond` or loop of step_fn,
    where the end could not follow, nor for booleans, which no all-reduce takes.
    """
    group = replica.group
    return (self._reduce_op in (reduce_options.ReduceOp.MEAN, None)
            and not self._merge_at_write and self.dtype != tf.bool
            and reductions.merged_by_collectives(group.devices, group.keys)
            and tf.compat.v1.get_default_graph() is group.step_graph)

  def _deferred(self, replica, value):
    """`value`, unmerged: the replicas meet here (in order, as at any write),
    and the merge of this variable is added to the step's end."""
    value, = replica.collective(f"an update of variable {self.name}", [value],
                                lambda values: values)
    replica.group.trace.add(
        self, tf.compat.v1.get_default_graph().capture(self._vars[replica.index].handle))
    return value

  def _strided_slice_assign(self, begin, end, strides, value, name, begin_mask,
                            end_mask, ellipsis_mask, new_axis_mask,
                            shrink_axis_mask):
    """`var[...].assign(value)`: the slice's value is merged (`merge_rules`)."""
    def write(copy, value):
      return copy._strided_slice_assign(  # pylint: disable=protected-access
          begin=begin, end=end, strides=strides, value=value, name=name,
          begin_mask=begin_mask, end_mask=end_mask, ellipsis_mask=ellipsis_mask,
          new_axis_mask=new_axis_mask, shrink_axis_mask=shrink_axis_mask)

    def merge(replica, value):
      return self._rule.dense("slice", tf.convert_to_tensor(value, self.dtype), None,
                              _Collectives(replica, f"an update of variable {self.name}"))
    return self._write(write, value, merge)

  def assign(self, value, use_locking=None, name=None, read_value=True):
    return self._update("assign", value, read_value)

  def assign_add(self, delta, use_locking=None, name=None, read_value=True):
    return self._update("assign_add", delta, read_value)

  def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
    return self._update("assign_sub", delta, read_value)

  # Checkpoints hold one copy; restoring writes every copy.
  def _serialize_to_tensors(self):
    return {trackable.VARIABLE_VALUE_KEY: self._vars[0]}

  def _restore_from_tensors(self, restored_tensors):
    value = restored_tensors[trackable.VARIABLE_VALUE_KEY]
    return tf.group([v.assign(value) for v in self._vars])

  def _export_to_saved_model_graph(self, object_map, tensor_map, options,
                                   **kwargs):
    first = self._vars[0]
    resources = first._export_to_saved_model_graph(  # pylint: disable=protected-access
        object_map, tensor_map, options, **kwargs)
    object_map[self] = object_map[first]
    tensor_map[self] = tensor_map[first.handle]
    return resources

  # `tf.saved_model.load` inside `repl.context()`: TensorFlow binds a loaded
  # function's capture of a distributed variable to the variable itself, not
  # to one handle, and its wrapper (`load._WrapperFunction`) reads `.handle` at
  # each call: inside a step that is the calling replica's copy. Without it
  # every replica would read, and differentiate, the first copy.
  is_distributed_variable = True

  def __tf_experimental_restore_capture__(self, concrete_function,
                                          internal_capture):
    concrete_function.graph.replace_capture(self, internal_capture)
    record.record_operation("captured_value", [internal_capture], [self],
                            backward_function=lambda x: [x],
                            forward_function=lambda x: [x])
    return self

  def _write_object_proto(self, proto, options):
    """A SavedModel holds it as one plain variable (the first copy's value)."""
    resource_variable_ops.write_object_proto_for_resource_variable(
        self, proto, options)


tensor_conversion_registry.register_tensor_conversion_function(
    ReplicatedVariable,
    lambda var, dtype=None, name=None, as_ref=False: var._dense_var_to_tensor(  # pylint: disable=protected-access
        dtype=dtype, name=name, as_ref=as_ref))


class _CopySpec(resource_variable_ops.VariableSpec):
  """A `ReplicatedVariable` passed to a `tf.function`: its current copy goes in."""

  def to_tensors(self, value):
    return super().to_tensors(_copy(value))

  def cast(self, value, casting_context):
    return super().cast(_copy(value), casting_context)


def _scatter(method: str):
  """`ReplicatedVariable.<method>`, a scatter: every replica applies the rows of
  all (`merge_rules.Rule.rows`)."""
  def rows(self, replica, indices, values):
    return self._rule.rows(method, indices, values, self.dtype,  # pylint: disable=protected-access
                           _Collectives(replica, f"a {method} of variable {self.name}"))

  if method.startswith("scatter_nd"):
    def write(self, indices, updates, name=None):
      return self._write(  # pylint: disable=protected-access
          lambda copy, args: getattr(copy, method)(*args), (indices, updates),
          lambda replica, args: rows(self, replica, *args), outside=tf.group)
  else:
    def write(self, sparse_delta, use_locking=False, name=None):
      if not isinstance(sparse_delta, tf.IndexedSlices):
        raise TypeError(
            f"sparse_delta: {method} of {self.name!r} expects a tf.IndexedSlices, "
            f"got {type(sparse_delta).__name__}.")

      def merge(replica, delta):
        indices, values = rows(self, replica, delta.indices, delta.values)
        return tf.IndexedSlices(values, indices, delta.dense_shape)
      return self._write(  # pylint: disable=protected-access
          lambda copy, delta: getattr(copy, method)(delta), sparse_delta, merge)
  write.__name__ = method
  return write


for _method in merge_rules.SCATTERS:
  setattr(ReplicatedVariable, _method, _scatter(_method))


def _copy(value):
  return value._current if isinstance(value, ReplicatedVariable) else value  # pylint: disable=protected-access
