"""Variables a step's first trace makes, on both engines: one lifting of their
initial values (`replicator.variables.lifting`), the same results.

Every test runs on the in-graph engine (`gpu`, `multi_gpu_2`), on the strategy
engine over logical CPUs (`tpu_engine_2`) and under TensorFlow's real
TPUStrategy over a fake TPU (`fake_tpu`, which traces each step without
running it: its variables' initial values are real, its step's results zeros).
"""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
from replicator import testing
from replicator.variables import lifting

ENGINES = ["gpu", "multi_gpu_2", "tpu_engine_2", "fake_tpu"]
GLOBAL_BATCH = 8


def make(name):
  if name == "fake_tpu":
    return testing.tpu_engine_on_fake_tpu(2)
  return catalogue.make(name)


def runs(name) -> bool:
  """Whether `name`'s steps run (the fake TPU's are traced only)."""
  return name != "fake_tpu"


def assert_every_copy(variable, want, err_msg=""):
  for r, copy in enumerate(variable.replicas):
    np.testing.assert_array_equal(copy.numpy(), want, err_msg=f"{err_msg} copy {r}")


def _model():
  return snt.Sequential([
      snt.Linear(6, w_init=snt.initializers.VarianceScaling(seed=1)), tf.nn.relu,
      snt.Linear(4, w_init=snt.initializers.TruncatedNormal(seed=3),
                 b_init=snt.initializers.RandomUniform(-0.1, 0.1, seed=2))])


@pytest.mark.parametrize("name", ENGINES)
def test_a_model_built_in_the_first_step_starts_and_trains_as_on_one_device(name):
  repl = make(name)
  x, y = catalogue.classification_data(num_examples=GLOBAL_BATCH)
  with repl.context():
    model = _model()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1))
  oracle = _model()  # the same seeded initializers, drawn in a function as in a step
  tf.function(lambda: oracle(x[:1]))()
  oracle_output = oracle(x).numpy()

  input_fn = catalogue.input_fn_for(x, y, GLOBAL_BATCH, repeat=True)
  output = repl.run(lambda batch: model(batch[0]), input_fn)  # builds it
  for variable, want in zip(model.variables, oracle.variables):
    assert variable.shape == want.shape and variable.dtype == want.dtype
    assert_every_copy(variable, want.numpy(), variable.name)
  n = repl.num_local_replicas
  assert tuple(output.shape) == (n, GLOBAL_BATCH // n, 4)
  if runs(name):
    np.testing.assert_allclose(output, oracle_output.reshape(n, -1, 4), rtol=1e-5, atol=1e-6)

  loss = repl.run(catalogue.train_step(model, optimizer), input_fn)
  with tf.GradientTape() as tape:
    want_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, oracle(x)))
  snt.optimizers.SGD(0.1).apply(tape.gradient(want_loss, oracle.trainable_variables),
                                oracle.trainable_variables)
  assert tuple(loss.shape) == (n,)
  if runs(name):
    np.testing.assert_allclose(np.mean(loss), want_loss.numpy(), rtol=1e-5)
    for variable, want in zip(model.variables, oracle.variables):
      for copy in variable.replicas:
        np.testing.assert_allclose(copy.numpy(), want.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=variable.name)


@pytest.mark.parametrize("name", ENGINES)
def test_initial_values_of_unknown_static_shape(name):
  """tf.unique's rows, and a value whose variable declares no shape: their
  shapes are known when the initializers run, not when the step is traced."""
  repl = make(name)
  made = {}

  def step_fn():
    if not made:
      made["unique"] = tf.Variable(tf.unique(tf.constant([3.0, 1.0, 3.0, 2.0]))[0])
      made["declared"] = tf.Variable(tf.range(3.0) * 2.0, shape=tf.TensorShape(None))
    return tf.add_n([tf.reduce_sum(v) for v in made.values()])

  total = repl.run(step_fn)
  assert made["unique"].shape.as_list() == [None]
  assert made["declared"].shape.rank is None
  assert_every_copy(made["unique"], [3.0, 1.0, 2.0], "unique")
  assert_every_copy(made["declared"], [0.0, 2.0, 4.0], "declared")
  if runs(name):
    np.testing.assert_array_equal(total, [12.0] * repl.num_local_replicas)
    np.testing.assert_array_equal(repl.run(step_fn), [12.0] * repl.num_local_replicas)


