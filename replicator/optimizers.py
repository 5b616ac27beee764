"""`wrap_optimizer`: any Sonnet 2 or Keras 3 optimizer, made replica-aware."""

import logging
from typing import Optional, Sequence

import keras
import sonnet as snt
import tensorflow as tf

from replicator.collectives import replica_context
from replicator.collectives import reduce_options
from replicator.collectives import in_step


def _kind(optimizer) -> str:
  if isinstance(optimizer, keras.optimizers.Optimizer):
    return "keras"
  if isinstance(optimizer, snt.Optimizer):
    return "sonnet"
  raise TypeError(
      f"optimizer: expected a Sonnet 2 optimizer (snt.optimizers.*) or a Keras 3 "
      f"optimizer (keras.optimizers.*), got {type(optimizer).__name__} "
      f"({optimizer!r}). Create one, e.g. snt.optimizers.Adam(1e-3), and pass "
      "it to repl.wrap_optimizer.")


def _as_tf_variable(variable):
  """A Keras 3 variable's TensorFlow variable, which a Sonnet optimizer can update:
  Sonnet makes its slots with `variable_like`, which reads `.device`, and a Keras
  3 variable has none ("'Variable' object has no attribute 'device'")."""
  inner = getattr(variable, "_value", None) if isinstance(variable, keras.Variable) else None
  return inner if isinstance(inner, tf.Variable) else variable


def _reduce_op_fix(value) -> str:
  """The replicator.ReduceOp a string or tf.distribute.ReduceOp stands for."""
  name = getattr(value, "name", value)
  if isinstance(name, str) and name.upper() in ("MEAN", "SUM"):
    return f"; pass replicator.ReduceOp.{name.upper()}"
  return ""


def _clip_by_global_norm(grads, clip_norm):
  """`tf.clip_by_global_norm` for gradients of several float dtypes (TensorFlow's
  stacks the per-tensor norms, which fails on mixed dtypes): the norm and the
  scaling in float32 (float64 if a gradient is), each gradient cast back."""
  wide = (tf.float64 if any(g is not None and g.dtype == tf.float64 for g in grads)
          else tf.float32)
  clipped, _ = tf.clip_by_global_norm(
      [None if g is None else tf.cast(g, wide) for g in grads], clip_norm)
  return [None if g is None else tf.cast(c, g.dtype)
          for c, g in zip(clipped, grads)]


_warned_fp16 = []


def _warn_fp16_gradients():
  """Once per process: float16 gradients overflow and underflow silently."""
  if not _warned_fp16:
    _warned_fp16.append(True)
    logging.warning(
        "wrap_optimizer: gradients are all-reduced with Compression.FP16: a "
        "gradient or a sum above 65504 becomes inf and one below 3e-8 (times "
        "the number of replicas, for the mean) becomes 0, silently. "
        "Compression.BF16 halves the bytes too and keeps float32's range.")


def _assigns_a_variable(optimizer, name) -> bool:
  """Whether setting `name` assigns a variable (Keras' learning_rate)."""
  attribute = getattr(type(optimizer), name, None)
  return (isinstance(attribute, property) and attribute.fset is not None and
          isinstance(getattr(optimizer, name), (tf.Variable, keras.Variable)))


