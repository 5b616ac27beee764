"""What in a traced step has effects, and the gate that holds them.

A step that runs only if its batches arrived (`CompiledStep._trace_single`)
is called after a gate that raises `OutOfRangeError` when they did not; every
op of the step with effects waits for the gate, reads and arithmetic may
start earlier. Stateful random ops keep their state in their kernels, so a
step that has them always runs in the loop (one stream per compiled step).
"""

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from replicator.engine import creation


def draws_from_kernel_state(graph, initializers=frozenset()) -> bool:
  """Whether `graph` has stateful random ops (`tf.random.uniform`, dropout).

  Each such op keeps its generator state in its kernel, and every compiled
  function has kernels of its own: two functions tracing the same step
  with the same seeds would each start the same stream again. The ops named
  in `initializers` (variables' initial values, which run once outside the
  step) do not count.
  """
  graph_def = graph.as_graph_def()
  nodes = [node for node in graph_def.node if node.name not in initializers]
  for function in graph_def.library.function:
    nodes.extend(function.node_def)
  for op_type in {node.op for node in nodes}:
    op_def = op_def_registry.get(op_type)
    if op_def is not None and op_def.is_stateful and any(
        attr.name == "seed2" for attr in op_def.attr):
      return True
  return False


# The gate's op (`CompiledStep._gate`): its OutOfRangeError means the data ran out.
RAN_OUT = "replicator_input_ran_out"
GATE_SPEC = tf.TensorSpec([], tf.int64)


def open_gate() -> tf.Tensor:
  return tf.constant(0, tf.int64)  # the gate where nothing is held


def hold_effects(ops, gate: tf.Tensor):
  """Makes every op in `ops` that has effects wait for `gate`.

  Effects: a write, a random draw, a print, a collective, a `tf.cond` that
  holds any. Ops that compute, or read, may run before it. One copy of the
  gate per device.
  """
  held = {}
  for op in ops:
    if op.type in creation.READS or not op.op_def.is_stateful:
      continue
    device = op.device
    if device not in held:
      with tf.device(device):
        held[device] = tf.identity(gate).op
    op._add_control_inputs([held[device]])  # pylint: disable=protected-access
