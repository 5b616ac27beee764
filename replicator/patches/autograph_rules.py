"""What AutoGraph converts while replicator traces a step.

AutoGraph converts step_fn and what it calls, except the libraries that its
rules name (TensorFlow, Keras, NumPy...): their code runs as written. The same
holds for replicator's own code, always (it is plain Python that must run as
written), and, while a step is traced, for Sonnet's modules that never call
code of the user's back (`SONNET_AS_WRITTEN`).

Sonnet writes those to be traced without AutoGraph: its conformance tests
trace every module, variable creation included, under
`tf.function(autograph=False)`, and the methods that need AutoGraph (batch
norm's and dropout's `__call__`) convert themselves (`smart_autograph`).
Converting them anyway costs the first trace dearly when a module is built in
it, as replicator builds them (MirroredStrategy's users build theirs eagerly
first, where nothing is converted): for Sonnet's ResNet-50 the first call took
7.4 s instead of 11.5-15.0 on a 2-core CPU (docs/design.md, "Lazy
variables").

What stays converted: the user's code, and Sonnet's code that calls it back
(`snt.Module`'s method wrappers, `snt.once`, `snt.Sequential`, `snt.nets.MLP`'s
activation, recurrent cores, ...), so a user's module or function that runs
inside Sonnet's is converted as before. A method that overrides one which
Sonnet's code calls directly (`_initialize` of an `snt.Linear` subclass) runs as
written too.
"""

import contextlib
import threading

from tensorflow.python.autograph.core import config as autograph_config

SONNET_AS_WRITTEN = tuple(f"sonnet.src.{name}" for name in (
    "axis_norm", "batch_norm", "bias", "conv", "conv_transpose", "depthwise_conv",
    "dropout", "embed", "group_norm", "initializers", "leaky_clip_by_value",
    "linear", "metrics", "moving_averages", "optimizers", "pad", "parallel_linear",
    "regularizers", "reshape", "scale_gradient", "nets.cifar10_convnet",
    "nets.resnet", "nets.vqvae"))

_OURS = autograph_config.DoNotConvert("replicator")
_WHILE_TRACING = tuple(autograph_config.DoNotConvert(m) for m in SONNET_AS_WRITTEN)
_lock = threading.Lock()
_tracing = 0  # traces under `while_tracing()` now, in any thread

if not any(getattr(rule, "_prefix", None) == "replicator"  # once, if reloaded
           for rule in autograph_config.CONVERSION_RULES):
  autograph_config.CONVERSION_RULES = (
      (_OURS,) + tuple(autograph_config.CONVERSION_RULES))


@contextlib.contextmanager
def while_tracing():
  """Inside, Sonnet's `SONNET_AS_WRITTEN` modules are not converted.

  AutoGraph reads its rules from one global, so the rules hold for every
  thread until the last trace under this scope (replicas trace on threads of
  their own) ends.
  """
  global _tracing
  with _lock:
    _tracing += 1
    if _tracing == 1:
      autograph_config.CONVERSION_RULES = (
          _WHILE_TRACING + tuple(autograph_config.CONVERSION_RULES))
  try:
    yield
  finally:
    with _lock:
      _tracing -= 1
      if _tracing == 0:
        autograph_config.CONVERSION_RULES = tuple(
            rule for rule in autograph_config.CONVERSION_RULES
            if rule not in _WHILE_TRACING)
