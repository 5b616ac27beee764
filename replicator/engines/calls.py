"""A compiled step called at the cost of a hand-written graph call.

`tf.function`'s own dispatch (the function-cache lookup, hashing the
arguments' types, binding them to a signature, flattening) costs as much as a
small model's step. A replicator calls a step with `args` of one signature
call after call, and an input's iterators all have one element structure
(`inputs.streams` refuses another), so `ConcreteCall` keeps the concrete
function of the last signature and hands it the flat tensors it takes.
Arguments it cannot flatten go through the `tf.function`.
"""

from typing import Optional

import numpy as np
import tensorflow as tf


def _flat_inputs(values) -> Optional[list]:
  """The tensors a `tf.function` traced for `values` takes, in its order;
  None where a leaf is of a kind whose flattening is `tf.function`'s to decide."""
  flat = []
  for leaf in tf.nest.flatten(values, expand_composites=True):
    if isinstance(leaf, tf.Tensor):
      flat.append(leaf)
    elif isinstance(leaf, (np.ndarray, tf.Variable)):
      return None
  return flat


class ConcreteCall:
  """Calls `function(*inputs)` through its concrete function.

  `key` says when `inputs` would trace anew (`step_args.signature` of the
  step's `args`): the concrete function is kept while `key` stays the same.
  """

  def __init__(self, function):
    self._function = function
    self._last = None  # (key, concrete function)

  def prepare(self, key, *inputs):
    """The concrete function for `inputs`, traced now where `key` is new."""
    if self._last is None or self._last[0] != key:
      self._last = (key, self._function.get_concrete_function(*inputs))
    return self._last[1]

  def __call__(self, key, *inputs):
    concrete = self.prepare(key, *inputs)
    flat = _flat_inputs(inputs)
    captured = concrete.captured_inputs
    if flat is None or len(concrete.inputs) != len(flat) + len(captured) or any(
        t.dtype != p.dtype for t, p in zip(flat, concrete.inputs)):
      return self._function(*inputs)
    return concrete._call_flat(flat, captured)  # pylint: disable=protected-access
