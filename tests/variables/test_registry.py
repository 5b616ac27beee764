"""The registry of copies: what it says of a variable is that variable's own."""

import gc

import tensorflow as tf

from replicator.variables import registry


class _Owner:
  """Stands for the variable whose copies are registered."""


class _Variable:
  """Stands for a variable (the registry reads its handle and attributes).

  Over 512 bytes, so that CPython takes it from the C allocator, which gives
  the block just freed to the next request of its size: the next `_Variable`
  made after one dies takes its id, as any object may take a dead copy's.
  """
  __slots__ = ("handle", "__dict__", "__weakref__") + tuple(f"_pad{i}" for i in range(80))

  def __init__(self):
    self.handle = object()


def _replica_local(variable):
  """`variable`, registered as replica-local state is (a generator's)."""
  with tf.variable_creator_scope(lambda next_creator, **kwargs: variable):
    with registry.replica_local():
      made = tf.Variable(0.0)
  assert made is variable
  return variable


def test_a_dead_copys_id_does_not_answer_for_a_new_variable():
  owner = _Owner()
  for _ in range(100):
    copy = _Variable()
    registry.register_copy(copy, 1, owner)
    dead = id(copy)
    del copy
    gc.collect()
    new = _Variable()
    if id(new) == dead:
      break
  assert id(new) == dead, "no id was reused; the test cannot tell"
  _replica_local(new)
  assert registry.is_component(new)
  # A replica-local variable is no copy, whatever id it took.
  assert registry.copy_index(new) is None
  assert registry.copy_of_handle(new.handle) is None


def test_a_copy_answers_with_its_index_while_it_lives():
  owner = _Owner()
  copy = tf.Variable(1.0)
  registry.register_copy(copy, 3, owner)
  assert registry.copy_index(copy) == 3
  assert registry.copy_of_handle(copy.handle) == (owner, 3)
  assert registry.name_of_handle(copy.handle) == copy.name.split(":")[0]
  assert id(copy.handle) in registry.component_handles()
  assert registry.copy_index(tf.Variable(1.0)) is None
