"""Each step's batches for the local replicas, and whether the step may run.

A step runs only when every replica, on every worker, has a batch (all of one
size, unless the input allows uneven batches), and every worker asked for the
same steps and made the same variables in `repl.context()` since its last run.
`StepStatus` says which stopped a loop; `Replicator.run` raises for it.
"""

import enum
from typing import Callable, Optional, Sequence, Tuple

import tensorflow as tf

from replicator.collectives import between_workers


class StepStatus(enum.IntEnum):
  """Why a call's steps stopped, or whether the next step may run (READY or more).

  In the graph a status is one int64 (`encode`'s), as it travels between the
  workers and through the step loop's variables; `decode` names it. READY and
  below are their values; LAST plus a signal's number: as READY, and a worker
  got that signal, so this step runs and no later one, on every worker
  (`engines.in_graph.interrupts`); INTERRUPTED minus a signal's number: the
  loop stopped between two steps for that signal.
  """
  READY = 1  # every replica has a batch, all one size
  OUT_OF_DATA = 0  # some replica, on some worker, has none
  UNEVEN = -1  # every replica has one, not all one size
  STEPS_DIFFER = -2  # workers asked for different steps: none ran (one, if no input)
  # workers made different variables in repl.context() since their last run (as
  # STEPS_DIFFER: none ran, one if no input; nothing was sent)
  VARIABLES_DIFFER = -3
  DONE = -4  # the loop ran the steps it was asked for
  LAST = 100  # plus a signal's number
  INTERRUPTED = -100  # minus a signal's number


def encode(status: StepStatus, signum: int = 0) -> int:
  """`status` as one int (`StepStatus`); `signum` (> 0) for LAST and INTERRUPTED only."""
  if status is StepStatus.LAST or status is StepStatus.INTERRUPTED:
    if signum <= 0:
      raise ValueError(f"signum: {status.name} needs a signal's number (> 0), got {signum}.")
    return int(status) + signum if status is StepStatus.LAST else int(status) - signum
  if signum:
    raise ValueError(f"signum: {status.name} takes no signal, got {signum}.")
  return int(status)


def decode(code: int) -> Tuple[StepStatus, int]:
  """`(status, signal's number or 0)` of an encoded status (`encode`'s inverse)."""
  code = int(code)
  if code > StepStatus.LAST:
    return StepStatus.LAST, code - StepStatus.LAST
  if code < StepStatus.INTERRUPTED:
    return StepStatus.INTERRUPTED, StepStatus.INTERRUPTED - code
  return StepStatus(code), 0


def status_tensor(status: StepStatus, signum: Optional[tf.Tensor] = None) -> tf.Tensor:
  """`encode(status, signum)` as an int64 tensor, `signum` one too (LAST, INTERRUPTED)."""
  if signum is None:
    return tf.constant(encode(status), tf.int64)
  if status is not StepStatus.LAST and status is not StepStatus.INTERRUPTED:
    raise ValueError(f"signum: {status.name} takes no signal.")
  base = tf.constant(int(status), tf.int64)
  return base + signum if status is StepStatus.LAST else base - signum


def is_ready(status: tf.Tensor) -> tf.Tensor:
  return status if status.dtype == tf.bool else tf.greater_equal(status, StepStatus.READY)


def interrupted(signum: tf.Tensor) -> tf.Tensor:
  """The status of a loop that `signum` (an int64, > 0) stopped."""
  return status_tensor(StepStatus.INTERRUPTED, signum)


def why_stopped(status: tf.Tensor, signum: Optional[Callable[[], tf.Tensor]] = None
                ) -> tf.Tensor:
  """The status as an int64.

  A bool status stops when out of data, or, given `signum` (the read of the
  loop's stop flag, `engines.in_graph.interrupts.StopFlag`), where a signal stopped it.
  """
  if status.dtype != tf.bool:
    return status
  if signum is None:
    return status_tensor(StepStatus.OUT_OF_DATA)
  flag = signum()
  return tf.where(tf.equal(flag, 0), status_tensor(StepStatus.OUT_OF_DATA), interrupted(flag))


