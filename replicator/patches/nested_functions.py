"""A `tf.function` that step_fn calls is traced for each replica.

`tf.function` keeps one trace per input signature, and nothing about the
replica being traced is part of its key. Left alone, replica 1 would run the
trace made for replica 0 (replica 0's copies of the variables; its updates
would skip the replicas' aggregation). So, while a replica is being traced:
- a `tf.function` without `jit_compile` is traced inline, as if its decorator
  were absent (run() compiles the whole step anyway): collectives, optimizer
  updates and variable creation inside it behave as in step_fn itself;
- a `tf.function(jit_compile=True)` keeps its function boundary (XLA needs
  it) and gets a copy of its own per replica and per trace of the step; so
  does one with `experimental_attributes` (Grappler's implementation selector
  swaps such functions for their GPU versions, as Sonnet's LSTMs use), and one
  with an `input_signature` (which turns Python numbers into tensors).
A concrete function made outside the step holds the copies it was traced with
and cannot be retraced (it keeps no Python function): calling it in a step
that would give it another replica's copies is an error.

Where one trace serves every replica (the strategy engine's on a TPU), the
replica's `static_local_index()` is None and nothing of this is needed. Both
replace a `__call__` of TensorFlow's, only while a step is traced.
"""

from tensorflow.python.autograph.core import converter
from tensorflow.python.autograph.impl import api as autograph_api

from replicator.collectives import replica_context
from replicator.variables import registry


def calls_per_replica(original_call):
  """`tf.function`'s `__call__`, which in a replica's trace calls as above."""
  def call(function, *args, **kwargs):
    replica = replica_context.current()
    index = None if replica is None else replica.static_local_index()
    # Outside a step, where one trace serves every replica, or run eagerly.
    if index is None or function._run_functions_eagerly:  # pylint: disable=protected-access
      return original_call(function, *args, **kwargs)
    copies, key = replica.function_copies, (id(function), index)
    # pylint: disable-next=protected-access
    if function._jit_compile or function._attributes or function.input_signature:
      if key not in copies:  # the function is kept alive with its copy
        copies[key] = (function, function._clone(None))  # pylint: disable=protected-access
      return original_call(copies[key][1], *args, **kwargs)
    if not function._autograph:  # pylint: disable=protected-access
      return function.python_function(*args, **kwargs)
    # As tf.function itself traces with AutoGraph (user_requested: a method's
    # weakly bound `self` is unwrapped as there), with its features (by
    # default none: no name scope of the function's name around its body).
    return autograph_api.converted_call(
        function.python_function, args, kwargs,
        options=converter.ConversionOptions(
            recursive=True, user_requested=True,
            optional_features=function._experimental_autograph_options))  # pylint: disable=protected-access
  return call


def concrete_calls_checked(original_call):
  """A concrete function's `__call__`, which refuses another replica's copies.

  One made outside the step (`f.get_concrete_function()`) has captured the
  copies it was traced with (the first replica's, or every copy for an
  update), so it cannot follow the replica that calls it.
  """
  def call(function, *args, **kwargs):
    replica = replica_context.current()
    if replica is not None:
      this = replica.static_local_index()  # None: one trace serves every replica
      for variable in function.variables:
        index = registry.copy_index(variable)
        if index is not None and index != this:
          name = function.name
          name = name.decode() if isinstance(name, bytes) else name
          on = f"on replica {this}" if this is not None else "in a step"
          raise ValueError(
              f"step_fn called the concrete function {name!r}, which was "
              f"traced with replica {index}'s copy of variable {variable.name!r}, "
              f"{on}: a concrete function made outside the "
              "step (get_concrete_function) keeps the copies it was traced with. "
              "Call the tf.function itself inside step_fn.")
    return original_call(function, *args, **kwargs)
  return call
