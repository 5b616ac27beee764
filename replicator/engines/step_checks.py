"""The errors of a step that cannot run, each saying what to do instead.

TensorFlow reports these deep in a graph dump, or not at all (a variable made
outside every context would silently be shared by the replicas, workers that
traced different collectives would wait for each other forever). Here they are
found on the traced step, or recognized in TensorFlow's error, and explained in
terms of step_fn.
"""

import re

import tensorflow as tf
from tensorflow.python.util import nest

from replicator import errors
from replicator.collectives import between_workers
from replicator.collectives import replica_context
from replicator.multiworker import peers
from replicator.variables import registry
from replicator.variables import replicated as variables

# "No registered 'PrintV2' OpKernel for XLA_CPU_JIT devices": XLA's refusal, an
# error of no type of its own (patches/error_texts.py, as the other words here).
_XLA_MISSING_KERNEL = re.compile(r"No registered '(\w+)' OpKernel for XLA_\w+_JIT")
_PRINT_OPS = frozenset({"PrintV2", "Print", "StringFormat"})


def xla_unsupported(error: Exception, step_fn, compiled_by: str):
  """The error for ops XLA cannot compile, naming step_fn, the ops and what to
  do instead; None for other errors."""
  ops = sorted(set(_XLA_MISSING_KERNEL.findall(str(error))))
  if not ops:
    return None
  if _PRINT_OPS.intersection(ops):
    fix = ("tf.print cannot run inside the compiled step: return the values "
           "from step_fn and print what run returns (one row per replica)")
  else:
    fix = ("move that computation out of the step: into input_fn "
           "(dataset.map) or after run, on what run returns")
  message = (f"step_fn: {errors.name_of(step_fn)} uses {', '.join(ops)}, which XLA "
             f"cannot compile; {compiled_by}. Fix: {fix}.")
  if isinstance(error, tf.errors.OpError):
    return type(error)(error.node_def, error.op, message)
  # The strategy engine's check compiles to HLO, which reports a ValueError.
  return tf.errors.InvalidArgumentError(None, None, message)


# How TensorFlow, Keras and Sonnet say that a tensor has the wrong rank or shape.
_SHAPE_WORDS = re.compile(r"rank|shape|ndim|dims\b|dimension", re.IGNORECASE)


def explained(error: Exception, step_fn, input_fn, element_spec):
  """The error a step's `error` should raise instead, in terms of step_fn and
  input_fn, or None.

  Outputs whose shapes differ between replicas fail where they are stacked.
  Each replica takes one element a step, of any rank (a per-replica seed or
  index is a scalar), so an element without a batch dimension is no error. A
  step written for a batch fails on a shape when it gets one example instead:
  there, where the element has a scalar leaf, the error adds that `input_fn`
  may have forgotten `.batch()`. Errors of the library's own (`step_fn: ...`)
  already say what to do, and keep their words.
  """
  if (isinstance(error, tf.errors.InvalidArgumentError)
      and _STACKED_OUTPUTS in str(error)):  # stacking the outputs failed at run time
    return type(error)(error.node_def, error.op, different_output_shapes(step_fn))
  if element_spec is None or not (isinstance(error, tf.errors.InvalidArgumentError)
                                  or type(error) in (ValueError, TypeError)):
    return None
  text = str(error)
  if text.startswith(("step_fn", "input_fn")) or not _SHAPE_WORDS.search(text):
    return None
  scalars = [(path, spec) for path, spec in nest.flatten_with_joined_string_paths(
      element_spec) if getattr(spec, "shape", None) is not None and spec.shape.rank == 0]
  if not scalars:
    return None
  path, spec = scalars[0]
  where = f"element's leaf {path!r}" if path else "element"
  message = (
      f"{text.rstrip()}\n\ninput_fn: {errors.name_of(input_fn)} gives each replica one "
      f"element a step, and its {where} is a scalar ({spec}), with no batch "
      f"dimension. If step_fn {errors.name_of(step_fn)} expects a batch, batch "
      "the dataset in input_fn: return ds.batch(ctx.per_replica_batch_size("
      "GLOBAL_BATCH), drop_remainder=True).")
  if isinstance(error, tf.errors.OpError):
    return type(error)(error.node_def, error.op, message)
  return type(error)(message)


def check_outputs(outputs, step_fn):
  def check(leaf):
    if leaf is None or isinstance(leaf, tf.Tensor):
      return leaf
    if isinstance(leaf, tf.Variable):
      return tf.convert_to_tensor(leaf)
    raise TypeError(
        f"step_fn: {errors.name_of(step_fn)} returned "
        f"{type(leaf).__name__} {leaf!r} in {outputs!r}; return tensors (wrap "
        "Python numbers with tf.constant, or leave them out).")
  return tf.nest.map_structure(check, outputs)


def with_nones(structure, tensors):
  """`structure` (step_fn's outputs) with `tensors` in place of its leaves that
  are not None: a compiled step carries only the tensor leaves, so one that
  returns nothing (or a nest with None in it) runs as one that returns tensors."""
  tensors = iter(tensors)
  return tf.nest.pack_sequence_as(structure, [
      None if leaf is None else next(tensors) for leaf in tf.nest.flatten(structure)])