def _batch_size(value) -> tf.Tensor:
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int64)
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  # -1 for a scalar (a leaf of unknown rank may turn out to be one): one size
  # for every replica's scalar, so a step of scalars is never uneven
  return tf.concat([tf.shape(value, out_type=tf.int64), [-1]], 0)[0]


def agreed_element_spec(element_spec, keys, device: str):
  """`element_spec` with each dim that is not one static size on every worker unknown.

  A batch dim static on one worker (`drop_remainder=True`) and unknown on
  another is then traced alike on every worker: one program, the same
  collectives. Two collectives, once per compiled step.
  """
  if keys is None or element_spec is None:
    return element_spec
  leaves = tf.nest.flatten(element_spec, expand_composites=False)
  shaped = [isinstance(s, _SHAPED) and s.shape.rank is not None for s in leaves]
  dims = [-1 if d is None else d
          for leaf, has_shape in zip(leaves, shaped) if has_shape
          for d in leaf.shape.as_list()]

  fewest, most = between_workers.checked_min_and_max([len(dims)], keys, device)
  if fewest != most or not dims:  # other structures: the program check says so
    return element_spec
  low, high = between_workers.checked_min_and_max(dims, keys, device)
  agreed = iter([l if l == h and l >= 0 else None for l, h in zip(low, high)])
  return tf.nest.pack_sequence_as(element_spec, [
      _with_shape(leaf, [next(agreed) for _ in leaf.shape]) if has_shape else leaf
      for leaf, has_shape in zip(leaves, shaped)])


_SHAPED = (tf.TensorSpec, tf.RaggedTensorSpec, tf.SparseTensorSpec)
# (value, shape): `value` with only the static `shape`.
_unknown = tf.compat.v1.placeholder_with_default


def _with_shape(spec, shape):
  if isinstance(spec, tf.RaggedTensorSpec):
    return tf.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank,
                               spec.row_splits_dtype)
  if isinstance(spec, tf.SparseTensorSpec):
    return tf.SparseTensorSpec(shape, spec.dtype)
  return tf.TensorSpec(shape, spec.dtype, spec.name)


def relaxed(element, spec):
  """`element` with the static shapes of `spec` (`agreed_element_spec`'s)."""
  def relax(value, leaf):
    if not isinstance(leaf, _SHAPED) or value.shape == leaf.shape:
      return value
    if isinstance(value, tf.RaggedTensor):  # its row counts and inner dims
      inner = leaf.shape[value.ragged_rank + 1:]
      ragged = tf.RaggedTensor.from_nested_row_splits(
          _unknown(value.flat_values, [None] + inner),
          [_unknown(splits, [None]) for splits in value.nested_row_splits],
          validate=False)
      # Its uniform dims, where the workers agreed on them, stay static.
      ragged._set_shape(leaf.shape)  # pylint: disable=protected-access
      return ragged
    if isinstance(value, tf.SparseTensor):  # its dense shape, dim by dim
      dense_shape = _unknown(value.dense_shape, [leaf.shape.rank])
      return tf.SparseTensor(value.indices, value.values, tf.stack(
          [dense_shape[i] if dim is None else tf.constant(dim, tf.int64)
           for i, dim in enumerate(leaf.shape.as_list())]))
    return _unknown(value, leaf.shape)
  return tf.nest.map_structure(relax, element, spec, expand_composites=False)


