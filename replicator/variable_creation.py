"""Where replicated variables come from: the factory of `repl.context()`.

Under `VariableFactory.scope()` a variable is created once, on the first
replica's device, and wrapped in a `ReplicatedVariable` whose copies are made
as soon as its value exists (at once when eager, after the trace otherwise).
"""

import contextlib
import threading
from typing import Callable, List, Sequence

import tensorflow as tf

from replicator import variable_registry
from replicator import variables

_local = threading.local()


class VariableFactory:
  """Creates `ReplicatedVariable`s for variables made under `scope()`."""

  def __init__(self, devices: Sequence[str]):
    self._devices = tuple(devices)
    self._pending: List[variables.ReplicatedVariable] = []
    self.created: List[variables.ReplicatedVariable] = []  # in creation order

  def _create(self, next_creator: Callable, **kwargs) -> variables.ReplicatedVariable:
    if variable_registry.in_replica_local() or getattr(_local, "creating", False):
      return next_creator(**kwargs)  # nested scopes: replicate only once
    _local.creating = True
    try:
      with tf.device(self._devices[0]):
        primary = next_creator(**kwargs)
    finally:
      _local.creating = False
    variable = variables.ReplicatedVariable(primary, self._devices,
                                  kwargs.get("aggregation"))
    self.created.append(variable)
    if tf.executing_eagerly():
      variable._materialize()  # pylint: disable=protected-access
    else:
      self._pending.append(variable)
    return variable

  @contextlib.contextmanager
  def scope(self):
    with tf.variable_creator_scope(self._create):
      yield

  def materialize_pending(self):
    """Copies the variables created while tracing, once they are initialized."""
    pending, self._pending = self._pending, []
    for variable in pending:
      variable._materialize()  # pylint: disable=protected-access


@contextlib.contextmanager
def no_creation(where: str):
  """Inside, creating a variable raises an error that says why."""

  def refuse(next_creator, **kwargs):
    del next_creator
    raise RuntimeError(
        f"step_fn created the variable {kwargs.get('name')!r} {where}. "
        "Variables may be created on the first run of a step, or inside "
        "repl.context(); create it there, or make step_fn take the same path "
        "on every call.")

  with tf.variable_creator_scope(refuse):
    yield
