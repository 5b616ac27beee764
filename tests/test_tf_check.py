"""`import replicator` checks the TensorFlow version: an error below 2.16, a
warning outside the versions CI tests (2.20 and 2.21), nothing within them."""

import importlib
import pathlib
import re
import warnings

import pytest
import tensorflow as tf

from replicator import _tf_check


def _reload_with(monkeypatch, version):
  monkeypatch.setattr(tf, "__version__", version)
  importlib.reload(_tf_check)


@pytest.mark.parametrize("version", ["2.20.0", "2.20.1", "2.21.0", "2.21.0rc1"])
def test_a_tested_version_imports_without_a_warning(monkeypatch, version):
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _reload_with(monkeypatch, version)


@pytest.mark.parametrize("version", ["2.16.2", "2.19.1", "2.22.0", "2.23.0-dev20260101", "3.0.0"])
def test_an_untested_version_warns_with_the_version_the_range_and_the_fix(
    monkeypatch, version):
  with pytest.warns(UserWarning) as caught:
    _reload_with(monkeypatch, version)
  [warning] = caught
  # Its class, as the reloaded module defines it anew.
  assert type(warning.message).__name__ == "UntestedTensorFlowWarning"
  message = str(warning.message)
  assert f"this is TensorFlow {version}" in message
  assert "tested with TensorFlow 2.20 to 2.21" in message
  assert "'tensorflow>=2.20,<2.22'" in message
  assert "tensorflow-tpu==2.20.*" in message


def test_a_version_older_than_2_16_is_an_error_with_the_fix(monkeypatch):
  with pytest.raises(ImportError, match=re.escape(
      "replicator needs TensorFlow >= 2.16, found 2.15.1. Upgrade with "
      "`pip install -U 'tensorflow>=2.20,<2.22'`")):
    _reload_with(monkeypatch, "2.15.1")


def test_the_tested_range_is_the_one_setup_py_and_the_patch_registry_state():
  from replicator.patches import registry  # pylint: disable=g-import-not-at-top
  text = (pathlib.Path(__file__).resolve().parents[1] / "setup.py").read_text()
  assert '"tensorflow>=2.20,<2.22"' in text and '"tensorflow-cpu>=2.20,<2.22"' in text
  assert _tf_check.TESTED == ((2, 20), (2, 21))
  assert registry._TF == "TensorFlow 2.20-2.21"  # pylint: disable=protected-access


@pytest.fixture(autouse=True)
def _reload_with_the_real_version():
  yield
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    importlib.reload(_tf_check)
