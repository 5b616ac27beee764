"""Helpers for tests: several replicas on one CPU."""

import contextlib
from typing import List

import tensorflow as tf

from replicator import collectives


def configure_logical_cpus(count: int = 8) -> List[str]:
  """Splits the CPU into `count` logical devices; returns their names.

  TensorFlow fixes its devices when the runtime starts, so call this once per
  process, before any op runs. Calling it again with the same count is a no-op.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu)
  if not existing or len(existing) != count:
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as error:
      raise RuntimeError(
          f"count: cannot split the CPU into {count} devices: TensorFlow has "
          f"already started with {len(tf.config.list_logical_devices('CPU'))}. "
          "Call configure_logical_cpus before any TensorFlow op runs.") from error
  return [f"CPU:{i}" for i in range(count)]


@contextlib.contextmanager
def merges_as_collectives():
  """Within: local replicas merge their variables' writes as between physical
  GPUs or workers, where a merge is a collective and a float mean's waits for
  the end of the step; on logical CPUs (or logical GPUs of one GPU), where a
  merge is an `add_n` made at the write, this runs that path in one process.
  Steps traced within keep it.
  """
  merged_by_collectives = collectives.merged_by_collectives
  collectives.merged_by_collectives = lambda devices, workers=None: True
  try:
    yield
  finally:
    collectives.merged_by_collectives = merged_by_collectives
