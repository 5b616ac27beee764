"""Which variables are per-replica copies: the registry a step is checked against.

A compiled step may touch only the copies of replicated variables and
replica-local state (random generators); both are registered here when made.
"""

import contextlib
import threading
import weakref

import tensorflow as tf

# Every per-replica copy made here; a step may only touch variables in it.
_components = weakref.WeakValueDictionary()
# id -> (id of its ReplicatedVariable, local replica index) of each copy.
_copies = {}
# id of each copy's handle -> the copy (what a step captured -> whose copy).
_by_handle = weakref.WeakValueDictionary()


_local = threading.local()


def in_replica_local() -> bool:
  """Whether the calling thread is inside `replica_local()`."""
  return getattr(_local, "replica_local", False)


def is_component(variable) -> bool:
  return _components.get(id(variable)) is variable


def component_handles() -> set:
  """The `id`s of the resource handles of every copy and replica-local variable."""
  return {id(variable.handle) for variable in list(_components.values())}


def register_copy(variable: tf.Variable, index: int, owner) -> None:
  """Records `variable` as local replica `index`'s copy of `owner`."""
  _components[id(variable)] = variable
  _copies[id(variable)] = (id(owner), index)
  _by_handle[id(variable.handle)] = variable


def copy_index(variable):
  """The local replica a copy of a `ReplicatedVariable` belongs to (else None)."""
  return _copies[id(variable)][1] if is_component(variable) and id(variable) in _copies else None


def copy_of_handle(handle):
  """`(id of the ReplicatedVariable, local replica index)` of the copy whose
  resource handle is `handle`; None for any other handle."""
  variable = _by_handle.get(id(handle))
  if variable is None or variable.handle is not handle or id(variable) not in _copies:
    return None
  return _copies[id(variable)]


def name_of_handle(handle) -> str:
  """The name of the replicated variable whose copy's handle is `handle`."""
  return _by_handle[id(handle)].name.split(":")[0].removesuffix("_replica")


@contextlib.contextmanager
def replica_local():
  """Variables created inside are per-replica state, never synchronized.

  Used for random generator states, which must differ between replicas.
  """

  def register(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    _components[id(variable)] = variable
    return variable

  previous = in_replica_local()
  _local.replica_local = True
  try:
    with tf.variable_creator_scope(register):
      yield
  finally:
    _local.replica_local = previous
