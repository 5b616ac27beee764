"""The replica interface: which replica's step is being traced, on either engine.

`Replica` is what the collectives (`in_step`), the patches, `nn` and the
optimizers ask of the replica traced on this thread; `current()` returns it,
whichever engine entered it. The strategy engine's is
`engines.strategy.collectives.StrategyReplica`; the in-graph engine's is
`ReplicaContext`, whose `ReplicaGroup` traces each local replica in a thread
of its own and pauses it at a collective until every replica has reached it.
Threads run one at a time, in replica order, so graph construction is
deterministic.
"""

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence

import tensorflow as tf

from replicator.collectives import in_graph
from replicator.collectives import reduce_options

_local = threading.local()


class Replica(Protocol):
  """The replica whose part of a step is being traced on this thread.

  The collectives take and return flat lists of tensors (`in_step` checks the
  arguments and handles nests), one result per input, differentiable.
  `method` names the call in errors (`all_sum`); `what`, where given, what the
  tensors are (instead of their count, where the in-graph replicas meet).

  Attributes:
    num_replicas: replicas in the step, on every worker.
    function_copies: where the `tf.function`s that step_fn calls keep a copy
      per replica for this step's trace (`patches.nested_functions`).
    in_tf_distribute_context: whether the step is traced in a `tf.distribute`
      replica context of its replicas, where code written for tf.distribute
      acts across them itself (a Keras optimizer sums its gradients and merges
      its updates); False where it sees the default context of one replica.
  """
  num_replicas: int
  function_copies: Dict[Any, Any]
  in_tf_distribute_context: bool

  def replica_id(self) -> tf.Tensor:
    """This replica's global id, an int32 scalar (known only when the step
    runs where one trace serves every replica)."""

  def static_replica_id(self) -> Optional[int]:
    """This replica's global id where the trace is this replica's alone;
    None where one trace serves every replica (a TPU's)."""

  def static_local_index(self) -> Optional[int]:
    """This replica's index among this worker's replicas (which copy of a
    replicated variable it holds) where the trace is this replica's alone, else None."""

  def all_reduce(self, flat: List[tf.Tensor], op: reduce_options.ReduceOp,
                 options: reduce_options.AllReduceOptions, *,
                 method: str = "all_reduce", what: Optional[str] = None) -> List[tf.Tensor]:
    """Each tensor reduced with `op` over the replicas."""

  def all_gather(self, flat: List[tf.Tensor], axis: int, *, method: str = "all_gather",
                 what: Optional[str] = None) -> List[tf.Tensor]:
    """Each replica's tensor concatenated along `axis`, in replica order (a
    scalar as a vector of one)."""

  def broadcast(self, flat: List[tf.Tensor], source_replica: int, *,
                method: str = "broadcast", what: Optional[str] = None) -> List[tf.Tensor]:
    """Replica `source_replica`'s tensors, on every replica."""

  def reduce_scatter(self, flat: List[tf.Tensor], op: reduce_options.ReduceOp, *,
                     method: str = "reduce_scatter",
                     what: Optional[str] = None) -> List[tf.Tensor]:
    """This replica's slice of each tensor's SUM or MEAN over the replicas.

    Replica r gets rows r * k to (r + 1) * k - 1 (axis 0), k the rows over
    `num_replicas` (`in_step` checks that they divide): this replica's
    `all_reduce` sliced by replica id, with an all-reduce's traffic and
    gradient. An engine with a reduce-scatter of its own may override it.
    """
    reduced = self.all_reduce(flat, op, reduce_options.AllReduceOptions(),
                              method=method, what=what)
    replica_id = self.static_replica_id()
    if replica_id is None:
      replica_id = self.replica_id()
    sliced = []
    for x, total in zip(flat, reduced):
      rows, others = x.shape[0] // self.num_replicas, x.shape.rank - 1
      sliced.append(tf.slice(total, [replica_id * rows] + [0] * others,
                             [rows] + [-1] * others))
    return sliced

  def with_summed_gradient(self, name: str, forward: Callable[..., List[tf.Tensor]],
                           inputs: List[tf.Tensor], grad_fn: Callable) -> List[tf.Tensor]:
    """`forward(*inputs)`, a computation across replicas, with its gradient
    written out: `grad_fn(xs, ys, summed_dys)` maps this replica's float
    inputs, its float outputs and the sums over the replicas of their upstream
    gradients to the float inputs' gradients. A replica whose collectives
    differentiate themselves may differentiate `forward` instead (the same
    values). `name` names the computation in errors."""


