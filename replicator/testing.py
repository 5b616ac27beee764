"""Helpers for tests: several replicas on one CPU."""

import contextlib
import itertools

import sonnet as snt
import tensorflow as tf

from replicator import tpu
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


def tpu_engine_on_cpus(num_replicas: int = 2):
  """A `TpuReplicator` on the strategy engine, over `num_replicas` logical CPUs.

  The engine `TpuReplicator()` runs on a TPU, with a stand-in for
  `TPUStrategy`: Sonnet's `Replicator` (a `MirroredStrategy`) over logical CPU
  devices. Each step is compiled with XLA before its first run, as a TPU
  compiles it, so a step a TPU cannot compile fails here too. What the
  stand-in cannot show: the TPU's own compiler and memory, and `TPUStrategy`'s
  host loop (docs/design.md, "The strategy engine").

  >>> repl = tpu_engine_on_cpus(2)
  >>> repl.num_replicas
  2
  """
  if not isinstance(num_replicas, int) or isinstance(num_replicas, bool) or num_replicas < 1:
    raise ValueError(f"num_replicas: expected an int >= 1, got {num_replicas!r}.")
  cpu = tf.config.list_physical_devices("CPU")[0]
  if len(tf.config.get_logical_device_configuration(cpu) or ()) < num_replicas:
    configure_logical_cpus(num_replicas)
  strategy = _StandIn(devices=[f"/cpu:{i}" for i in range(num_replicas)])
  repl = tpu.TpuReplicator.__new__(tpu.TpuReplicator)
  repl._on_strategy(strategy, stand_in=True)  # pylint: disable=protected-access
  return repl


class _StandIn(snt.distribute.Replicator):
  """Sonnet's `Replicator` whose collectives have group keys of their own.

  Each `MirroredStrategy` numbers its collective groups from 1: two of them
  of different sizes in one process would meet at group 1 and abort every
  collective of the process.
  """

  _instances = itertools.count(1)

  def __init__(self, devices):
    self._collective_key_base = next(_StandIn._instances) * 100_000
    super().__init__(devices=devices)
    # Sums in the replica's context, without a merge_call, as on a TPU (where
    # a step's tf.function may hold collectives too); MirroredStrategy makes
    # them merge_calls on CPUs, which a nested tf.function cannot hold.
    self.extended._use_merge_call = lambda: False
