"""What in a traced step has effects, and the gate that holds them until the
step's batches arrived (`CompiledStep._trace_single`); reads and arithmetic may
start earlier. Summaries are effects too: only the job's replica 0 records them.
"""

import contextlib

import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops import summary_ops_v2

from replicator.inputs import fetch
from replicator.variables import lifting


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
  return any(op_def is not None and op_def.is_stateful
             and any(attr.name == "seed2" for attr in op_def.attr)
             for op_def in map(op_def_registry.get, {node.op for node in nodes}))


# The gate's op (`Gate`): an OutOfRangeError whose message names it means the
# step did not run (the message is the one sign: patches/error_texts.py).
RAN_OUT = "replicator_input_ran_out"
GATE_SPEC = tf.TensorSpec([], tf.int64)


def open_gate() -> tf.Tensor:
  return tf.constant(0, tf.int64)  # the gate where nothing is held


class Gate:
  """Makes tensors that raise `OutOfRangeError` (from an op in `RAN_OUT`)
  unless a fetch's status (`inputs.fetch`) is ready, keeping that status.

  The `get_next` of an empty iterator is the cheapest op that raises it. The
  status travels in a host variable of no replicator (as `interrupts.StopFlag`),
  written only where the gate raises: `why` reads it.
  """

  def __init__(self):
    with tf.init_scope(), tf.device("/device:CPU:0"):
      self._empty = iter(tf.data.Dataset.range(0))
      self._why = resource_variable_ops.ResourceVariable(
          tf.constant(0, tf.int64), trainable=False, name="replicator_why_not_run")

  def __call__(self, status: tf.Tensor) -> tf.Tensor:
    """A gate for `status`: a bool (false: out of data) or an int64 status."""
    def ran_out():  # (a bool status is false here: out of data)
      code = (fetch.status_tensor(fetch.StepStatus.OUT_OF_DATA)
              if status.dtype == tf.bool else status)
      kept = tf.raw_ops.AssignVariableOp(resource=self._why.handle, value=code)
      with tf.control_dependencies([kept]), tf.name_scope(RAN_OUT):
        return self._empty.get_next()
    return tf.cond(fetch.is_ready(status), open_gate, ran_out)

  def why(self) -> int:
    """The encoded status of the last call its gate stopped."""
    return int(self._why.numpy())


def hold_effects(ops, gate: tf.Tensor):
  """Makes every op in `ops` that has effects wait for `gate`.

  Effects: a write, a random draw, a print, a collective, a `tf.cond` that
  holds any. Ops that compute, or read, may run before it. One copy of the
  gate per device.
  """
  held = {}
  for op in ops:
    if op.type in lifting.READS or not op.op_def.is_stateful:
      continue
    device = op.device
    if device not in held:
      with tf.device(device):
        held[device] = tf.identity(gate).op
    op._add_control_inputs([held[device]])  # pylint: disable=protected-access


def summary_state() -> tuple:
  """This thread's summary writer, step and recording condition.

  TensorFlow keeps them per thread, and the replicas are traced on threads
  of their own: without them, a writer made the default around `run` would
  record nothing in a step.
  """
  state = summary_ops_v2._summary_state  # pylint: disable=protected-access
  return state.writer, state.step, state.is_recording


@contextlib.contextmanager
def summaries(state: tuple, records: bool):
  """In a replica's thread: the tracing thread's summary `state`; `records`
  only on the job's replica 0, so that a step records each summary once, as
  tf.distribute does (a writer made the default inside step_fn included)."""
  current = summary_ops_v2._summary_state  # pylint: disable=protected-access
  saved = (current.writer, current.step, current.is_recording,
           current.is_recording_distribution_strategy)
  current.writer, current.step, current.is_recording = state
  current.is_recording_distribution_strategy = records
  try:
    yield
  finally:
    (current.writer, current.step, current.is_recording,
     current.is_recording_distribution_strategy) = saved
