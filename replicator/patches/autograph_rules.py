"""What AutoGraph converts while replicator traces a step.

AutoGraph converts step_fn and what it calls, except the libraries that its
rules name (TensorFlow, Keras, NumPy...): their code runs as written. The same
holds for replicator's own code, always (it is plain Python that must run as
written), and, while a step is traced, for Sonnet's modules that never call
code of the user's back (`SONNET_AS_WRITTEN`).

Sonnet writes those to be traced without AutoGraph (its conformance tests
trace every module under `tf.function(autograph=False)`; batch norm's and
dropout's `__call__` convert themselves). Converting them anyway is a large
part of the first trace of a step that builds its model, as replicator's do
(benchmarks/RESULTS.md, "Time to the first training step").

What stays converted: the user's code, and Sonnet's code that calls it back
(`snt.Module`'s method wrappers, `snt.once`, `snt.Sequential`, `snt.nets.MLP`'s
activation, recurrent cores, ...), so a user's module or function that runs
inside Sonnet's is still converted. A method that overrides one which
Sonnet's code calls directly (`_initialize` of an `snt.Linear` subclass) runs as
written too.
"""

from tensorflow.python.autograph.core import config as autograph_config

SONNET_AS_WRITTEN = tuple(f"sonnet.src.{name}" for name in (
    "axis_norm", "batch_norm", "bias", "conv", "conv_transpose", "depthwise_conv",
    "dropout", "embed", "group_norm", "initializers", "leaky_clip_by_value",
    "linear", "metrics", "moving_averages", "optimizers", "pad", "parallel_linear",
    "regularizers", "reshape", "scale_gradient", "nets.cifar10_convnet",
    "nets.resnet", "nets.vqvae"))

_OURS = autograph_config.DoNotConvert("replicator")
_SONNET = tuple(autograph_config.DoNotConvert(m) for m in SONNET_AS_WRITTEN)


def with_ours(rules):
  """AutoGraph's `rules`, with replicator's own code run as written (once)."""
  if any(getattr(rule, "_prefix", None) == "replicator" for rule in rules):
    return rules  # a reloaded module finds its rule there
  return (_OURS,) + tuple(rules)


def with_sonnet_as_written(rules):
  """AutoGraph's `rules`, with Sonnet's `SONNET_AS_WRITTEN` modules run as written.

  AutoGraph reads its rules from one global, so they hold for every thread
  until the last trace (replicas trace on threads of their own) ends.
  """
  return _SONNET + tuple(rules)


def without_sonnet_rules(rules):
  """`rules` less those `with_sonnet_as_written` added (others kept)."""
  return tuple(rule for rule in rules if rule not in _SONNET)
