"""Mesh: a value; local, explicit and cluster constructors."""

import json
import os
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
