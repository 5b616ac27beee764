"""Variable writes whose merge over replicas waits for the end of the step.

`StepWrites` records them while a step is traced, and `merge_deferred`
merges them all in one rendezvous at the end of each replica's step
(docs/design.md, "Deferred merges"). `written_here` records the ops by which
the library writes a copy, so that `step_checks.check_writes` can refuse a
write that bypassed the merge.
"""

import tensorflow as tf

from replicator.collectives import reduce_options
from replicator.collectives import reductions
from replicator.collectives import replica_context


class MergeAtWrite(Exception):
  """The step read variables whose merge it deferred: trace it again, merging them
  where they are written (`StepWrites.all_returned`)."""

  def __init__(self, variables):
    super().__init__(", ".join(v.name for v in variables))
    self.variables = variables


class StepWrites:
  """The in-graph engine's record of one step trace's variable writes: the
  `trace` a `collectives.replica_context.ReplicaGroup` carries for the
  replicas' threads (a `replica_context.StepTrace`).

  `library` holds the ops by which replicated variables wrote their copies in
  the step's graph (`written_here`); `engines.step_checks.check_writes`
  refuses any other write of a copy.

  The rest are the writes whose merge waits for the step's end (docs/design.md,
  "Deferred merges"): each replica writes its own copy, and `merge_deferred`
  merges the copies in one rendezvous after step_fn returns. That is the merge
  at the write only while nothing reads the copy in between but what is
  itself written to a deferred variable (Sonnet's debiased average, computed
  from the hidden one): `all_returned` raises `MergeAtWrite` for any other
  read (this replica's value where the merge at the write gives the mean),
  and the step is traced again with those variables merged at their writes.
  """

  def __init__(self):
    self.library = set()
    self.variables = {}  # id of a deferred ReplicatedVariable -> it, in the order first deferred
    self._handles = {}  # id of a copy's handle in the step graph -> (it, its variable)
    self._earlier = {}  # id of that handle -> the ops that used it before the write
    self._own = set()  # the ops of the merge at the end

  def add(self, variable, handle: tf.Tensor):
    """`variable`'s copy, used in the step graph through `handle`, is written next."""
    self.variables.setdefault(id(variable), variable)
    if id(handle) not in self._handles:
      self._handles[id(handle)] = (handle, variable)
      self._earlier[id(handle)] = frozenset(handle.consumers())

  def replica_returned(self):
    """At the end of the current replica's step: `merge_deferred`, if any."""
    if self.variables:
      merge_deferred(self)

  def own(self, ops):
    """`ops` are the end's merge, which reads and writes the copies as it should."""
    self._own.update(ops)

  def all_returned(self, outputs):
    """Raises `MergeAtWrite` for the deferred variables read where it matters."""
    returned = {id(t) for t in tf.nest.flatten(outputs, expand_composites=True)
                if tf.is_tensor(t)}
    read = {}
    for key, (handle, variable) in self._handles.items():
      later = [op for op in handle.consumers()
               if op not in self._earlier[key] and op not in self._own]
      if not all(self._harmless(op, returned) for op in later):
        read[id(variable)] = variable
    if read:
      raise MergeAtWrite(list(read.values()))

  def _harmless(self, op, returned) -> bool:
    """Whether `op`, which uses a copy after a deferred write, only writes it, or
    reads it into nothing but writes of deferred copies (and ops with no effect)."""
    if op.type in _WRITES:
      return True
    if op.type != "ReadVariableOp":
      return False  # a tf.cond, a loop, a sparse read: not followed
    seen, stack = {op}, [op]
    while stack:
      current = stack.pop()
      for tensor in current.outputs:
        if id(tensor) in returned:
          return False
        for consumer in tensor.consumers():
          if consumer in seen:
            continue
          seen.add(consumer)
          if consumer.type in _WRITES and id(consumer.inputs[0]) in self._handles:
            continue  # into a copy merged at the end
          if consumer.op_def is None or consumer.op_def.is_stateful:
            return False
          stack.append(consumer)
    return True


_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def written_here(replica, copy, write):
  """`write()`, which writes `copy` as this module merges it: its ops in the
  step's graph are recorded (`StepWrites.library`), so that
  `step_checks.check_writes` can refuse a write that bypassed the merge."""
  graph = tf.compat.v1.get_default_graph()
  if graph is not replica.group.step_graph:
    return write()  # inside a tf.cond or loop: not checked
  handle = graph.capture(copy.handle)
  before = set(handle.consumers())
  result = write()
  replica.group.trace.library.update(
      op for op in handle.consumers() if op not in before)
  return result


def merge_deferred(deferred: StepWrites):
  """At the end of this replica's step: every deferred variable's copies
  merged and written back, in one rendezvous: the means in one packed
  all-reduce, the first replica's values (integers, ONLY_FIRST_REPLICA) in
  another, a sum in which every other replica gives zeros."""
  replica = replica_context.current()
  group = replica.group
  variables = list(deferred.variables.values())
  copies = [variable._copy_to_write(replica)  # pylint: disable=protected-access
            for variable in variables]
  values = [copy.value() for copy in copies]
  means = [i for i, v in enumerate(variables) if v._reduce_op is not None]  # pylint: disable=protected-access
  firsts = [i for i, v in enumerate(variables) if v._reduce_op is None]  # pylint: disable=protected-access
  first_replica = group.first_replica_id == 0 and replica.index == 0
  given = [value if i in means or first_replica else tf.zeros_like(value)
           for i, value in enumerate(values)]

  def merge(per_replica):
    merged = [[None] * len(values) for _ in per_replica]
    for indices, op in ((means, reduce_options.ReduceOp.MEAN),
                        (firsts, reduce_options.ReduceOp.SUM)):
      if not indices:
        continue
      reduced = reductions.all_reduce(
          [[own[i] for i in indices] for own in per_replica], op, group.devices,
          num_replicas=group.num_replicas, keys=group.keys)
      for own, results in zip(merged, reduced):
        for i, result in zip(indices, results):
          own[i] = result
    return merged

  merged = replica.collective("the merge of the variables written in the step",
                              given, merge)
  writes = [written_here(replica, copy, lambda copy=copy, value=value: copy.assign(
      value, read_value=False)) for copy, value in zip(copies, merged)]
  deferred.own([value.op for value in values] + writes)
