"""Replicators for GPUs (and CPUs): one device, or every local device."""

import os
from typing import Optional, Sequence

import tensorflow as tf
from absl import logging

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
      XLA computation: fused kernels, static shapes required (an op XLA cannot
      compile fails on the first `run`). One computation runs on one device:
      with several replicas (`MultiGpuReplicator`), compile the forward and
      backward pass inside `step_fn` with `tf.function(jit_compile=True)`.

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
    cpu_replicas: on a machine with no GPU, split the CPU into this many
      logical devices, one replica each (TensorFlow fixes its devices when it
      starts, so make the replicator before any op runs). Where a GPU is
      visible the GPUs are used and this is ignored, with a log line saying
      so: the same script trains on a laptop and on a GPU box. Default: the
      count `python -m replicator.launch --devices-per-worker` gives, else
      every logical CPU that exists (one, unless configured).

  Workers talk through TensorFlow's gRPC collectives, which are not
  authenticated: run them on a trusted network only. Create the replicator
  before running any TensorFlow op, so that it can start the worker's server.
  """

  def __init__(self, devices: Optional[Sequence[str]] = None, cluster=None,
               all_reduce: Optional[reduce_options.AllReduceOptions] = None,
               cpu_replicas: Optional[int] = None):
    if cpu_replicas is not None and (isinstance(cpu_replicas, bool) or
                                     not isinstance(cpu_replicas, int) or
                                     cpu_replicas < 1):
      raise ValueError(f"cpu_replicas: expected an int >= 1, got {cpu_replicas!r}.")
    logical_cpus = os.environ.get(LOGICAL_CPUS_ENV)
    gpus = tf.config.list_physical_devices("GPU")  # does not start the runtime
    if cpu_replicas is None and logical_cpus and not gpus:
      mesh_lib.configure_logical_cpus(int(logical_cpus))
    elif cpu_replicas is not None:
      if gpus:
        logging.info("MultiGpuReplicator: %d GPU(s) visible, so cpu_replicas=%d is "
                     "not used (hide the GPUs with CUDA_VISIBLE_DEVICES= to train "
                     "on the CPU).", len(gpus), cpu_replicas)
      elif devices is None:
        try:
          devices = mesh_lib.configure_logical_cpus(cpu_replicas)
        except RuntimeError as error:
          raise RuntimeError(
              f"cpu_replicas: cannot split the CPU into {cpu_replicas} devices: "
              f"TensorFlow has already started with "
              f"{len(tf.config.list_logical_devices('CPU'))}. Make the replicator "
              "before any TensorFlow op runs (or pass the count TensorFlow started "
              "with).") from error
      else:
        raise ValueError(
            f"cpu_replicas: given ({cpu_replicas}) together with devices={list(devices)}; "
            "pass one of them.")
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
