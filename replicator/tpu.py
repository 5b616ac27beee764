"""`TpuReplicator`: Cloud/Colab TPUs, or their engine emulated on logical CPUs."""

import itertools
import os
from typing import Optional

import sonnet as snt
import tensorflow as tf

from replicator import errors
from replicator import base
from replicator.mesh import Mesh
from replicator.mesh import configure_logical_cpus
from replicator.engines.strategy import engine as strategy_engine

_SUPPORTED_CORES = (1, 2, 4, 8)


def _tpu_address(tpu: Optional[str]) -> str:
  if tpu is not None:
    return tpu
  if os.environ.get("TPU_NAME"):
    return os.environ["TPU_NAME"]
  if os.environ.get("COLAB_TPU_ADDR"):
    return "grpc://" + os.environ["COLAB_TPU_ADDR"]
  return "local"


def _logical_cpus(cores: int):
  """The first `cores` logical CPU devices, splitting the CPU if need be."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  configured = len(tf.config.get_logical_device_configuration(cpu) or ())
  if configured < cores:
    try:
      configure_logical_cpus(cores)
    except RuntimeError as error:
      started = len(tf.config.list_logical_devices("CPU"))
      if started < cores:
        raise RuntimeError(
            f"emulate_on_cpu: num_tpu_cores_per_worker={cores} emulates {cores} "
            f"TPU cores on as many logical CPU devices, but TensorFlow has "
            f"already started with {started} logical CPU device(s). Make the TpuReplicator before any "
            f"TensorFlow op runs, or split the CPU first with "
            f"replicator.testing.configure_logical_cpus({cores}) (in the "
            f"examples: --cpu_replicas {cores}); or pass "
            f"num_tpu_cores_per_worker="
            f"{max(c for c in _SUPPORTED_CORES if c <= started)}.") from error
  return [f"/cpu:{i}" for i in range(cores)]


class _StandIn(snt.distribute.Replicator):
  """The stand-in for `TPUStrategy` on logical CPUs: Sonnet's `Replicator`
  (a `MirroredStrategy`) whose collectives have group keys of their own (each
  `MirroredStrategy` numbers its groups from 1: two of different sizes in one
  process would meet at group 1 and abort every collective of the process)."""

  _instances = itertools.count(1)

  def __init__(self, devices):
    self._collective_key_base = next(_StandIn._instances) * 100_000
    super().__init__(devices=devices)
    # Variables with policies, as TPUStrategy makes them. (Not packed as it
    # packs them: MirroredStrategy's replica threads cannot differentiate
    # through a packed handle; `tpu_engine_on_fake_tpu` traces those.)
    self.extended._use_var_policy = True
    # Sums in the replica's context, without a merge_call, as on a TPU (where
    # a step's tf.function may hold collectives too); MirroredStrategy makes
    # them merge_calls on CPUs, which a nested tf.function cannot hold.
    self.extended._use_merge_call = lambda: False


class TpuReplicator(base.Replicator):
  """Replicas on the cores of a TPU, or emulated on the CPU.

  On a TPU (a Cloud TPU VM, a TPU Node, Colab) the steps run on
  `tf.distribute`'s `TPUStrategy` (Sonnet's `TpuReplicator`) through the
  strategy engine, with the other replicators' semantics; docs/design.md, "The
  strategy engine", says where it differs. Not run on a TPU by this project:
  `python -m benchmarks.checks.tpu_check` checks it there.

  With `emulate_on_cpu=True` the same engine runs on a stand-in for
  `TPUStrategy` over logical CPU devices, one per core, each step compiled with
  XLA to HLO before its first run, as a TPU compiles it: a step that cannot
  compile with static shapes fails on a laptop first. Necessary, not
  sufficient: XLA on a CPU accepts some ops a TPU rejects, and the TPU's own
  compiler, memory and host loop are not there. Make the replicator before any
  TensorFlow op runs, or split the CPU first
  (`replicator.testing.configure_logical_cpus(n)`).

  Args:
    num_workers: TPU hosts: 1, or as many as the TPU found has (a pod slice,
      not yet run).
    num_tpu_cores_per_worker: cores per host; None reads it from the TPU (8
      when emulating).
    tpu: TPU name or address; None tries `TPU_NAME`, `COLAB_TPU_ADDR`, then
      `'local'` (a TPU VM, a current Colab runtime).
    emulate_on_cpu: run the TPU's engine on `num_tpu_cores_per_worker`
      logical CPU devices (a stand-in strategy), with no TPU.
    strategy: a `tf.distribute.TPUStrategy` you built (a custom device
      assignment, a TPU system you initialized, Sonnet's `TpuReplicator`):
      used as it is, with nothing connected or initialized again. Leave
      `tpu` and `emulate_on_cpu` out; `num_workers` and
      `num_tpu_cores_per_worker`, if given, must match it.
  """

  def __init__(self, num_workers: int = 1,
               num_tpu_cores_per_worker: Optional[int] = None,
               tpu: Optional[str] = None, emulate_on_cpu: bool = False,
               strategy: Optional[tf.distribute.Strategy] = None):
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
      raise ValueError(f"num_workers: expected an int >= 1 (TPU hosts), got "
                       f"{num_workers!r}.")
    if num_tpu_cores_per_worker not in _SUPPORTED_CORES + (None,):
      raise ValueError(
          f"num_tpu_cores_per_worker: {num_tpu_cores_per_worker!r} is not a TPU "
          f"host size; use one of {_SUPPORTED_CORES} (v2/v3 hosts: 8 cores, v4: "
          "4 chips, v5e-1: 1), or None to read it from the TPU.")
    if strategy is not None:
      if tpu is not None or emulate_on_cpu:
        given = "tpu" if tpu is not None else "emulate_on_cpu"
        raise ValueError(
            f"{given}: given together with strategy=; a strategy already says "
            f"which TPU it runs on. Pass one of them, not both.")
      if not isinstance(strategy, tf.distribute.TPUStrategy):
        raise TypeError(
            f"strategy: expected a tf.distribute.TPUStrategy (or Sonnet's "
            f"snt.distribute.TpuReplicator), got {type(strategy).__name__}. For "
            "GPUs and CPUs use MultiGpuReplicator, which needs no strategy.")
    elif emulate_on_cpu:
      if num_workers != 1:
        raise ValueError(
            f"num_workers: {num_workers} TPU hosts requested with "
            "emulate_on_cpu=True; the emulator runs one host's cores in this "
            "process. Pass num_workers=1.")
      cores = num_tpu_cores_per_worker or 8
      self._on_strategy(_StandIn(devices=_logical_cpus(cores)), stand_in=True)
      return
    else:
      address = _tpu_address(tpu)
      try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
      except (ValueError, RuntimeError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:200]
        raise RuntimeError(
            f"TpuReplicator: no TPU reachable at {address!r} ({reason}). On a "
            "Cloud TPU VM or current Colab, install the tensorflow-tpu build; on a "
            "TPU Node set TPU_NAME (or pass tpu='name'); to try TPU semantics "
            "without a TPU, pass emulate_on_cpu=True.") from error
      strategy = snt.distribute.TpuReplicator(resolver)
    self._on_strategy(strategy, stand_in=False, num_workers=num_workers,
                      num_tpu_cores_per_worker=num_tpu_cores_per_worker)

  def _on_strategy(self, strategy, stand_in: bool, num_workers: int = 1,
                   num_tpu_cores_per_worker: Optional[int] = None,
                   trace_only: bool = False):
    """Runs this replicator's steps on `strategy` (the strategy engine)."""
    hosts = strategy_engine.hosts(strategy)
    cores = strategy.num_replicas_in_sync // max(hosts, 1)
    if num_workers != hosts:
      raise ValueError(
          f"num_workers: {num_workers} TPU hosts requested; the TPU found has "
          f"{hosts} host(s) with {cores} cores each. Pass num_workers={hosts} "
          "(or leave it out for one host).")
    if num_tpu_cores_per_worker is not None and num_tpu_cores_per_worker != cores:
      raise ValueError(
          f"num_tpu_cores_per_worker: {num_tpu_cores_per_worker} requested; the "
          f"TPU found has {cores} cores per host. Pass {cores}, or None to use "
          "them all.")
    # One process feeds every host; a pod slice's cores are named by their
    # replica id (the strategy places them).
    devices = ([d.split("/device:")[-1] for d in strategy.extended.worker_devices]
               if hosts == 1 else [f"TPU:{i}" for i in range(strategy.num_replicas_in_sync)])
    super().__init__(Mesh(devices=devices),
                     engine=strategy_engine.StrategyEngine(strategy, stand_in,
                                                          trace_only=trace_only))

  def _check_dataset(self, dataset, input_fn):
    name = errors.name_of(input_fn)
    for spec in tf.nest.flatten(dataset.element_spec):
      if not isinstance(spec, tf.TensorSpec) or spec.dtype in (tf.string, tf.variant):
        raise ValueError(
            f"input_fn: {name} gives {spec}; a TPU step takes dense numeric "
            "tensors only. Decode strings, pad ragged values and densify sparse "
            "ones inside input_fn (dataset.map), keeping only numbers.")
      # A scalar's shape, (), is static: each core takes one a step.
      if not spec.shape.is_fully_defined():
        raise ValueError(
            f"input_fn: {name} gives elements of shape {spec.shape}; a TPU "
            "needs every dimension fixed. Batch with drop_remainder=True and "
            "give images a fixed size.")
