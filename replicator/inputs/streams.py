"""The inputs a replicator runs: their iterators, names and positions.

An input is an `input_fn` object, started at its first run and again after a
reset or a restore; a checkpoint keeps its position (steps taken since it started).
"""

import functools
import logging
from typing import Callable

import tensorflow as tf

from replicator import errors
from replicator.inputs import input_context
from replicator.inputs import positions as positions_lib
from replicator.mesh import Mesh


def warn_if_new_each_call(step_fn, input_fn, compiled):
  """Says once that a new `input_fn` object per call restarts the data, and once
  that a new `step_fn` object (told apart by identity, as `tf.function` tells
  them) compiles the step again. `compiled`: the `(step_fn, input_fn)` pairs
  the replicator has compiled.
  """
  if input_fn is not None and sum(
      1 for s, i in compiled if s is step_fn and i is not None) == 3:
    logging.warning(
        "replicator: run(%s, input_fn) got a third different input_fn object. "
        "Each new input_fn (for example a lambda written inside the training "
        "loop) is a new input that starts from its first batch, and compiles "
        "the step again. Define input_fn once, outside the loop, unless you "
        "mean to restart the data (reset_input does that).",
        errors.name_of(step_fn))
  function = _unwrapped(step_fn)
  code = getattr(function, "__code__", None)
  if code is None:
    return
  objects = [s for s, _ in compiled
             if getattr(_unwrapped(s), "__code__", None) is code]
  first_time = sum(1 for s in objects if s is step_fn) == 1
  if first_time and len({id(s) for s in objects}) == 3:
    logging.warning(
        "replicator: run got a third different step_fn object made from the "
        "same code (%s, %s:%d). Each new function object (for example a lambda "
        "or functools.partial written inside the training loop) compiles the "
        "step again and keeps it. Define step_fn once, outside the loop, and "
        "pass what changes through args=(...).",
        errors.name_of(function), code.co_filename, code.co_firstlineno)


def _unwrapped(fn):
  while isinstance(fn, functools.partial):
    fn = fn.func
  return fn


