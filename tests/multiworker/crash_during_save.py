"""Saves step 1, then dies (SIGKILL) in the middle of saving step 2."""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # pylint: disable=g-import-not-at-top

import replicator

counter = tf.Variable(1.0)
checkpointer = replicator.Checkpointer(sys.argv[1], counter=counter)
checkpointer.save(step=1)
counter.assign(2.0)
tf.io.gfile.rename = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
checkpointer.save(step=2)
