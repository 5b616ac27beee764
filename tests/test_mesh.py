"""Mesh: a value; local, explicit and cluster constructors."""

import json
import os
import subprocess
import sys
from unittest import mock

import pytest
import tensorflow as tf

import replicator


def test_mesh_is_an_immutable_hashable_value():
  a = replicator.Mesh(devices=["/cpu:0", "CPU:1"])
  b = replicator.Mesh(devices=("/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:1"))
  assert a == b and hash(a) == hash(b) and len({a, b}) == 1
  assert a.devices == ("CPU:0", "CPU:1")
  assert (a.num_workers, a.devices_per_worker, a.num_replicas) == (1, 2, 2)
  assert a.local_replica_ids == (0, 1) and a.is_chief
  with pytest.raises(Exception):
    a.num_workers = 3  # frozen


def test_local_mesh_has_every_logical_cpu():
  assert replicator.Mesh.local().num_replicas == len(tf.config.list_logical_devices("CPU"))


def test_from_tf_config_with_a_chief():
  config = {"cluster": {"chief": ["10.0.0.1:1"], "worker": ["10.0.0.2:1", "10.0.0.3:1"]},
            "task": {"type": "worker", "index": 1}}
  with mock.patch.dict(os.environ, {"TF_CONFIG": json.dumps(config)}):
    mesh = replicator.Mesh.from_cluster(devices=["/cpu:0", "/cpu:1"])
  assert mesh.num_workers == 3 and mesh.worker_index == 2 and not mesh.is_chief
  assert mesh.local_replica_ids == (4, 5) and mesh.num_replicas == 6
  assert mesh.worker_addresses[0] == "10.0.0.1:1"
  # devices[r] is global replica r's device; local_devices this worker's own.
  assert mesh.local_devices == ("CPU:0", "CPU:1")
  assert len(mesh.devices) == 6
  assert mesh.devices[5] == "/job:worker/replica:0/task:2/device:CPU:1"
  assert mesh.devices[0] == "/job:worker/replica:0/task:0/device:CPU:0"


def test_from_a_cluster_resolver_such_as_slurm():
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": ["h1:2222", "h2:2222"]}), task_type="worker",
      task_id=1)
  mesh = replicator.Mesh.from_cluster(resolver, devices=["/cpu:0"])
  assert (mesh.num_workers, mesh.worker_index, mesh.worker_addresses) == (
      2, 1, ("h1:2222", "h2:2222"))


def test_from_explicit_addresses():
  mesh = replicator.Mesh.from_cluster(worker_addresses=["a:1", "b:1"], worker_index=0,
                                      devices=["/cpu:0"])
  assert mesh.is_chief and mesh.num_replicas == 2
  with pytest.raises(ValueError, match="worker_index: required"):
    replicator.Mesh.from_cluster(worker_addresses=["a:1", "b:1"])


def test_no_cluster_found():
  with mock.patch.dict(os.environ, {"TF_CONFIG": ""}):
    with pytest.raises(ValueError, match="no cluster found.*replicator.launch"):
      replicator.Mesh.from_cluster()


def test_joining_a_server_of_another_cluster_names_both():
  from replicator.multiworker import cluster  # pylint: disable=g-import-not-at-top
  from tensorflow.core.protobuf import tensorflow_server_pb2  # pylint: disable=g-import-not-at-top
  mesh = replicator.Mesh.from_cluster(worker_addresses=["a:1", "b:1"], worker_index=1,
                                      devices=["CPU:0"])

  def server(addresses, index, job="worker"):
    return tensorflow_server_pb2.ServerDef(
        cluster=tf.train.ClusterSpec({job: addresses}).as_cluster_def(),
        job_name=job, task_index=index)

  cluster._check_same_cluster(server(["a:1", "b:1"], 1), mesh)  # the same: joins
  for other in (server(["a:1", "b:1"], 0), server(["a:1", "c:1"], 1),
                server(["a:1", "b:1"], 1, job="chief")):
    with pytest.raises(RuntimeError, match=r"worker 1 of \['a:1', 'b:1'\].*same TF_CONFIG"):
      cluster._check_same_cluster(other, mesh)


_CPU_REPLICAS = r"""
import json
import tensorflow as tf
import replicator

repl = replicator.MultiGpuReplicator(cpu_replicas=3)
again = replicator.MultiGpuReplicator(cpu_replicas=3)  # TensorFlow started: same count is fine
errors = []
for bad in (0, True, 2.0):
  try:
    replicator.MultiGpuReplicator(cpu_replicas=bad)
  except ValueError as error:
    errors.append(str(error))
try:
  replicator.MultiGpuReplicator(cpu_replicas=2)
except RuntimeError as error:
  errors.append(str(error))

with repl.context():
  v = tf.Variable(0.0)
def step_fn():
  return repl.all_sum(tf.constant(1.0))
out = repl.run(step_fn)
print(json.dumps({"replicas": repl.num_replicas, "again": again.num_replicas,
                  "devices": list(repl.mesh.local_devices), "sum": out.numpy().tolist(),
                  "repr": repr(repl), "errors": errors}))
"""


def test_cpu_replicas_splits_the_cpu_and_names_its_argument_in_errors():
  # A process of its own: the suite's process has fixed its logical CPUs already.
  env = {k: v for k, v in os.environ.items() if k != "REPLICATOR_LOGICAL_CPUS"}
  env["CUDA_VISIBLE_DEVICES"] = ""
  result = subprocess.run([sys.executable, "-c", _CPU_REPLICAS], env=env,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["replicas"] == 3 and report["again"] == 3
  assert report["devices"] == ["CPU:0", "CPU:1", "CPU:2"]
  assert report["sum"] == [3.0, 3.0, 3.0]  # every replica took part
  assert report["repr"] == ("MultiGpuReplicator(num_replicas=3, num_workers=1, "
                            "devices=['CPU:0', 'CPU:1', 'CPU:2'])")
  bad_values, started = report["errors"][:3], report["errors"][3:]
  for given, error in zip(("0", "True", "2.0"), bad_values):
    assert error == f"cpu_replicas: expected an int >= 1, got {given}."
  assert len(started) == 1 and started[0].startswith(
      "cpu_replicas: cannot split the CPU into 2 devices: TensorFlow has already "
      "started with 3."), started
