"""Helpers for tests: several replicas on one CPU."""

import contextlib

from replicator.collectives import reductions
from replicator.mesh import configure_logical_cpus  # noqa: F401  (public here)


@contextlib.contextmanager
def merges_as_collectives():
  """Within: local replicas merge their variables' writes as between physical
  GPUs or workers, where a merge is a collective and a float mean's (or the
  first replica's value's) waits for the end of the step. On logical CPUs (or
  logical GPUs of one GPU), where a merge is an `add_n` made at the write,
  this runs that path in one process. Steps traced within keep it.
  """
  merged_by_collectives = reductions.merged_by_collectives
  reductions.merged_by_collectives = lambda devices, workers=None: True
  try:
    yield
  finally:
    reductions.merged_by_collectives = merged_by_collectives
