"""A collective's gradient is registered once for the process, not per trace."""

import contextlib
import gc
import weakref

import numpy as np
import tensorflow as tf

# TensorFlow's gradient registry has no public view; its size is what is tested.
from tensorflow.python.framework import ops

from replicator.collectives import in_step
from replicator.collectives import reduce_options
from replicator.collectives import replica_context

DEVICES = ("/device:CPU:0", "/device:CPU:1")


def _step(x):
  y = in_step.all_reduce(tf.tanh(x), reduce_options.ReduceOp.SUM)
  # tf.gradients takes the gradient that TensorFlow's registry gives the op.
  return tf.gradients(tf.reduce_sum(y), x)[0]


def _traced_step():
  """The same step, traced afresh for both replicas in a function of its own."""
  def replicas(x):
    group = replica_context.ReplicaGroup(DEVICES, 0, len(DEVICES))
    return group.run(_step, [[x]] * len(DEVICES), lambda r: contextlib.nullcontext())
  return tf.function(replicas, autograph=False).get_concrete_function(
      tf.TensorSpec([2], tf.float32))


def _registered() -> int:
  return len(ops._gradient_registry.list())  # pylint: disable=protected-access


def test_tracing_a_step_100_times_does_not_grow_tensorflows_gradient_registry():
  x = np.array([0.5, -1.0], np.float32)
  first = _traced_step()
  # Every replica's input gets the sum of both replicas' upstream gradients.
  for gradient in first(tf.constant(x)):
    np.testing.assert_allclose(gradient.numpy(), 2 * (1 - np.tanh(x) ** 2), rtol=1e-6)
  registered = _registered()
  for _ in range(100):
    _traced_step()
  assert _registered() == registered


def test_a_traced_steps_collective_gradients_go_with_its_graph():
  graphs = []
  for _ in range(3):
    graphs.append(weakref.ref(_traced_step().graph))
  gc.collect()
  assert all(graph() is None for graph in graphs)
