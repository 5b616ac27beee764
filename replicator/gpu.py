"""Replicators for GPUs (and CPUs): one device, or every local device."""

import json
import os
from typing import Optional, Sequence

import tensorflow as tf

from replicator import base
from replicator import collectives
from replicator.mesh import Mesh


def _workers_in_tf_config() -> int:
  config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
  cluster = config.get("cluster", {})
  return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


class GpuReplicator(base.Replicator):
  """One replica on one device: the first GPU, else the CPU.

  >>> repl = GpuReplicator(device="/cpu:0")
  >>> repl.num_replicas
  1
  """

  def __init__(self, device: Optional[str] = None):
    workers = _workers_in_tf_config()
    if workers > 1:
      raise ValueError(
          f"GpuReplicator: TF_CONFIG lists {workers} workers, and a "
          "GpuReplicator on each would train independent models. Use "
          "MultiGpuReplicator(), which spans the workers in TF_CONFIG, or unset "
          "TF_CONFIG.")
    mesh = Mesh(devices=[device]) if device else Mesh(devices=Mesh.local().devices[:1])
    mesh.validate_local()
    super().__init__(mesh)


class MultiGpuReplicator(base.Replicator):
  """A replica on every local GPU (else every logical CPU), or on `devices`.

  Args:
    devices: device names; default: every local GPU, else every logical CPU.
    cluster: a multi-worker `Mesh` (not yet supported: single worker only).
    all_reduce: `AllReduceOptions` for gradients and collectives.
  """

  def __init__(self, devices: Optional[Sequence[str]] = None, cluster=None,
               all_reduce: Optional[collectives.AllReduceOptions] = None):
    if cluster is not None or _workers_in_tf_config() > 1:
      raise NotImplementedError(
          "MultiGpuReplicator: multi-worker training (cluster= or a TF_CONFIG "
          "with several workers) is not available in this version; run one "
          "worker, or unset TF_CONFIG.")
    mesh = Mesh(devices=devices) if devices is not None else Mesh.local()
    mesh.validate_local()
    super().__init__(mesh, all_reduce=all_reduce)
