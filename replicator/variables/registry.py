"""Which variables are per-replica copies: the registry a step is checked against.

A compiled step may touch only the copies of replicated variables and
replica-local state (random generators); both are registered here when made.
Nothing here outlives what it describes: the maps hold their variables weakly
and check that an id still names the object registered under it, and what a
copy is (its variable, its index) is kept on the copy itself. A dead copy's id,
which Python gives to the objects made after it, so never answers for another.
"""

import contextlib
import threading
import weakref

import tensorflow as tf

# Every per-replica copy made here; a step may only touch variables in it.
_components = weakref.WeakValueDictionary()
# id of each copy's handle -> the copy (what a step captured -> whose copy).
_by_handle = weakref.WeakValueDictionary()
# The attribute of a copy that says whose copy it is: (weak reference to its
# variable, local replica index). In the copy's own `__dict__`, read from
# there: a tf.distribute variable forwards unknown attributes to its first copy.
_COPY_OF = "_replicator_copy_of"


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
  vars(variable)[_COPY_OF] = (weakref.ref(owner), index)
  _by_handle[id(variable.handle)] = variable


def _copy_of(variable):
  """`(weak reference to its variable, index)` of a registered copy, else None."""
  return vars(variable).get(_COPY_OF) if is_component(variable) else None


def copy_index(variable):
  """The local replica a copy of a replicated variable belongs to (else None)."""
  copy_of = _copy_of(variable)
  return None if copy_of is None else copy_of[1]


def copy_of_handle(handle):
  """`(the replicated variable, local replica index)` of the copy whose
  resource handle is `handle` (the variable None once it is gone); None for
  any other handle."""
  variable = _by_handle.get(id(handle))
  if variable is None or variable.handle is not handle:
    return None
  copy_of = _copy_of(variable)
  return None if copy_of is None else (copy_of[0](), copy_of[1])


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
