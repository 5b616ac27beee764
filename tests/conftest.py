"""Every test process splits the CPU into 8 logical devices, once."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import replicator  # pylint: disable=g-import-not-at-top

DEVICES = replicator.testing.configure_logical_cpus(8)
