"""What AutoGraph converts in a step: the user's code, not Sonnet's own modules."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf
from tensorflow.python.autograph.core import config as autograph_config

import catalogue
import replicator


def _sonnet_linear_converted() -> bool:
  return not any(getattr(rule, "_prefix", None) == "sonnet.src.linear"
                 for rule in autograph_config.CONVERSION_RULES)


class Branchy(snt.Module):
  """A user's module whose Python control flow depends on its input's values."""

  def __init__(self):
    super().__init__()
    self.linear = snt.Linear(3, w_init=snt.initializers.Constant(0.5))

  def __call__(self, x):
    if tf.reduce_sum(x) > 0:  # AutoGraph must make this a tf.cond
      y = self.linear(x)
    else:
      y = -self.linear(x)
    for _ in tf.range(2):  # ... and this a tf.while_loop
      y = y * 2.0
    return y


def _doubled_if_positive(x):  # a user's function called by snt.Sequential
  if tf.reduce_sum(x) > 0:
    return 2.0 * x
  return x


def _oracle(x):
  linear = x @ np.full((x.shape[1], 3), 0.5, np.float32)
  return 4.0 * (linear if x.sum() > 0 else -linear)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2"])
def test_the_users_code_is_converted_inside_and_around_sonnets(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  rows = np.array([[1.0, 2.0], [-3.0, -1.0]] * n, np.float32)  # replicas differ
  with repl.context():
    branchy = Branchy()
    sequential = snt.Sequential([snt.Linear(2, w_init=snt.initializers.Identity()),
                                 _doubled_if_positive])
  rules_inside = []

  def step_fn(batch):
    rules_inside.append(_sonnet_linear_converted())
    return branchy(batch), sequential(batch)

  input_fn = lambda ctx: tf.data.Dataset.from_tensor_slices(rows).batch(1)
  outputs, sequenced = repl.run(step_fn, input_fn)
  for r in range(repl.num_local_replicas):
    x = rows[r:r + 1]
    np.testing.assert_allclose(outputs[r], _oracle(x), rtol=1e-6)
    np.testing.assert_allclose(sequenced[r], 2.0 * x if x.sum() > 0 else x, rtol=1e-6)
  # Sonnet's own modules ran as written in the trace; the rules are gone after.
  assert rules_inside == [False] * repl.num_local_replicas
  assert _sonnet_linear_converted()


def test_sonnets_modules_are_converted_in_the_users_own_functions_still():
  repl = replicator.GpuReplicator(device="/cpu:0")
  with repl.context():
    linear = snt.Linear(2)
  repl.run(lambda: linear(tf.ones([1, 3])))
  seen, other = [], snt.Linear(2)
  other(tf.ones([1, 3]))  # built eagerly: one trace below

  @tf.function
  def f():
    seen.append(_sonnet_linear_converted())
    return other(tf.ones([1, 3]))

  f.get_concrete_function()
  assert seen == [True]