def current() -> Optional[Replica]:
  """The replica whose step this thread traces, or None outside a step."""
  return getattr(_local, "replica", None)


@contextlib.contextmanager
def entered(replica: Optional[Replica]):
  """Within, this thread traces `replica`'s part of a step (`current()`)."""
  previous = current()
  _local.replica = replica
  try:
    yield
  finally:
    _local.replica = previous


def local_writes() -> bool:
  """True while updates go straight to this replica's copy (no aggregation)."""
  return getattr(_local, "local_writes", False)


@contextlib.contextmanager
def writing_locally():
  """Inside, variable updates skip cross-replica aggregation (the optimizer's,
  whose inputs are already identical on every replica)."""
  previous = local_writes()
  _local.local_writes = True
  try:
    yield
  finally:
    _local.local_writes = previous


@dataclasses.dataclass(frozen=True)
class ReplicaContext(in_graph.InGraphCollectives, Replica):
  """The in-graph engine's replica: the one whose part of the step is being
  traced on this thread, with the other local replicas of `group`."""
  group: "ReplicaGroup"
  index: int  # local replica index

  in_tf_distribute_context = False
  num_replicas = property(lambda self: self.group.num_replicas)
  function_copies = property(lambda self: self.group.function_copies)

  def replica_id(self) -> tf.Tensor:
    return tf.constant(self.static_replica_id(), tf.int32, name="replica_id")

  def static_replica_id(self) -> int:
    return self.group.first_replica_id + self.index

  def static_local_index(self) -> int:
    return self.index

  def collective(self, name: str, flat_values: List[tf.Tensor],
                 merge: Callable[[List[List[tf.Tensor]]], List[List[tf.Tensor]]]):
    """This replica's part of `merge(every local replica's flat_values)`,
    where the replicas meet (`ReplicaGroup.collective`)."""
    return self.group.collective(self.index, name, flat_values, merge)


class StepTrace(Protocol):
  """What an engine keeps of one step's trace, as `ReplicaGroup` calls it."""

  def replica_returned(self) -> None:
    """On a replica's thread, once its step_fn returned (still in its trace)."""

  def all_returned(self, outputs: List[Any]) -> None:
    """Once every replica's step_fn returned, with their outputs."""