# the stacking op's name, by which `explained` knows its failure (in the
# error's message)
_STACKED_OUTPUTS = "outputs_of_every_replica"


def different_output_shapes(step_fn, shapes=None) -> str:
  """The error for replicas whose outputs differ in shape."""
  found = f" ({', '.join(str(s) for s in shapes)})" if shapes else ""
  return (
      f"step_fn: {errors.name_of(step_fn)} returned an output "
      f"whose shape differs from replica to replica{found}; run stacks each "
      "output over the replicas, so it must have one shape on all of them. "
      "Reduce it inside the step (repl.all_sum, a mean), or pad it to a fixed "
      "size and return a mask with it.")


def stack_over_replicas(values, step_fn):
  """One output leaf of every replica, stacked (its shape checked first)."""
  shapes = [value.shape for value in values]
  if not all(shape.is_compatible_with(shapes[0]) for shape in shapes):
    raise ValueError(different_output_shapes(step_fn, shapes))
  if values[0].dtype == tf.uint16:  # stacked copies of one value become a Tile: no uint16 kernel
    return tf.cast(tf.stack([tf.cast(v, tf.int32) for v in values],
                            name=_STACKED_OUTPUTS), tf.uint16)
  return tf.stack(values, name=_STACKED_OUTPUTS)


def data_dependent_initializer(error, step_fn) -> ValueError:
  """The error for a variable that step_fn initializes from the step's input."""
  return ValueError(
      f"step_fn: {errors.name_of(step_fn)} "
      "creates a variable whose initial value depends on the step's input "
      "(data-dependent initialization, as in ActNorm); variables made in "
      "the step are initialized before any batch arrives. Create it before "
      "run: call the module once on a sample batch inside `with "
      "repl.context():`, or create it with a placeholder value and assign "
      f"the data's value in the step. ({str(error).splitlines()[0][:300]})")


def created_on_another_replica(replica: int, first: int, what: str) -> str:
  """The error for `what`, made by replica `replica` in the first trace, where
  replica `first` (this worker's first) makes every variable."""
  collective = replica_context.current().group.last_collective
  causes = ("step_fn branches on the replica id around it"
            if collective is None else
            f"step_fn checked whether to create it (a module's first call, `if "
            f"self.v is None`) before a collective ({collective}) and created it "
            f"after: the replicas are traced in turn from one collective to the "
            f"next, so replica {replica} checked before replica {first} had made "
            f"it. Create such variables before the step's first collective (with a "
            f"placeholder value, assigning the collective's result to them on "
            f"the first step), or inside repl.context(). Or "
            f"step_fn branches on the replica id around it")
  return (f"step_fn created {what} on replica {replica} in its first run, where "
          f"replica {first} makes every variable for all replicas and the others "
          f"find them made; replica {replica} did not. Either {causes}: take the "
          "same path on every replica.")


class ProgramsDiffer(ValueError):
  """Workers traced different collectives for one step (`variables_differ`: made
  different variables in it): it must not run."""

  def __init__(self, message: str, variables_differ: bool = False):
    super().__init__(message)
    self.variables_differ = variables_differ


def check_same_program(step_fn, keys, device: str, issued_before: int,
                       new_variables=()):
  """On several workers: raises unless every worker traced the same collectives.

  Workers whose step_fn took other Python branches (an extra collective on
  the chief, say) would pair collectives with different keys and wait for
  each other forever; collectives of different shapes or dtypes abort every
  collective of the process for good. Compared before the step first runs
  (their number and a digest of their kinds, dtypes and ranks; then their
  static dims, where a dim unknown on a worker matches any), they raise
  `ProgramsDiffer`, with their keys aligned again for the steps that follow.
  So do the `new_variables` (made in the first run, or in `repl.context()`
  since the last run): their number and a digest of their dtypes and shapes.
  """
  signatures = keys.signatures(issued_before)
  digest = peers.digest(f"{kind} {dtype} {None if dims is None else len(dims)}"
                   for kind, dtype, dims in filter(None, signatures))
  made = peers.variable_kinds(new_variables)
  min_and_max = lambda values: between_workers.checked_min_and_max(values, keys, device)
  low, high = min_and_max([len(signatures), digest, keys.shape_slots,
                           len(made), peers.digest(made)])
  (fewest, low_digest, _, fewest_made, low_made) = low
  (most, high_digest, most_slots, most_made, high_made) = high
  # Where this raises, the counters move on to the furthest worker's.
  keys.shape_slots = most_slots
  if fewest != most:
    keys.issued = issued_before + most
  if (fewest_made, low_made) != (most_made, high_made):
    raise ProgramsDiffer(
        f"step_fn: {errors.name_of(step_fn)}: worker {keys.worker_index} made "
        f"{len(made)} variable(s) in its first run or in repl.context() since "
        f"the last run ({peers.listed(made)}), "
        f"and the workers from {fewest_made} to {most_made} or other ones, so the "
        "chief's initial values cannot be given to every worker; each keeps its "
        f"own, and the step does not run. {_SAME_PROGRAM}", variables_differ=True)
  if fewest != most:
    raise ProgramsDiffer(
        f"step_fn: {errors.name_of(step_fn)} traced "
        f"{len(signatures)} cross-worker collective(s) on worker "
        f"{keys.worker_index} and from {fewest} to {most} on the "
        f"workers, so they would wait for each other forever. {_SAME_PROGRAM}")
  dims = [d for _, _, ds in filter(None, signatures) for d in ds or ()]
  if low_digest == high_digest and dims:  # the same number of dims everywhere
    unknown_high, unknown_low = -1, 1 << 62  # a dim unknown here matches any
    low, high = min_and_max([unknown_low if d is None else d for d in dims]
                            + [unknown_high if d is None else d for d in dims])
    if all(h == unknown_high or l == h
           for l, h in zip(low[:len(dims)], high[len(dims):])):
      return
  elif low_digest == high_digest:
    return
  listed = [f"{kind} {dtype}{'[?]' if ds is None else list(ds)}"
            for kind, dtype, ds in filter(None, signatures)]
  raise ProgramsDiffer(
      f"step_fn: {errors.name_of(step_fn)} traced collectives of other "
      f"dtypes or shapes on other workers (this worker, {keys.worker_index}: "
      f"{'; '.join(listed[:8])}{'; ...' if len(listed) > 8 else ''}); run, they "
      f"would abort every collective of this process. {_SAME_PROGRAM}")


