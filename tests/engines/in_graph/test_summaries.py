"""Summaries written inside a step: recorded once, by the job's replica 0."""

import numpy as np
import pytest
import tensorflow as tf

import catalogue
import replicator


@pytest.mark.parametrize("name", catalogue.NOT_XLA)
def test_a_writer_made_the_default_around_run_records_replica_0_once_a_step(name, tmp_path):
  # tf.distribute records replica 0's summaries only; TensorFlow keeps the
  # default writer per thread, and the replicas are traced on threads of
  # their own (without the writer they would record nothing at all). A tag
  # is prefixed with the replica's name scope, replica_0/.
  repl = catalogue.make(name)
  writer = tf.summary.create_file_writer(str(tmp_path))
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)

  def step_fn():
    counter.assign_add(1)
    value = tf.cast(repl.replica_id, tf.float32) + 10.0
    tf.summary.scalar("value", value, step=counter.read_value())
    return value

  with writer.as_default():
    repl.run(step_fn)
    repl.run(step_fn, steps=2)
  writer.flush()
  assert catalogue.summary_events(tmp_path, "replica_0/value") == [(1, 10.0), (2, 10.0), (3, 10.0)]
  repl.shutdown()


@pytest.mark.parametrize("name", [n for n in catalogue.NOT_XLA if n in catalogue.MULTI])
def test_a_writer_made_the_default_inside_step_fn_records_once(name, tmp_path):
  repl = catalogue.make(name)
  writer = tf.summary.create_file_writer(str(tmp_path))

  def step_fn():
    value = tf.cast(repl.replica_id, tf.float32) * 2.0 + 1.0
    with writer.as_default(step=7):
      tf.summary.scalar("inside", value)
    return value

  out = repl.run(step_fn).numpy()
  np.testing.assert_allclose(out, np.arange(repl.num_local_replicas) * 2.0 + 1.0)
  writer.flush()
  assert catalogue.summary_events(tmp_path, "replica_0/inside") == [(7, 1.0)]
  repl.shutdown()


def test_summaries_outside_a_step_are_untouched(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  with writer.as_default(step=3):
    tf.summary.scalar("eager", 5.0)
  writer.flush()
  assert catalogue.summary_events(tmp_path, "eager") == [(3, 5.0)]


@pytest.mark.parametrize("make", [
    lambda: catalogue.make("tpu_engine_2"),  # the TPU's engine, emulated
    lambda: replicator.GpuReplicator(device="/cpu:0", jit_compile=True),  # in-graph, XLA
], ids=["tpu_engine_2", "gpu_jit_compile"])
def test_a_summary_in_an_xla_compiled_step_is_refused_by_name(make, tmp_path):
  repl = make()
  writer = tf.summary.create_file_writer(str(tmp_path))

  def step_fn():
    tf.summary.scalar("value", 1.0, step=0)
    return tf.constant(1.0)

  with writer.as_default(), pytest.raises(tf.errors.InvalidArgumentError,
                                          match="uses WriteSummary, which XLA cannot compile"):
    repl.run(step_fn)
  repl.shutdown()
