"""Fails early, with the fix, when TensorFlow is missing or too old."""

_MINIMUM = (2, 16)

try:
  import tensorflow as _tf
except ImportError as error:
  raise ImportError(
      "replicator needs TensorFlow >= 2.16. Install it with "
      "`pip install replicator[tf]` (or `[tf-cpu]`), or keep the TensorFlow "
      "build you already have (tensorflow-tpu, tensorflow-cpu).") from error

_version = tuple(int(p) for p in _tf.__version__.split(".")[:2] if p.isdigit())
if _version < _MINIMUM:
  raise ImportError(
      f"replicator needs TensorFlow >= 2.16, found {_tf.__version__}. Upgrade "
      "with `pip install -U 'tensorflow>=2.16'` (or tensorflow-cpu / "
      "tensorflow-tpu, matching the build you use).")