class InputStreams:
  """The iterator of each `input_fn` a replicator runs, and its position."""

  def __init__(self, mesh: Mesh, iterator_of: Callable = iter):
    self._mesh = mesh
    self._iterator_of = iterator_of  # a dataset's iterator, as the engine takes it
    self._inputs = {}  # input_fn -> (iterator, element_spec)
    self._uneven_inputs = set()  # input_fns marked by allow_uneven_batches
    self._consumed = {}  # input key -> steps taken from it since its start
    self._saved_positions = None  # a checkpoint's, until this replicator claims one
    self._skip = {}  # input key -> steps to skip when it starts (restored)
    self._restored = set()  # input_fns to start again at their next use
    self._input_keys = {}  # input_fn -> its key in checkpoints

  def key(self, input_fn) -> str:
    """A name for `input_fn` that a restart of the same script finds again:
    `positions_lib.input_name`, numbered in order of first use where several
    inputs share one."""
    if input_fn not in self._input_keys:
      name = positions_lib.input_name(input_fn)
      taken = set(self._input_keys.values())
      key, number = name, 1
      while key in taken:
        number += 1
        key = f"{name}#{number}"
      if number == 2:
        logging.warning(
            "replicator: two input_fns are both named %r (same function, same "
            "constants); a checkpoint tells them apart only by the order in which "
            "they are first run, so a resumed script that runs them in another order "
            "swaps their positions. Make them distinct: close over a constant that "
            "differs (e.g. make_input('train') and make_input('eval')) or define "
            "separate functions.", name)
      self._input_keys[input_fn] = key
    return self._input_keys[input_fn]

  def get(self, input_fn, check_dataset: Callable):
    """`input_fn`'s `(iterator, element_spec)`, started at its first use."""
    if input_fn is None:
      return None, None
    if input_fn in self._restored:  # started before a restore: start it again
      self._inputs[input_fn] = self._make_input(input_fn, check_dataset,
                                                self._inputs[input_fn][1])
      self._restored.discard(input_fn)  # (only now: input_fn may raise)
    elif input_fn not in self._inputs:
      self._inputs[input_fn] = self._make_input(input_fn, check_dataset)
    return self._inputs[input_fn]

  def allows_uneven_batches(self, input_fn) -> bool:
    return input_fn in self._uneven_inputs

  def count_steps(self, input_fn, completed: int):
    key = self.key(input_fn)
    self._consumed[key] = self._consumed.get(key, 0) + completed

  def _make_input(self, input_fn, check_dataset, expected_spec=None):
    if not callable(input_fn):
      raise TypeError(f"input_fn: expected a callable, got {input_fn!r}.")
    key = self.key(input_fn)
    if self._saved_positions is not None:  # the checkpoint's record that names it, if any
      record = self._saved_positions.claim(
          key, (self._mesh.num_workers, self._mesh.devices_per_worker))
      if record is not None:
        self._saved_positions, self._skip = None, dict(record["inputs"])
    taken = self._skip.get(key, 0)

    def made(pipelines: int, index: int):
      """`(input_fn's dataset for input pipeline `index` of `pipelines`, whether
      input_fn skipped the steps taken)`, checked."""
      ctx = input_context.InputContext(pipelines, index, self._mesh.num_replicas,
                                       steps_taken=taken)
      dataset = input_fn(ctx)
      if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(
            f"input_fn: {errors.name_of(input_fn)} returned "
            f"{type(dataset).__name__}, expected a tf.data.Dataset of per-replica "
            "batches (e.g. ds.batch(ctx.per_replica_batch_size(GLOBAL_BATCH))).")
      check_dataset(dataset, input_fn)
      return dataset, input_context.check_skipped_by_input_fn(dataset, ctx,
                                                             errors.name_of(input_fn))

    dataset, skipped = made(self._mesh.num_workers, self._mesh.worker_index)
    if input_context.allows_uneven_batches(dataset):
      self._uneven_inputs.add(input_fn)
    if expected_spec is not None and dataset.element_spec != expected_spec:
      raise ValueError(
          f"input_fn: the dataset's element structure changed from "
          f"{expected_spec} to {dataset.element_spec}; the compiled step "
          "expects the first. Return the same structure on every call.")
    if taken:  # resuming: each step took one element per local replica
      del self._skip[key]
      self._consumed[key] = taken
      if not skipped:
        dataset = dataset.skip(taken * self._mesh.devices_per_worker)

    def for_host(host: int, hosts: int, replicas_per_host: int) -> tf.data.Dataset:
      """The dataset of one host of several that one process feeds (a TPU pod
      slice): `input_fn` called with that host's context."""
      host_dataset, host_skipped = made(hosts, host)
      if host_dataset.element_spec != dataset.element_spec:
        raise ValueError(
            f"input_fn: {errors.name_of(input_fn)} gave host {host} elements "
            f"{host_dataset.element_spec}, and host 0 {dataset.element_spec}; "
            "every host's replicas run one step, so give every host the same "
            "element structure and shapes.")
      if taken and not host_skipped:
        host_dataset = host_dataset.skip(taken * replicas_per_host)
      return host_dataset

    with tf.device("/device:CPU:0"):
      return self._iterator_of(dataset, for_host), dataset.element_spec

  def positions(self) -> dict:
    return dict(self._consumed)

  def resume(self, saved: positions_lib.SavedPositions) -> None:
    self._saved_positions, self._skip, self._consumed = saved, {}, {}
    self._restored = set(self._inputs)

  def reset(self, input_fn: Callable, check_dataset: Callable):
    key, previous = self.key(input_fn), self._inputs.get(input_fn)
    consumed = self._consumed.pop(key, None)
    try:
      self._inputs[input_fn] = self._make_input(input_fn, check_dataset,
                                                previous[1] if previous else None)
    except BaseException:  # the old iterator goes on: so does its position
      if consumed is not None:
        self._consumed[key] = consumed
      raise
    self._restored.discard(input_fn)

  def clear(self):
    self._inputs.clear()
