"""Fails early, with the fix, when TensorFlow is missing or too old."""

_MINIMUM = (2, 16)

try:
  import tensorflow as _tf
except ImportError as error:
  raise ImportError(
      "replicator needs TensorFlow >= 2.16. From the clone's root, install it "
      "with the library: `pip install -e \".[tf]\"` (GPU build) or "
      "`pip install -e \".[tf-cpu]\"`; or install a build yourself "
      "(`pip install tensorflow`, tensorflow-cpu or tensorflow-tpu).") from error

_version = tuple(int(p) for p in _tf.__version__.split(".")[:2] if p.isdigit())
if _version < _MINIMUM:
  raise ImportError(
      f"replicator needs TensorFlow >= 2.16, found {_tf.__version__}. Upgrade "
      "with `pip install -U 'tensorflow>=2.16'` (or tensorflow-cpu / "
      "tensorflow-tpu, matching the build you use).")
