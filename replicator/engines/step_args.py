"""How `run`'s `args` reach the compiled step, and when they compile it again.

Variables in `args` travel by reference, so that each replica uses its own
copy; the rest decides, by its signature, which trace of step_fn a call runs.
Python numbers are compiled in, so a warning says when they keep changing.
"""

import logging

import numpy as np
import tensorflow as tf

from replicator import errors


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


def by_reference(args):
  if not any(isinstance(leaf, tf.Variable) for leaf in tf.nest.flatten(args)):
    return args
  return tf.nest.map_structure(
      lambda leaf: _ByReference(leaf) if isinstance(leaf, tf.Variable) else leaf, args)


def dereference(args):
  return tf.nest.map_structure(
      lambda leaf: leaf.variable if isinstance(leaf, _ByReference) else leaf, args)


def converted_call(step_fn, *inputs):
  """`step_fn(*inputs)`, converted by AutoGraph as the trace that calls it is."""
  return tf.__internal__.autograph.tf_convert(
      step_fn, tf.__internal__.autograph.control_status_ctx())(*inputs)


def signature(args):
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


class PythonNumbers:
  """The Python numbers in the last call's `args` of one step_fn."""

  def __init__(self, step_fn):
    self._step_fn = step_fn
    self._numbers = None
    self._warned = False

  def warn_if_changed(self, args):
    """Python numbers in `args` are compiled in: a new value compiles again."""
    numbers = tuple(
        leaf if isinstance(leaf, (int, float, np.number))
        and not isinstance(leaf, (bool, np.bool_)) else None
        for leaf in tf.nest.flatten(args))
    previous, self._numbers = self._numbers, numbers
    if (previous is None or len(previous) != len(numbers) or
        self._warned or
        not any(a is not None and b is not None and a != b
                for a, b in zip(previous, numbers))):
      return
    self._warned = True
    logging.warning(
        "replicator: run(%s, args=...) got Python numbers that changed since the "
        "last call (%s -> %s). A Python number is compiled into the step, so each "
        "new value compiles it again (seconds each time); pass values that change "
        "from call to call as tensors, e.g. args=(tf.constant(lr),).",
        errors.name_of(self._step_fn), previous, numbers)
