"""Fails early, with the fix, when TensorFlow is missing or too old; warns,
with what to do, when it is outside the versions that CI tests."""

import warnings

_MINIMUM = (2, 16)
# The versions `.ci/run` tests (2.21 with the whole suite, 2.20 with the TPU
# engine's tests); keep `setup.py`'s extras and `patches.registry._TF` in step.
TESTED = ((2, 20), (2, 21))

try:
  import tensorflow as _tf
except ImportError as error:
  raise ImportError(
      "replicator needs TensorFlow >= 2.16. From the clone's root, install it "
      "with the library: `pip install -e \".[tf]\"` (GPU build) or "
      "`pip install -e \".[tf-cpu]\"`; or install a build yourself "
      "(`pip install tensorflow`, tensorflow-cpu or tensorflow-tpu).") from error


class UntestedTensorFlowWarning(UserWarning):
  """TensorFlow is a version that replicator's CI does not test."""


def check(version: str) -> None:
  """Raises for a TensorFlow `version` older than 2.16; warns outside `TESTED`."""
  found = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
  if found < _MINIMUM:
    raise ImportError(
        f"replicator needs TensorFlow >= 2.16, found {version}. Upgrade "
        "with `pip install -U 'tensorflow>=2.20,<2.22'` (or tensorflow-cpu / "
        "tensorflow-tpu, matching the build you use).")
  (low_major, low_minor), (high_major, high_minor) = TESTED
  if not TESTED[0] <= found <= TESTED[1]:
    warnings.warn(
        f"replicator is tested with TensorFlow {low_major}.{low_minor} to "
        f"{high_major}.{high_minor}, and this is TensorFlow {version}: it may "
        "work, untested. To use a tested version, install "
        f"'tensorflow>={low_major}.{low_minor},<{high_major}.{high_minor + 1}' "
        "(or tensorflow-cpu; on a TPU, tensorflow-tpu==2.20.* -f "
        "https://storage.googleapis.com/libtpu-tf-releases/index.html). To "
        "go on with this one, `python -m pytest tests/patches` checks the "
        "TensorFlow internals replicator patches against it.",
        UntestedTensorFlowWarning, stacklevel=2)


check(_tf.__version__)
