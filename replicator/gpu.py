"""Replicators for GPUs (and CPUs): one device, or every local device."""

import os
from typing import Optional, Sequence

import tensorflow as tf

from replicator import base
from replicator.multiworker import cluster as cluster_lib
from replicator import mesh as mesh_lib
from replicator.collectives import reduce_options
from replicator.mesh import Mesh

LOGICAL_CPUS_ENV = "REPLICATOR_LOGICAL_CPUS"  # set by `replicator.launch`


class GpuReplicator(base.Replicator):
  """One replica on one device: the first GPU, else the CPU.

  Args:
    device: the device (default: the first GPU, else the CPU).
    jit_compile: compile each step, the optimizer's update included, as one
      XLA computation (`tf.function(jit_compile=True)`): fused kernels, static
      shapes required. An op XLA cannot compile fails on the first `run`.
      Several replicas cannot share one XLA computation (it runs on one
      device), so `MultiGpuReplicator` has no such switch: there, compile
      the model's forward and backward pass inside `step_fn` with
      `tf.function(jit_compile=True)` and leave the optimizer outside.

  >>> repl = GpuReplicator(device="/cpu:0")
  >>> repl.num_replicas
  1
  """

  _compiled_by = ("GpuReplicator(jit_compile=True) compiles each step as one XLA "
                  "computation (jit_compile=False does not)")

  def __init__(self, device: Optional[str] = None, jit_compile: bool = False):
    if not isinstance(jit_compile, bool):
      raise TypeError(f"jit_compile: expected True or False, got {jit_compile!r}.")
    workers = mesh_lib.workers_in_tf_config()
    if workers > 1:
      raise ValueError(
          f"GpuReplicator: TF_CONFIG lists {workers} workers, and a "
          "GpuReplicator on each would train independent models. Use "
          "MultiGpuReplicator(), which spans the workers in TF_CONFIG, or unset "
          "TF_CONFIG.")
    mesh = Mesh(devices=[device]) if device else Mesh(devices=Mesh.local().local_devices[:1])
    mesh.validate_local()
    super().__init__(mesh, jit_compile=jit_compile)


class MultiGpuReplicator(base.Replicator):
  """A replica on every local GPU (else every logical CPU), on one or many workers.

  Args:
    devices: this worker's devices; default: every local GPU, else every
      logical CPU.
    cluster: a multi-worker `Mesh` from `Mesh.from_cluster(...)` or a
      `tf.distribute.cluster_resolver.ClusterResolver`. With neither this nor a
      multi-worker `TF_CONFIG` (as `python -m replicator.launch` sets), the
      replicator uses this process alone.
    all_reduce: `AllReduceOptions` for gradients and collectives.

  Workers talk through TensorFlow's gRPC collectives, which are not
  authenticated: run them on a trusted network only. Create the replicator
  before running any TensorFlow op, so that it can start the worker's server.
  """

  def __init__(self, devices: Optional[Sequence[str]] = None, cluster=None,
               all_reduce: Optional[reduce_options.AllReduceOptions] = None):
    logical_cpus = os.environ.get(LOGICAL_CPUS_ENV)  # set by replicator.launch
    if logical_cpus and not tf.config.list_physical_devices("GPU"):
      mesh_lib.configure_logical_cpus(int(logical_cpus))
    if isinstance(cluster, Mesh):
      mesh = cluster if devices is None else Mesh.from_cluster(
          worker_addresses=cluster.worker_addresses,
          worker_index=cluster.worker_index, devices=devices)
    elif cluster is not None:
      mesh = Mesh.from_cluster(cluster, devices=devices)
    elif mesh_lib.workers_in_tf_config() > 1:
      mesh = Mesh.from_cluster(devices=devices)
    else:
      mesh = Mesh(devices=devices) if devices is not None else Mesh.local()
    if mesh.num_workers > 1:
      cluster_lib.connect(mesh)
    mesh.validate_local()
    super().__init__(mesh, all_reduce=all_reduce)
