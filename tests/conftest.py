"""Every test process splits the CPU into 8 logical devices, once."""

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # pylint: disable=g-import-not-at-top
import replicator  # pylint: disable=g-import-not-at-top

DEVICES = replicator.testing.configure_logical_cpus(8)


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_a_module_leaves():
  """Keeps Python's full garbage collections from rescanning earlier modules' objects.

  Traced functions and graphs pile up over a few hundred tests, and every full
  collection walked all of them (one test paid 86 s for it in a full run, 4 s alone).
  After each module: collect once, then freeze the survivors (`gc.freeze`).
  """
  yield
  gc.collect()
  gc.freeze()


@pytest.fixture(autouse=True)
def _keep_the_log_levels():
  """Restores the `absl` and root loggers' levels after each test.

  `tf.saved_model.save` sets absl's verbosity and sets it back
  (`AutoTrackable._trackable_children`); outside `app.run` that leaves the `absl`
  logger at WARNING, and a later test of the same process that reads absl's INFO
  lines with `caplog` (the examples' progress lines) would see none.
  """
  import logging  # pylint: disable=g-import-not-at-top
  loggers = (logging.getLogger(), logging.getLogger("absl"))
  levels = [logger.level for logger in loggers]
  yield
  for logger, level in zip(loggers, levels):
    logger.setLevel(level)
