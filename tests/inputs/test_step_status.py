"""A step's status: names in Python, one int64 in the graph (`fetch.StepStatus`)."""

import pytest
import tensorflow as tf

from replicator.inputs import fetch

StepStatus = fetch.StepStatus


def test_the_codes_are_the_ones_the_graph_and_the_workers_exchange():
  assert {status.name: int(status) for status in StepStatus} == {
      "READY": 1, "OUT_OF_DATA": 0, "UNEVEN": -1, "STEPS_DIFFER": -2,
      "VARIABLES_DIFFER": -3, "DONE": -4, "LAST": 100, "INTERRUPTED": -100}
  assert fetch.encode(StepStatus.LAST, 15) == 115
  assert fetch.encode(StepStatus.INTERRUPTED, 2) == -102


@pytest.mark.parametrize("status, signum", [
    *((status, 0) for status in StepStatus
      if status not in (StepStatus.LAST, StepStatus.INTERRUPTED)),
    (StepStatus.LAST, 2), (StepStatus.LAST, 15),
    (StepStatus.INTERRUPTED, 2), (StepStatus.INTERRUPTED, 15)])
def test_decode_names_what_encode_wrote_in_python_and_in_the_graph(status, signum):
  assert fetch.decode(fetch.encode(status, signum)) == (status, signum)
  graph_signum = tf.constant(signum, tf.int64) if signum else None
  assert fetch.decode(fetch.status_tensor(status, graph_signum)) == (status, signum)
  assert fetch.decode(fetch.encode(status, signum))[0] is status


def test_a_signal_goes_with_last_and_interrupted_only():
  with pytest.raises(ValueError, match=r"signum: INTERRUPTED needs a signal's number"):
    fetch.encode(StepStatus.INTERRUPTED)
  with pytest.raises(ValueError, match=r"signum: READY takes no signal, got 2"):
    fetch.encode(StepStatus.READY, 2)
  with pytest.raises(ValueError, match=r"signum: DONE takes no signal"):
    fetch.status_tensor(StepStatus.DONE, tf.constant(2, tf.int64))


def test_a_loop_stopped_by_a_signal_reads_as_interrupted_by_it():
  assert fetch.decode(fetch.interrupted(tf.constant(15, tf.int64))) == (
      StepStatus.INTERRUPTED, 15)
  assert fetch.decode(fetch.why_stopped(tf.constant(False))) == (StepStatus.OUT_OF_DATA, 0)
  assert fetch.decode(fetch.why_stopped(
      tf.constant(False), lambda: tf.constant(2, tf.int64))) == (StepStatus.INTERRUPTED, 2)