class ReplicaGroup:
  """Traces a function for every local replica, meeting at collectives.

  Args:
    devices: one device per local replica.
    first_replica_id: global id of the first local replica.
    num_replicas: replicas in the whole job.
    keys: a `multiworker.cluster.CollectiveKeys` when replicas span
      several workers.
    trace: the engine's state of this step's trace, carried for the replicas'
      threads and read only through `StepTrace`
      (`variables.deferred.StepWrites`); None where only collectives are traced.
  """

  def __init__(self, devices: Sequence[str], first_replica_id: int,
               num_replicas: int, keys=None,
               trace: Optional["StepTrace"] = None):
    self.devices = tuple(devices)
    self.first_replica_id = first_replica_id
    self.num_replicas = num_replicas
    self.keys = keys
    self._resume = [threading.Event() for _ in self.devices]
    self._paused = threading.Semaphore(0)
    self._arrivals = [None] * len(self.devices)
    self._results = [None] * len(self.devices)
    self._aborted = False
    # (tf.function, local replica) -> (it, its copy); see `patches.nested_functions`.
    self.function_copies = {}
    self.step_graph = None  # the graph `run` traces the replicas into
    self.last_collective = None  # the name of the last collective the replicas met at
    self.trace = trace

  def run(self, fn: Callable, args_per_replica: Sequence[Sequence[Any]],
          replica_scope: Callable[[int], Any]) -> List[Any]:
    """Returns `[fn(*args_per_replica[r]) for r in local replicas]`, traced."""
    graph = self.step_graph = tf.compat.v1.get_default_graph()
    name_scope = graph.get_name_scope()
    # Variable creators are kept per thread (tf.function's own among them, which
    # makes variables it cannot make outside the trace); as MirroredStrategy's
    # replica threads do, each replica's thread starts with this thread's.
    creators = graph._variable_creator_stack  # pylint: disable=protected-access
    threads = [
        threading.Thread(
            target=self._trace_replica,
            args=(r, fn, args_per_replica[r], graph, name_scope, replica_scope, creators),
            name=f"replicator-replica-{r}", daemon=True)
        for r in range(len(self.devices))
    ]
    for thread in threads:
      thread.start()
    try:
      return self._drive()
    finally:
      self._aborted = True
      for event in self._resume:
        event.set()
      for thread in threads:
        thread.join()

  def _drive(self) -> List[Any]:
    while True:
      for r in range(len(self.devices)):
        self._resume[r].set()
        self._paused.acquire()
      for arrival in self._arrivals:
        if arrival[0] == "error":
          raise arrival[1]
      if all(arrival[0] == "done" for arrival in self._arrivals):
        outputs = [arrival[1] for arrival in self._arrivals]
        if self.trace is not None:
          self.trace.all_returned(outputs)
        return outputs
      names = [arrival[1] if arrival[0] == "collective" else "return from step_fn"
               for arrival in self._arrivals]
      if len(set(names)) != 1:
        raise RuntimeError(
            "Replicas took different paths through step_fn: "
            + ", ".join(f"replica {self.first_replica_id + r} reached {n}"
                        for r, n in enumerate(names))
            + ". Every replica must call the same collectives in the same "
            "order (do not branch on the replica id around a collective).")
      values = [arrival[2] for arrival in self._arrivals]
      _check_same_graph(values, names[0])
      self._results = self._arrivals[0][3](values)
      self.last_collective = names[0]

  def _trace_replica(self, r, fn, args, graph, name_scope, replica_scope, creators):
    self._resume[r].wait()
    self._resume[r].clear()
    if self._aborted:
      return
    try:
      with graph.as_default(), graph.name_scope(name_scope + "/" if name_scope else None):
        # (after `as_default`, which gives a function graph its outer graph's)
        graph._variable_creator_stack = creators  # pylint: disable=protected-access
        with entered(ReplicaContext(self, r)), replica_scope(r):
          outputs = fn(*args)
          if self.trace is not None:
            self.trace.replica_returned()
          self._arrivals[r] = ("done", outputs)
    except _Aborted:
      return
    except BaseException as error:  # pylint: disable=broad-except
      self._arrivals[r] = ("error", error)
    self._paused.release()

  def collective(self, index: int, name: str, flat_values, merge):
    _check_not_nested(name)
    self._arrivals[index] = ("collective", name, flat_values, merge)
    self._paused.release()
    self._resume[index].wait()
    self._resume[index].clear()
    if self._aborted:
      raise _Aborted()
    return self._results[index]


def _check_not_nested(name):
  """Refuses a collective inside a `tf.function` that step_fn called (only
  XLA-compiled ones get here; `patches.nested_functions` inlines the others):
  each replica traces its own copy, and a collective cannot join values from
  several graphs."""
  replica = current()
  step_graph = replica.group.step_graph if replica else None
  for graph in _graph_and_outers(tf.compat.v1.get_default_graph()):
    if graph is step_graph:
      return
    # tf.cond and tf.while_loop bodies are FuncGraph subclasses
    # (_check_same_graph names those); a tf.function's graph is a FuncGraph.
    if type(graph) is tf.__internal__.FuncGraph:  # pylint: disable=unidiomatic-typecheck
      raise NotImplementedError(
          f"step_fn reached {name} inside a tf.function with jit_compile=True "
          f"that it called ({graph.name!r}). An XLA computation runs on one "
          "device, so it cannot hold a collective, an optimizer.apply or an "
          "update of a replicated variable: compute in it (the forward and "
          "backward pass), return the results, and do the update in step_fn.")


def _graph_and_outers(graph):
  """`graph`, then the graph it is nested in, and so on out."""
  while graph is not None:
    yield graph
    graph = getattr(graph, "outer_graph", None)


def _check_same_graph(values, name):
  outer = set(_graph_and_outers(tf.compat.v1.get_default_graph()))
  for replica in values:
    for value in replica:
      if getattr(value, "graph", None) is not None and value.graph not in outer:
        raise NotImplementedError(
            f"step_fn reached {name} inside a tf.cond or tf.while_loop (or an "
            "AutoGraph `if`/`while` on a tensor). Collectives, optimizer.apply and "
            "updates of replicated variables must be at the top level of "
            "step_fn; compute both branches' inputs and select with tf.where, or "
            "move the loop into run(..., steps=k).")


class _Aborted(BaseException):
  """Unwinds a replica thread whose step trace was abandoned."""