class BatchFetcher:
  """The local replicas' batches for one compiled step, and whether it may run."""

  def __init__(self, devices: Sequence[str], num_replicas: int, keys,
               uneven_batches: bool):
    self._devices = tuple(devices)
    self._num_replicas = num_replicas
    self._keys = keys
    self._uneven_batches = uneven_batches

  def sizes_to_compare(self, element_spec):
    """`(leaf, static batch size or None)` whose size `fetch` compares: the first
    leaf with a batch dimension (a leaf of unknown rank, from `tf.py_function`
    say, may have one; a scalar's size counts as -1, even). With none (all
    scalars), or `allow_uneven_batches`, the size counts as static (0): only
    workers' data is compared. None where nothing is (one replica, or one
    worker with a static batch size): `fetch`'s status is then a bool.
    """
    leaf, static_size = None, 0
    for index, spec in enumerate(tf.nest.flatten(element_spec)):
      shape = getattr(spec, "shape", None)
      if shape is not None and (shape.rank is None or shape.rank):
        leaf, static_size = index, None if shape.rank is None else shape[0]
        break
    if self._uneven_batches:
      static_size = 0
    if self._num_replicas == 1 or (self._keys is None and static_size is not None):
      return None
    return leaf, static_size

  def fetch(self, iterator, steps=None, pending=None, signum=None):
    """Takes one element per local replica: `(optionals, status)`.

    Where batches cannot be uneven (`sizes_to_compare`), `status` is a bool
    (true: ready), as cheap as can be in the loop. Elsewhere it is READY when
    every replica, on every worker, got a batch and all are one size; else
    OUT_OF_DATA, or UNEVEN when the sizes differ (`allow_uneven_batches` says
    why such a step does not run). Workers compare always, in one collective,
    so that every worker runs the same collectives whatever its dataset's
    shapes; given `steps` and `pending`, it also compares the workers' `steps`
    (STEPS_DIFFER) and the digests of the variables each made in
    `repl.context()` since its last run (VARIABLES_DIFFER). Given `signum`
    (this worker's stop flag: 0 or a signal's number), READY becomes LAST plus
    the largest of the workers'.
    """
    optionals = [iterator.get_next_as_optional() for _ in self._devices]
    got_all = tf.reduce_all(tf.stack([o.has_value() for o in optionals]))
    compared = self.sizes_to_compare(iterator.element_spec)
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
      if steps is not None:  # and (min, -max) over workers of steps and pending
        state += [steps, -steps, pending, -pending]
      if signum is not None:  # and the largest signal any worker got
        state.append(-signum)
      state = between_workers.across_workers(tf.stack(state), "Min", self._keys)
      ready = status_tensor(StepStatus.READY)
      if signum is not None:
        ready = tf.where(tf.equal(state[-1], 0), ready, status_tensor(StepStatus.LAST, -state[-1]))
      status = tf.where(
          state[0] > 0,
          tf.where(tf.equal(state[1], -state[2]), ready, status_tensor(StepStatus.UNEVEN)),
          status_tensor(StepStatus.OUT_OF_DATA))
      if steps is not None:
        status = tf.where(tf.equal(state[5], -state[6]), status,
                          status_tensor(StepStatus.VARIABLES_DIFFER))
        status = tf.where(tf.equal(state[3], -state[4]), status,
                          status_tensor(StepStatus.STEPS_DIFFER))
    return optionals, status

  def agree_on_steps(self, steps, pending, step, signum):
    """`(steps, status)` after step `step`: 0 and STEPS_DIFFER where workers
    asked for different ones, 0 and VARIABLES_DIFFER where their `pending`
    digests differ, `step + 1` and INTERRUPTED minus the largest `signum` (a
    worker's stop flag) where one is not 0."""
    with tf.device(self._devices[0]):
      fewest, most = between_workers.min_and_max_across_workers(
          tf.stack([steps, pending, signum]), self._keys)
      same = tf.equal(fewest, most)
      stop = most[2] > 0
      status = tf.where(same[1], tf.where(stop, interrupted(most[2]),
                                          status_tensor(StepStatus.READY)),
                        status_tensor(StepStatus.VARIABLES_DIFFER))
      return (tf.where(tf.logical_and(same[0], same[1]),
                       tf.where(stop, step + 1, steps), tf.constant(0, tf.int64)),
              tf.where(same[0], status, status_tensor(StepStatus.STEPS_DIFFER)))