@pytest.mark.parametrize("name", ENGINES)
def test_an_initial_value_from_a_variable_the_step_changed_first_is_refused(name):
  """At the trace's end TensorFlow orders the read after the step's write:
  the initial value would need the step to have run."""
  repl = make(name)
  with repl.context():
    w = tf.Variable(1.0)
  made = []

  def step_fn():
    w.assign_add(1.0)
    if not made:
      made.append(tf.Variable(w * 2.0, name="from_w"))
    return made[0].read_value()

  with pytest.raises(ValueError, match=r"creates the variable .*from_w.* depends on what "
                                       r"the step did before"):
    repl.run(step_fn)
  assert_every_copy(w, 1.0, "w")


@pytest.mark.parametrize("name", ENGINES)
def test_an_initial_value_from_a_variable_made_earlier_in_the_step(name):
  """Lifted after the value it reads is assigned; the orderings TensorFlow
  adds at the trace's end (a stateful draw after the step's) do not run."""
  repl = make(name)
  made = []
  with repl.context():
    steps = tf.Variable(0, dtype=tf.int64)

  def step_fn():
    steps.assign_add(1)
    if not made:
      made.append(tf.Variable(tf.random.stateless_uniform([2], (1, 2)) + 1.0))
      made.append(tf.Variable(made[0] * 3.0))
      made.append(tf.Variable(tf.random.uniform([2], seed=5, dtype=tf.float32)))
    return made[1].read_value()

  repl.run(step_fn)
  first = tf.random.stateless_uniform([2], (1, 2)).numpy() + 1.0
  assert_every_copy(made[0], first, "made[0]")
  assert_every_copy(made[1], first * 3.0, "made[1]")
  values = [copy.numpy() for copy in made[2].replicas]
  assert all(np.all((v >= 0) & (v < 1)) for v in values)
  assert all(np.array_equal(v, values[0]) for v in values)
  if runs(name):
    assert_every_copy(steps, 1, "steps")  # the write ran in the step, not at init


class _Copied:
  """Counts how the initializers were copied out of the trace."""

  def __init__(self, monkeypatch):
    self.imported = 0  # batches `lifting.imported` took
    self.one_by_one = 0  # `lift_to_graph` calls
    imported, lift = lifting.imported, lifting.lift_to_graph.lift_to_graph

    def counted_import(batch, copies):
      taken = imported(batch, copies)
      self.imported += taken
      return taken

    def counted_lift(*args, **kwargs):
      self.one_by_one += 1
      return lift(*args, **kwargs)

    monkeypatch.setattr(lifting, "imported", counted_import)
    monkeypatch.setattr(lifting.lift_to_graph, "lift_to_graph", counted_lift)


@pytest.mark.parametrize("name", ENGINES)
def test_a_models_initializers_are_copied_in_one_import(name, monkeypatch):
  """The usual case (no value reads a captured one) takes one import_graph_def,
  and each seeded draw gives what it gives on one device."""
  repl = make(name)
  x, _ = catalogue.classification_data(num_examples=GLOBAL_BATCH)
  with repl.context():
    model = _model()
  oracle = _model()
  tf.function(lambda: oracle(x[:1]))()  # (tf.function lifts its own one by one)
  copied = _Copied(monkeypatch)
  repl.run(lambda: model(tf.constant(x[:2])))
  assert (copied.imported, copied.one_by_one) == (1, 0)
  for variable, want in zip(model.variables, oracle.variables):
    assert_every_copy(variable, want.numpy(), variable.name)


@pytest.mark.parametrize("name", ENGINES)
def test_a_draw_that_initial_values_share_across_batches_is_drawn_once(name, monkeypatch):
  """`c`'s value shares the unseeded draw `r` with `a`'s, but is copied after
  `b`'s (which reads `a`, so is copied alone): `r` is not copied, so not
  drawn, a second time."""
  copied = _Copied(monkeypatch)
  repl = make(name)
  made = []

  def step_fn():
    if not made:
      r = tf.random.normal([64])
      made.append(tf.Variable(r, name="a"))
      made.append(tf.Variable(made[0] * 2.0, name="b"))
      made.append(tf.Variable(r + 1.0, name="c"))
    return made[2].read_value()

  repl.run(step_fn)
  assert (copied.imported, copied.one_by_one) == (2, 1)
  a = made[0].replicas[0].numpy()
  assert np.std(a) > 0.1  # a draw, not zeros
  assert_every_copy(made[0], a, "a")
  assert_every_copy(made[1], a * 2.0, "b")
  assert_every_copy(made[2], a + 1.0, "c")