class ReplicatedOptimizer(tf.Module):
  """Averages gradients over replicas, then applies the base optimizer once.

  Built by `Replicator.wrap_optimizer`; it has the methods of the optimizer it
  wraps (`apply` for Sonnet; `apply_gradients` and `apply` for Keras) and
  forwards every other attribute (`learning_rate`, `iterations`, ...) to it.
  With `accumulate_steps=k`, each list of variables given to `apply` counts
  its own apply calls and applies the mean of its last k gradients on the k-th
  (docs/design.md, "Optimizers").
  """

  def __init__(self, optimizer, *, clip_global_norm: Optional[float] = None,
               gradient_reduction=reduce_options.ReduceOp.MEAN,
               accumulate_steps: int = 1,
               all_reduce: Optional[reduce_options.AllReduceOptions] = None):
    super().__init__(name="replicated_optimizer")
    self._kind = _kind(optimizer)
    if gradient_reduction not in (reduce_options.ReduceOp.MEAN,
                                  reduce_options.ReduceOp.SUM):
      raise ValueError(
          f"gradient_reduction: expected replicator.ReduceOp.MEAN (loss is a "
          f"per-replica mean) or replicator.ReduceOp.SUM (loss already divided "
          f"by the global batch), got {gradient_reduction!r}"
          f"{_reduce_op_fix(gradient_reduction)}.")
    if clip_global_norm is not None and not clip_global_norm > 0:
      raise ValueError(
          f"clip_global_norm: expected a positive number or None, got "
          f"{clip_global_norm!r}.")
    if not isinstance(accumulate_steps, int) or accumulate_steps < 1:
      raise ValueError(
          f"accumulate_steps: expected an int >= 1, got {accumulate_steps!r}.")
    all_reduce = reduce_options.check_options(all_reduce)
    if all_reduce.compression is reduce_options.Compression.FP16:
      _warn_fp16_gradients()
    self._base = optimizer
    self._clip_global_norm = clip_global_norm
    self._gradient_reduction = gradient_reduction
    self._accumulate_steps = accumulate_steps
    self._all_reduce = all_reduce
    # Tracked (checkpointed) in creation order; `_lists` finds them.
    self._accumulators = []  # one per variable
    self._accumulated = []  # apply calls counted, one per parameter list
    self._lists = _ParameterLists()
    self._compiled = False  # whether a tf.function traced an apply

  @property
  def optimizer(self):
    """The wrapped optimizer."""
    return self._base

  @property
  def variables(self):
    """The base optimizer's variables (slots, step count), then the accumulators."""
    return (tuple(self._base.variables) + tuple(self._accumulators) +
            tuple(self._accumulated))

  def __getattr__(self, name):
    if name.startswith("__") or name == "_base":
      raise AttributeError(name)
    return getattr(self._base, name)

  def __setattr__(self, name, value):
    """Sets the base optimizer's public attributes on the base optimizer.

    A value the base reads as a Python number (Sonnet's `learning_rate=0.1`,
    Keras' `beta_1`) is a constant in the steps compiled already, so once a
    step has used this optimizer, setting it raises instead of changing
    nothing. Keras' `learning_rate` is a variable: setting it assigns it.
    """
    base = self.__dict__.get("_base")
    if (base is None or name.startswith("_") or hasattr(type(self), name) or
        not hasattr(base, name)):
      super().__setattr__(name, value)
      return
    if self._compiled and not _assigns_a_variable(base, name):
      raise ValueError(
          f"{name}: the steps already compiled with this optimizer hold its "
          f"value ({getattr(base, name)!r}) as a constant, so setting it would "
          f"not change them. To change it during training make it a variable "
          f"and assign to it: create the optimizer with one, e.g. "
          f"snt.optimizers.SGD(tf.Variable(0.1)) inside repl.context(), and "
          f"call optimizer.{name}.assign(new_value). (A Keras optimizer's "
          f"learning_rate is a variable already: optimizer.learning_rate = x "
          f"works.)")
    setattr(base, name, value)

  # Sonnet: apply(updates, parameters). Keras: apply(grads, trainable_variables).
  def apply(self, updates: Sequence, parameters: Sequence = None):
    """Inside a step: reduces `updates` over replicas, then applies them.

    Sonnet's `apply(updates, parameters)`, or Keras's `apply(grads,
    trainable_variables)` (`parameters` may then be left out). A `None`
    gradient leaves its variable unchanged; all `None` is an error.
    """
    if parameters is None:
      if self._kind != "keras":
        raise TypeError("apply: parameters is required for a Sonnet optimizer.")
      parameters = self._base._trainable_variables  # pylint: disable=protected-access
    return self._apply(list(updates), list(parameters))

  def apply_gradients(self, grads_and_vars):
    """Keras's `apply_gradients([(grad, variable), ...])`, reduced as `apply`."""
    if self._kind != "keras":
      raise AttributeError(
          "apply_gradients is the Keras method; a Sonnet optimizer takes "
          "apply(updates, parameters).")
    pairs = list(grads_and_vars)
    return self._apply([g for g, _ in pairs], [v for _, v in pairs])

  def _apply(self, grads, variables):
    if tf.inside_function():
      self._compiled = True
    if len(grads) != len(variables):
      raise ValueError(
          f"updates/parameters: got {len(grads)} gradients for "
          f"{len(variables)} variables; pass one gradient (or None) per "
          "variable, e.g. tape.gradient(loss, variables).")
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
      raise ValueError(self._no_gradient_message(grads, variables))
    grads = self._checked_dtypes(grads, variables)
    if self._kind == "sonnet":
      variables = [_as_tf_variable(v) for v in variables]
    elif not self._base.built:
      # As Keras' own apply does: built on every variable given, None gradients
      # included, so a variable frozen at first can be trained later.
      with keras.name_scope(self._base.name, caller=self._base):
        self._base.build(variables)
      self._base.built = True
    replica = replica_context.current()
    if replica is None:  # outside a step: a plain update of every copy
      return self._base_apply(grads, variables)
    reduced = [grads[i] for i in present]
    if replica.num_replicas > 1:
      reduced = in_step.all_reduce(reduced, self._gradient_reduction,
                                   self._all_reduce)
    else:  # dense, as the reduction makes them: the same update on 1 or N replicas
      reduced = [tf.convert_to_tensor(g) for g in reduced]
    for i, grad in zip(present, reduced):
      grads[i] = grad
    with replica_context.writing_locally():
      if self._accumulate_steps == 1:
        return self._update(grads, variables)
      return self._accumulate(grads, variables)

  def _no_gradient_message(self, grads, variables) -> str:
    """Why an apply that would change nothing is an error (as on one device)."""
    argument = "updates" if self._kind == "sonnet" else "grads"
    if not variables:
      given = ("apply got no variables, so none would change (a model's "
               "trainable_variables read before its first call, which creates "
               "them, is empty)")
    else:
      more = ", ..." if len(variables) > 3 else ""
      named = ", ".join(getattr(v, "name", "?") for v in variables[:3])
      given = (f"every gradient is None ({len(grads)} of them, for "
               f"[{named}{more}]), so no variable would change: the loss does "
               "not depend on the variables")
    return (f"{argument}: {given}. Check the tape: compute the loss inside "
            "`with tf.GradientTape() as tape:` from the model's output, call "
            "the model before reading its variables, and pass "
            "tape.gradient(loss, variables) with those variables.")

  def _checked_dtypes(self, grads, variables):
    """`grads`, each of a dtype its variable can take, or a TypeError: an integer
    gradient of a float variable, which no mean over replicas takes, is cast to
    the variable's dtype for Keras and refused for Sonnet, as on one device."""
    checked = list(grads)
    for i, (grad, variable) in enumerate(zip(grads, variables)):
      grad_dtype = getattr(grad, "dtype", None)
      if grad_dtype is None:  # a None gradient too
        continue
      grad_dtype, dtype = tf.as_dtype(grad_dtype), tf.as_dtype(variable.dtype)
      if (grad_dtype.is_floating or grad_dtype.is_complex or
          not (dtype.is_floating or dtype.is_complex)):
        continue
      if self._kind != "keras":
        raise TypeError(
            f"updates: the gradient of variable {variable.name!r} is "
            f"{grad_dtype.name}, but the variable is {dtype.name}; an update "
            "must have its variable's dtype. Cast the gradient: "
            f"tf.cast(grad, tf.{dtype.name}).")
      checked[i] = tf.cast(grad, dtype)  # an IndexedSlices' values too
    return checked

  def _update(self, grads, variables):
    if self._clip_global_norm is not None:
      grads = _clip_by_global_norm(grads, self._clip_global_norm)
    return self._base_apply(grads, variables)

  def _base_apply(self, grads, variables):
    """The base's apply, given the `None` gradients if it takes them.

    Sonnet makes its slots on its first apply for every parameter given and
    skips `None` updates; given only the others, a variable frozen at first
    would get no slots and be skipped for good. Keras warns about `None`
    gradients (its `LossScaleOptimizer` fails on them) and is built on every
    variable beforehand, so it gets the others only.
    """
    if self._kind == "keras":
      pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
      grads, variables = [g for g, _ in pairs], [v for _, v in pairs]
    return self._base.apply(grads, variables)

  def _accumulate(self, grads, variables):
    """Adds the gradients to their variables' sums; the k-th apply of this
    list of variables since the last update applies their mean."""
    count, accumulators = self._lists.find(variables)
    if count is None:  # the list's first apply (its step's first trace)
      count = tf.Variable(0, dtype=tf.int64, trainable=False,
                          name="accumulated_steps")
      accumulators = [tf.Variable(tf.zeros_like(v), trainable=False,
                                  name="accumulator") for v in variables]
      self._accumulated.append(count)
      self._accumulators.extend(accumulators)
      self._lists.add(variables, count, accumulators)
    for accumulator, grad in zip(accumulators, grads):
      if grad is not None:
        accumulator.assign_add(tf.cast(grad, accumulator.dtype))
    counted = count.assign_add(1)

    def apply_accumulated():
      scale = 1.0 / self._accumulate_steps
      mean = [None if g is None else tf.cast(a.read_value() * scale, g.dtype)
              for a, g in zip(accumulators, grads)]
      self._update(mean, variables)  # auto control deps: reads, then resets
      for accumulator in accumulators:
        accumulator.assign(tf.zeros_like(accumulator))
      return tf.constant(True)

    return tf.cond(counted % self._accumulate_steps == 0, apply_accumulated,
                   lambda: tf.constant(False))