_SAME_PROGRAM = (
    "Every worker must run the same program: take the same Python branches in "
    "step_fn (branch on tensors, not on the worker index), build the same "
    "models and call run with the same step_fn, input_fn and args, in the same "
    "order.")


# Ops that write a resource variable (their first input is its handle).
_VARIABLE_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                    "ResourceScatter", "ResourceApply", "ResourceSparseApply",
                    "ResourceStridedSliceAssign")


def _made_outside(what: str) -> str:
  """The error for a step that uses a variable of no replicator context."""
  return (f"step_fn {what} created outside every replicator context, so each "
          "replica would update one shared copy. Create it inside `with "
          "repl.context():` (or on the first run of the step).")


def check_writes(graph, num_devices: int, num_replicas: int = 1,
                 library_writes=frozenset()):
  """Refuses writes to a variable made outside every replicator context, and
  writes to a replicated variable that bypass its merge.

  `check_variables` sees the variables a step reads; one that is only
  written (`assign_add(x, read_value=False)`) is found here, as a captured
  resource that no replicated or replica-local variable owns, written by
  an op of the step's own graph (not inside a `tf.cond` of it). So is a
  write to a replicated variable's copy through its handle
  (`tf.raw_ops.AssignVariableOp(resource=v.handle, ...)`, a TF1 optimizer's
  `ResourceApply*`): not one of `library_writes`, the ops by which the
  variable's own methods wrote it, it changes one replica's copy alone.
  """
  if num_replicas < 2:
    return
  # What each written handle captured: a variable of no context (foreign,
  # checked where this worker has several replicas), or a replica's copy.
  captured = {id(internal): external for external, internal in graph.captures
              if external.dtype == tf.resource}
  known = registry.component_handles() if num_devices > 1 else None
  for op in graph.get_operations():
    if not (op.type.startswith(_VARIABLE_WRITES) and op.inputs):
      continue
    external = captured.get(id(op.inputs[0]))
    if external is None:
      continue
    if known is not None and id(external) not in known:
      what = f" of dtype {op.inputs[1].dtype.name}" if len(op.inputs) > 1 else ""
      raise ValueError(_made_outside(
          f"writes a variable{what} ({op.type} {op.name!r}) that was"))
    if op not in library_writes and registry.copy_of_handle(external) is not None:
      raise ValueError(
          f"step_fn writes the variable {registry.name_of_handle(external)!r} "
          f"through its handle ({op.type} {op.name!r}), which changes only the copy "
          "of the replica that runs it, so the replicas' copies would drift apart. "
          "Write it with its own methods (assign, assign_add, assign_sub, "
          "scatter_*), which merge every replica's value, and train it with an "
          "optimizer wrapped by repl.wrap_optimizer(...).")


def check_variables(graph, num_devices: int):
  if num_devices < 2:
    return
  for variable in graph._watched_variables:  # pylint: disable=protected-access
    # (a function loaded from a SavedModel watches the ReplicatedVariable itself)
    if not (registry.is_component(variable) or
            isinstance(variable, variables.ReplicatedVariable)):
      generator = ("" if "StateVar" not in variable.name else
                   " If it is a tf.random.Generator's state (such as "
                   "tf.random.get_global_generator()'s), make the generator "
                   "inside the context, or use repl.random_generator(seed).")
      raise ValueError(_made_outside(f"uses the variable {variable.name!r}, which was")
                       + generator)
