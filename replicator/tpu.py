"""`TpuReplicator`: Cloud/Colab TPUs, or their semantics emulated on the CPU."""

import os
from typing import Optional

import sonnet as snt
import tensorflow as tf

from replicator import errors
from replicator import base
from replicator.mesh import Mesh
from replicator.strategy_engine import engine as strategy_engine

_SUPPORTED_CORES = (1, 2, 4, 8)


def _check_cores(num_tpu_cores_per_worker):
  if num_tpu_cores_per_worker not in _SUPPORTED_CORES:
    raise ValueError(
        f"num_tpu_cores_per_worker: {num_tpu_cores_per_worker!r} is not a TPU "
        f"host size; use one of {_SUPPORTED_CORES} (v2/v3 hosts: 8 cores, v4: "
        "4 chips, v5e-1: 1), or None to read it from the TPU.")


def _hosts(strategy) -> int:
  """The TPU hosts (workers) `strategy` spans."""
  hosts = {d.split("/device:")[0] for d in strategy.extended.worker_devices}
  return len(hosts)


def _tpu_address(tpu: Optional[str]) -> str:
  if tpu is not None:
    return tpu
  if os.environ.get("TPU_NAME"):
    return os.environ["TPU_NAME"]
  if os.environ.get("COLAB_TPU_ADDR"):
    return "grpc://" + os.environ["COLAB_TPU_ADDR"]
  return "local"


class TpuReplicator(base.Replicator):
  """Replicas on the cores of a TPU, or emulated on the CPU.

  On a TPU (a Cloud TPU VM, a TPU Node, Colab) the steps run on
  `tf.distribute`'s `TPUStrategy` (Sonnet's `TpuReplicator`), through the
  strategy engine (`replicator.strategy_engine`), with the semantics of the
  other replicators; docs/design.md, "The strategy engine", says where it
  differs. Not run on a TPU by this project: `python -m benchmarks.tpu_check`
  checks it there.

  With `emulate_on_cpu=True` the replicas of a step are compiled together as
  one XLA computation on the CPU, so a step that cannot compile with static
  shapes fails on a laptop first. XLA on CPU accepts some ops a TPU rejects
  (dynamic-shape ops such as `tf.boolean_mask`), so passing the emulator is
  necessary, not sufficient. The reverse too: `tf.print` in a step fails here
  (XLA on CPU has no print; a TPU runs it on the host), with an error that
  says to return the values instead.

  Args:
    num_workers: TPU hosts: 1, or as many as the TPU found has (a pod slice,
      not yet run).
    num_tpu_cores_per_worker: cores per host; None reads it from the TPU (8
      when emulating).
    tpu: TPU name or address; None tries `TPU_NAME`, `COLAB_TPU_ADDR`, then
      `'local'` (a TPU VM, a current Colab runtime).
    emulate_on_cpu: run on the CPU with TPU semantics.
    strategy: a `tf.distribute.TPUStrategy` you built (a custom device
      assignment, a TPU system you initialized, Sonnet's `TpuReplicator`):
      used as it is, with nothing connected or initialized again. Leave
      `tpu` and `emulate_on_cpu` out; `num_workers` and
      `num_tpu_cores_per_worker`, if given, must match it.
  """

  _compiled_by = ("a TPU step is one XLA computation (the emulator compiles it "
                  "the same way)")

  def __init__(self, num_workers: int = 1,
               num_tpu_cores_per_worker: Optional[int] = None,
               tpu: Optional[str] = None, emulate_on_cpu: bool = False,
               strategy: Optional[tf.distribute.Strategy] = None):
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
      raise ValueError(f"num_workers: expected an int >= 1 (TPU hosts), got "
                       f"{num_workers!r}.")
    if num_tpu_cores_per_worker is not None:
      _check_cores(num_tpu_cores_per_worker)
    if strategy is not None:
      self._from_strategy(strategy, tpu, emulate_on_cpu, num_workers,
                          num_tpu_cores_per_worker)
      return
    if emulate_on_cpu:
      if num_workers != 1:
        raise ValueError(
            f"num_workers: {num_workers} TPU hosts requested with "
            "emulate_on_cpu=True; the emulator runs one host's cores in this "
            "process. Pass num_workers=1.")
      cores = num_tpu_cores_per_worker or 8
      mesh = Mesh(devices=[f"TPU:{i}" for i in range(cores)])
      super().__init__(mesh, placement=["CPU:0"] * cores, jit_compile=True)
      return
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

  def _from_strategy(self, strategy, tpu, emulate_on_cpu, num_workers,
                     num_tpu_cores_per_worker):
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
    self._on_strategy(strategy, stand_in=False, num_workers=num_workers,
                      num_tpu_cores_per_worker=num_tpu_cores_per_worker)

  def _on_strategy(self, strategy, stand_in: bool, num_workers: int = 1,
                   num_tpu_cores_per_worker: Optional[int] = None,
                   trace_only: bool = False):
    """Runs this replicator's steps on `strategy` (the strategy engine)."""
    hosts = _hosts(strategy)
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
    devices = [d.split("/device:")[-1] for d in strategy.extended.worker_devices]
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
      if not spec.shape.is_fully_defined():
        raise ValueError(
            f"input_fn: {name} gives elements of shape {spec.shape}; a TPU "
            "needs every dimension fixed. Batch with drop_remainder=True and "
            "give images a fixed size.")