class _ParameterLists:
  """The lists of variables an accumulating optimizer was applied to.

  Each list has its own count of apply calls and one sum per variable (in
  the list's order), so two step functions that train different variables
  with one optimizer accumulate k gradients each. Lists are matched as sets of
  `id`s (Keras 3 variables are unhashable and have no `ref`); the variables are
  held, so the ids stay theirs. Plain Python, out of tf.Module's tracking: the
  optimizer's own lists hold the accumulators for checkpoints.
  """

  def __init__(self):
    self._lists = []  # (ids, variables in the list's order, count, accumulators)

  def find(self, variables):
    """`(count, accumulators in this order)` of this list; `(None, None)` if new."""
    ids = frozenset(id(v) for v in variables)
    for known, known_variables, count, accumulators in self._lists:
      if known == ids:
        of = {id(v): a for v, a in zip(known_variables, accumulators)}
        return count, [of[id(v)] for v in variables]
      if known & ids:
        raise ValueError(
            f"accumulate_steps: apply got the variables {_names(variables)} "
            f"after {_names(known_variables)}; they share "
            f"{_names(v for v in variables if id(v) in known)}. An "
            "accumulating optimizer counts and sums per list of variables, so "
            "the lists it is applied to must be the same or share none. Pass "
            "the same list at every step (a frozen variable's gradient may be "
            "None), or wrap one optimizer per list.")
    return None, None

  def add(self, variables, count, accumulators):
    self._lists.append((frozenset(id(v) for v in variables), list(variables),
                        count, list(accumulators)))


def _names(variables) -> str:
  return "[" + ", ".join(getattr(v, "name", "?") for v in variables) + "]"
