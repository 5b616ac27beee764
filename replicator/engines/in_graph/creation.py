"""Where the in-graph engine's variables come from: the factory of `repl.context()`.

Under `VariableFactory.scope()` a variable is created once, on the first
replica's device, and wrapped in a `ReplicatedVariable` whose copies are made
as soon as its value exists (at once when eager, after the trace otherwise).

Variables that the first trace of a step creates (under `creating()`) are made
as `variables.lifting` makes them on both engines. Left to `tf.function`, each
would be an `UnliftedInitializerVariable`, which builds a `tf.cond` per variable
into the trace and makes `tf.function` trace the step a second time, which for
a lazily built deep model is more than half of the first trace (see
benchmarks/RESULTS.md, "Time to the first training step").
"""

import contextlib
import threading
from typing import Callable, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from replicator.variables import lifting
from replicator.variables import registry
from replicator.variables import replicated as variables

_local = threading.local()


class VariableFactory:
  """Creates `ReplicatedVariable`s for variables made under `scope()`."""

  def __init__(self, devices: Sequence[str]):
    self._devices = tuple(devices)
    self._pending: List[variables.ReplicatedVariable] = []
    self.created: List[variables.ReplicatedVariable] = []  # in creation order
    self._lifting: Optional[lifting.Lifting] = None  # while a trace may create (`creating`)
    self._to_fill: List[variables.ReplicatedVariable] = []  # copies to fill
    # The initial values being computed (`creating(background=True)`), until `ready`.
    self._running: Optional[lifting.Running] = None
    # The lifting that left values to the chief's (`creating(left_to_chief=True)`),
    # and the variables whose copies then stayed empty.
    self._left: List[lifting.Lifting] = []
    self._unfilled: List[variables.ReplicatedVariable] = []

  def _create(self, next_creator: Callable, **kwargs) -> variables.ReplicatedVariable:
    if registry.in_replica_local() or getattr(_local, "creating", False):
      return next_creator(**kwargs)  # nested scopes: replicate only once
    _local.creating = True
    try:
      primary = None
      if self._lifting is not None and tf.inside_function():
        primary = self._lifting.create(next_creator, kwargs)
      if primary is None:
        with tf.device(self._devices[0]):
          primary = next_creator(**kwargs)
    finally:
      _local.creating = False
    variable = variables.ReplicatedVariable(primary, self._devices,
                                            kwargs.get("aggregation"))
    self.created.append(variable)
    if tf.executing_eagerly() or self._lifting is not None:
      # In a trace under `creating()` the copies are made now, uninitialized (the
      # other replicas' traces use them), and filled when the trace ends.
      variable._materialize()  # pylint: disable=protected-access
      if not tf.executing_eagerly():
        self._to_fill.append(variable)
    else:
      self._pending.append(variable)
    return variable

  def scope(self):
    return tf.variable_creator_scope(self._create)

  # The `lifting.VariableMaker` of this engine: a replicated variable's first copy.
  def make(self, next_creator, kwargs, shape, value) -> tf.Variable:
    """Made on the first replica's device, uninitialized, as `tf.function`'s
    own variables (which ignore other creators alike)."""
    del next_creator
    with tf.device(self._devices[0]):
      return resource_variable_ops.UninitializedVariable(
          trainable=kwargs.get("trainable"), caching_device=kwargs.get("caching_device"),
          name=kwargs.get("name"), shape=shape, dtype=value.dtype,
          constraint=kwargs.get("constraint"),
          synchronization=kwargs.get("synchronization", tf.VariableSynchronization.AUTO),
          aggregation=kwargs.get("aggregation", tf.VariableAggregation.NONE),
          extra_handle_data=value)

  def holds_value(self, variable) -> bool:
    return bool(resource_variable_ops.var_is_initialized_op(variable.handle))

  def assign(self, variable, value):
    variable.assign(value, read_value=False)  # the other copies: `_fill_copies`

  @contextlib.contextmanager
  def creating(self, background: bool = False, left_to_chief: bool = False):
    """Inside, a trace may create variables (see above); they are ready after,
    or, with `background`, once `ready` returns (their initial values are
    computed meanwhile, on a thread of their own). With `left_to_chief`,
    drawn values are not computed (`lifting.Lifting.initialize`): the
    chief's must be sent, or `initialize_left` called.

    Yields a set that gets the names of the trace's ops that compute the initial
    values (they run once, not in the step).

    On leaving by an error, the variables made inside get their initial values
    and their copies at once: a step that raised after building the model
    leaves it whole.
    """
    self.ready()  # (an earlier trace's)
    self._lifting = lifting.Lifting(self)
    initializers = set()
    try:
      with self.scope():
        yield initializers
    except BaseException:
      self._initialize(initializers, background=False)
      raise
    self._initialize(initializers, background, left_to_chief)

  def _initialize(self, initializers: set, background: bool, left_to_chief: bool = False):
    made, self._lifting = self._lifting, None
    initializers.update(made.initializer_names())
    self._running = None
    try:
      self._running = made.initialize(background, left_to_chief)
      if made.left:
        self._left.append(made)
    finally:
      if self._running is None:
        self._finish()

  def initialize_left(self, sent: bool = False):
    """Where `creating(left_to_chief=True)` left values to the chief's: once
    they were `sent`, forgets them; else (an error stopped the call first)
    computes here those that did not come, so that the model is whole."""
    left, self._left = self._left, []
    unfilled, self._unfilled = self._unfilled, []
    if sent or not left:
      return
    for made in left:
      made.initialize_left()
    self._fill_copies(unfilled)

  def ready(self):
    """Returns once the variables made in `creating(background=True)` hold
    their initial values, and their copies too; raises the error computing
    them raised."""
    running, self._running = self._running, None
    if running is None:
      return
    try:
      running.wait()
    except BaseException:
      self._left = []  # none hold values: the step is traced anew
      raise
    finally:
      self._finish()

  def _finish(self):
    made, self._to_fill = self._to_fill, []
    unfilled = self._fill_copies(made)
    if self._left:
      self._unfilled += unfilled
    # Copies the variables created while tracing, now that they are initialized.
    pending, self._pending = self._pending, []
    for variable in pending:
      variable._materialize()  # pylint: disable=protected-access

  def _fill_copies(self, made) -> list:
    """Gives the copies of `made` (made in a trace) their variable's initial
    value, unless something initialized them meanwhile (a checkpoint's
    deferred restore); returns those whose first copy holds no value (as the
    trace's error, or `left_to_chief`, left it)."""
    unfilled = []
    with tf.init_scope():
      for variable in made:
        primary = variable.replicas[0]
        if not resource_variable_ops.var_is_initialized_op(primary.handle):
          unfilled.append(variable)
          continue
        value = primary.read_value()
        for copy in variable.replicas[1:]:
          if not resource_variable_ops.var_is_initialized_op(copy.handle):
            copy.assign(value, read_value=False)
    return unfilled
