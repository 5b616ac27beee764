"""wrap_optimizer: reduction, None gradients, clipping, accumulation."""

import keras
import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator

NAMES = ["gpu", "multi_gpu_4", "tpu_engine_2"]


def _quadratic_setup(repl, make_optimizer, **wrap_kwargs):
  with repl.context():
    w = tf.Variable(tf.ones([3]), name="w")
    unused = tf.Variable(tf.ones([2]), name="unused")
    optimizer = repl.wrap_optimizer(make_optimizer(), **wrap_kwargs)
  return w, unused, optimizer


def _oracle_sgd(data, lr, steps_data, clip=None):
  w = np.ones(3)
  for batch in steps_data:
    grad = 2 / 3 * np.mean(batch[:, None] * (w[None] * batch[:, None] - 1.0), 0)
    if clip is not None and np.linalg.norm(grad) > clip:
      grad = grad * clip / np.linalg.norm(grad)
    w = w - lr * grad
  return w


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("make_optimizer", [lambda: snt.optimizers.SGD(0.1),
                                            lambda: keras.optimizers.SGD(0.1)])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_mean_reduction_none_passthrough_and_clipping(name, make_optimizer, clip):
  repl = catalogue.make(name)
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, unused, optimizer = _quadratic_setup(repl, make_optimizer, clip_global_norm=clip)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((w * x[:, None] - 1.0) ** 2)
    grads = tape.gradient(loss, [w, unused])
    assert grads[1] is None
    optimizer.apply(grads, [w, unused])
    return loss

  repl.run(step_fn, input_fn, steps=4)
  global_batches = [data[i * 2 * n:(i + 1) * 2 * n] for i in range(4)]
  want = _oracle_sgd(data, 0.1, global_batches, clip)
  np.testing.assert_allclose(w.numpy(), want, rtol=1e-5)
  np.testing.assert_array_equal(unused.numpy(), np.ones(2))
  repl.assert_replicas_in_sync([w, unused])


@pytest.mark.parametrize("name", NAMES)
def test_sum_reduction_for_losses_divided_by_the_global_batch(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, _, optimizer = _quadratic_setup(repl, lambda: snt.optimizers.SGD(0.1),
                                     gradient_reduction=replicator.ReduceOp.SUM)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum((w * x[:, None] - 1.0) ** 2) / (2 * n) / 3
    optimizer.apply(tape.gradient(loss, [w]), [w])
    return loss

  repl.run(step_fn, input_fn, steps=4)
  want = _oracle_sgd(data, 0.1, [data[i * 2 * n:(i + 1) * 2 * n] for i in range(4)])
  np.testing.assert_allclose(w.numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("make_optimizer", [lambda: snt.optimizers.Adam(0.1),
                                            lambda: keras.optimizers.Adam(0.1)])
def test_accumulate_steps_applies_the_mean_every_kth_step(name, make_optimizer):
  repl = catalogue.make(name)
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, _, optimizer = _quadratic_setup(repl, make_optimizer, accumulate_steps=2)
  oracle_w = tf.Variable(tf.ones([3]))
  oracle_optimizer = make_optimizer()

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  def loss_of(var, x):
    return tf.reduce_mean((var * x[:, None] - 1.0) ** 2)

  def step_fn(x):
    with tf.GradientTape() as tape:
      loss = loss_of(w, x)
    optimizer.apply(tape.gradient(loss, [w]), [w])
    return loss

  repl.run(step_fn, input_fn, steps=1)
  np.testing.assert_array_equal(w.numpy(), np.ones(3))  # nothing applied yet
  repl.run(step_fn, input_fn, steps=3)
  for i in range(2):  # two updates, each on a double global batch
    with tf.GradientTape() as tape:
      loss = loss_of(oracle_w, tf.constant(data[i * 4 * n:(i + 1) * 4 * n]))
    oracle_optimizer.apply(tape.gradient(loss, [oracle_w]), [oracle_w])
  np.testing.assert_allclose(w.numpy(), oracle_w.numpy(), rtol=1e-5)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_2", "tpu_engine_2"])
@pytest.mark.parametrize("make_optimizer", [lambda: snt.optimizers.SGD(1.0),
                                            lambda: snt.optimizers.Adam(1.0),
                                            lambda: keras.optimizers.Adam(1.0),
                                            lambda: keras.optimizers.Adagrad(1.0)],
                         ids=["sgd", "adam", "keras_adam", "keras_adagrad"])
def test_sparse_gradients_from_an_embedding_lookup(name, make_optimizer):
  """Applied as dense gradients, on 1 replica as on N (sparse Adam differs: Sonnet's
  is lazy, Keras' squares a repeated index's slices apart)."""
  repl = catalogue.make(name)
  with repl.context():
    table = tf.Variable(tf.ones([4, 2]))
    optimizer = repl.wrap_optimizer(make_optimizer())
  oracle = tf.Variable(tf.ones([4, 2]))
  oracle_optimizer = make_optimizer()

  def step_fn(indices):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.gather(table, indices))
    grads = tape.gradient(loss, [table])
    assert isinstance(grads[0], tf.IndexedSlices)
    optimizer.apply(grads, [table])
    return loss

  for indices in ([1, 1, 3], [0, 2, 2]):  # row 1 untouched by the second step
    repl.run(step_fn, args=(tf.constant(indices),))
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.gather(oracle, indices))
    oracle_optimizer.apply([tf.convert_to_tensor(tape.gradient(loss, oracle))], [oracle])
  np.testing.assert_allclose(table.numpy(), oracle.numpy(), rtol=1e-5)

# Keras 3 optimizer options that act on the gradients or on their own state.
# Each must act on the reduced gradients, once per step, as on one device.
KERAS_OPTIONS = {
    "global_clipnorm": lambda: keras.optimizers.Adam(0.05, global_clipnorm=0.1),
    "clipnorm": lambda: keras.optimizers.Adam(0.05, clipnorm=0.1),
    "clipvalue": lambda: keras.optimizers.Adam(0.05, clipvalue=0.01),
    "use_ema": lambda: keras.optimizers.Adam(0.05, use_ema=True,
                                             ema_overwrite_frequency=2),
    "gradient_accumulation_steps": lambda: keras.optimizers.Adam(
        0.05, gradient_accumulation_steps=2),
    "loss_scale": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.Adam(0.05), initial_scale=2.0 ** 10),
    "schedule": lambda: keras.optimizers.SGD(
        keras.optimizers.schedules.ExponentialDecay(0.5, 1, 0.5)),
    "adamw": lambda: keras.optimizers.AdamW(0.05, weight_decay=0.1),
}


@pytest.mark.parametrize("option", sorted(KERAS_OPTIONS))
def test_keras_optimizer_options_act_as_on_one_device(option):
  x, y = catalogue.classification_data(num_examples=320)
  make = KERAS_OPTIONS[option]

  def train(model, optimizer, apply):
    def step(features, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels, model(features)))
        scaled = (optimizer.scale_loss(loss) if option == "loss_scale" else loss)
      apply(tape.gradient(scaled, model.trainable_variables),
            model.trainable_variables)
      return loss
    return step

  model, optimizer = catalogue.mlp(), make()
  tf.function(model)(x[:1])  # built in a graph, as in a step: seeded draws as there
  initial = [v.numpy() for v in model.variables]
  oracle_step = tf.function(train(model, optimizer, optimizer.apply))
  for i in range(5):
    oracle_step(x[64 * i:64 * (i + 1)], y[64 * i:64 * (i + 1)])
  oracle = [v.numpy() for v in model.variables]
  assert min(catalogue.norm_relative(a, b) for a, b in zip(oracle, initial)) > 1e-3

  repl = catalogue.make("multi_gpu_4")
  with repl.context():
    model, base = catalogue.mlp(), make()
    optimizer = repl.wrap_optimizer(base)
  step = train(model, base, optimizer.apply)
  repl.run(lambda batch: step(*batch), catalogue.input_fn_for(x, y, 64), steps=5)
  repl.assert_replicas_in_sync(list(model.variables) + list(base.variables))
  for got, want in zip(model.variables, oracle):
    assert catalogue.norm_relative(got.numpy(), want) < 1e-5, (option, got.name)


@pytest.mark.parametrize("name", NAMES)
def test_a_sonnet_optimizer_trains_a_keras_layer(name):
  """On its own Sonnet cannot (its slots read `.device`, which Keras 3 variables lack)."""
  x, y = catalogue.classification_data(num_examples=128)

  def train(layer, optimizer, as_parameters, run):
    def step_fn(batch):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            batch[1], layer(batch[0])))
      grads = tape.gradient(loss, layer.trainable_variables)
      optimizer.apply(grads, as_parameters(layer.trainable_variables))
      return loss
    run(step_fn)

  def keras_layer():
    return keras.layers.Dense(4, kernel_initializer=keras.initializers.GlorotUniform(seed=1))

  oracle = keras_layer()
  def run_plain(step_fn):
    step_fn = tf.function(step_fn)
    for i in range(4):
      step_fn((x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]))
  # Without the library: the Keras variables' own tf.Variables, by hand.
  train(oracle, snt.optimizers.Adam(0.05), lambda vs: [v._value for v in vs], run_plain)  # pylint: disable=protected-access

  repl = catalogue.make(name)
  with repl.context():
    layer, optimizer = keras_layer(), repl.wrap_optimizer(snt.optimizers.Adam(0.05))
  train(layer, optimizer, list, lambda step_fn: repl.run(
      step_fn, catalogue.input_fn_for(x, y, 32), steps=4))
  repl.assert_replicas_in_sync(list(layer.variables) + list(optimizer.variables))
  for got, want in zip(layer.variables, oracle.variables):
    assert catalogue.norm_relative(got.numpy(), want.numpy()) < 1e-5


@pytest.mark.parametrize("reduction", [tf.distribute.ReduceOp.SUM, "sum", "MEAN"])
def test_a_reduction_that_is_not_replicators_names_the_enum_to_pass(reduction):
  repl = catalogue.make("gpu")
  name = getattr(reduction, "name", reduction).upper()
  with pytest.raises(ValueError, match=f"pass replicator.ReduceOp.{name}"):
    repl.wrap_optimizer(snt.optimizers.SGD(0.1), gradient_reduction=reduction)


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("dtype,atol", [(tf.float64, 1e-7), (tf.bfloat16, 4e-3)],
                         ids=["float64", "bfloat16"])
def test_clipping_gradients_of_mixed_float_dtypes(name, dtype, atol):
  """The global norm spans every dtype (TensorFlow's own refuses to mix them)."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  data = np.linspace(1.5, 3.0, 6 * n).astype(np.float32)

  def make_variables():
    return tf.Variable(tf.ones([3]), name="w"), tf.Variable(tf.ones([2], dtype), name="v")

  def loss_of(w, v, x):
    return tf.reduce_mean((w * x[:, None] - 1.0) ** 2) + tf.cast(
        tf.reduce_mean((v * tf.cast(x[:, None], dtype) - 1.0) ** 2), tf.float32)

  with repl.context():
    w, v = make_variables()
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1), clip_global_norm=0.5)

  def step_fn(batch):
    with tf.GradientTape() as tape:
      loss = loss_of(w, v, batch[0])
    optimizer.apply(tape.gradient(loss, [w, v]), [w, v])
    return loss

  repl.run(step_fn, catalogue.input_fn_for(data, data, 2 * n), steps=3)
  oracle_w, oracle_v = make_variables()
  oracle_optimizer = snt.optimizers.SGD(0.1)
  for i in range(3):
    with tf.GradientTape() as tape:
      loss = loss_of(oracle_w, oracle_v, tf.constant(data[2 * n * i:2 * n * (i + 1)]))
    grads = tape.gradient(loss, [oracle_w, oracle_v])
    norm = np.sqrt(sum(np.sum(np.float64(g.numpy()) ** 2) for g in grads))
    assert norm > 0.5  # clipped
    oracle_optimizer.apply([g * tf.cast(0.5 / norm, g.dtype) for g in grads],
                           [oracle_w, oracle_v])
  np.testing.assert_allclose(w.numpy(), oracle_w.numpy(), rtol=1e-5, atol=atol / 40)
  np.testing.assert_allclose(np.float64(v.numpy()), np.float64(oracle_v.numpy()),
                             atol=atol)
  assert np.all(np.float64(v.numpy()) < 0.99)  # trained


@pytest.mark.parametrize("name", ["gpu", "multi_gpu_4", "tpu_engine_2"])
@pytest.mark.parametrize("make_optimizer", [lambda: snt.optimizers.Adam(0.1),
                                            lambda: keras.optimizers.Adam(0.1)],
                         ids=["sonnet", "keras"])
def test_a_variable_whose_first_gradient_was_none_is_trained_later(name,
                                                                   make_optimizer):
  """Both make slots for every variable given on the first apply, None or not."""
  repl = catalogue.make(name)
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, u, optimizer = _quadratic_setup(repl, make_optimizer)
  oracle_w, oracle_u = tf.Variable(tf.ones([3])), tf.Variable(tf.ones([2]))
  oracle_optimizer = make_optimizer()

  def step(w, u, optimizer, train_u):
    def step_fn(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((w * x[:, None] - 1.0) ** 2)
        if train_u:
          loss += tf.reduce_mean((u * x[:, None] - 2.0) ** 2)
      optimizer.apply(tape.gradient(loss, [w, u]), [w, u])
      return loss
    return step_fn

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  steps = {train_u: (step(w, u, optimizer, train_u),
                     tf.function(step(oracle_w, oracle_u, oracle_optimizer, train_u)))
           for train_u in (False, True)}
  for i, train_u in enumerate((False, False, True, True)):
    step_fn, oracle_step = steps[train_u]
    repl.run(step_fn, input_fn)
    oracle_step(tf.constant(data[2 * n * i:2 * n * (i + 1)]))
  np.testing.assert_allclose(w.numpy(), oracle_w.numpy(), rtol=1e-5)
  np.testing.assert_allclose(u.numpy(), oracle_u.numpy(), rtol=1e-5)
  assert np.all(u.numpy() > 1.1)  # trained


@pytest.mark.parametrize("kind", ["keras", "sonnet"])
def test_setting_the_learning_rate_on_the_wrapper_sets_the_optimizers(kind):
  """Keras' learning_rate is a variable; Sonnet's float is compiled into the step."""
  make = {"keras": keras.optimizers.SGD, "sonnet": snt.optimizers.SGD}[kind]
  repl = catalogue.make("multi_gpu_4")
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, _, optimizer = _quadratic_setup(repl, lambda: make(0.5))
  optimizer.learning_rate = 0.1  # before the step compiles: both take it
  oracle_w, oracle_optimizer = tf.Variable(tf.ones([3])), make(0.1)

  def step(w, optimizer):
    def step_fn(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean((w * x[:, None] - 1.0) ** 2)
      optimizer.apply(tape.gradient(loss, [w]), [w])
      return loss
    return step_fn

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  oracle_step = tf.function(step(oracle_w, oracle_optimizer))
  step_fn = step(w, optimizer)
  for i, learning_rate in enumerate([0.1, 0.03]):
    if i and kind == "sonnet":
      with pytest.raises(ValueError, match=r"optimizer.learning_rate.assign\("):
        optimizer.learning_rate = learning_rate
      learning_rate = 0.1  # unchanged
    elif i:
      optimizer.learning_rate = learning_rate
      oracle_optimizer.learning_rate = learning_rate
    assert float(optimizer.optimizer.learning_rate) == pytest.approx(learning_rate)
    repl.run(step_fn, input_fn, steps=2)
    for j in range(2 * i, 2 * i + 2):
      oracle_step(tf.constant(data[2 * n * j:2 * n * (j + 1)]))
  np.testing.assert_allclose(w.numpy(), oracle_w.numpy(), rtol=1e-6)


def _loss_of(v, x, scale=1.0):
  return scale * tf.reduce_mean((v * x[:, None] - 1.0) ** 2)


def _accumulated_oracle(optimizer, variables, loss_fns, global_batches, k=2):
  """On one device: every k batches, apply the mean of their gradients."""
  for start in range(0, len(global_batches), k):
    grads = []
    for x in global_batches[start:start + k]:
      with tf.GradientTape() as tape:
        loss = loss_fns[start // k](tf.constant(x))
      grads.append(tape.gradient(loss, variables))
    mean = [None if g[0] is None else tf.add_n(g) / k for g in zip(*grads)]
    optimizer.apply(mean, variables)


def test_accumulating_two_variable_lists_with_one_optimizer_keeps_them_apart():
  """Two step functions, run in turn, accumulate each their own k gradients."""
  repl = catalogue.make("multi_gpu_4")
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  with repl.context():
    a, b = tf.Variable(tf.ones([3]), name="a"), tf.Variable(tf.ones([5]), name="b")
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.1), accumulate_steps=2)

  def step(v, scale):
    def step_fn(x):
      with tf.GradientTape() as tape:
        loss = _loss_of(v, x, scale)
      optimizer.apply(tape.gradient(loss, [v]), [v])
      return loss
    return step_fn

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  step_a, step_b = step(a, 1.0), step(b, 3.0)
  for step_fn in (step_a, step_b, step_a, step_b):  # one input stream for both
    repl.run(step_fn, input_fn)
  batches = [data[2 * n * i:2 * n * (i + 1)] for i in range(4)]
  for v, scale, mine in ((a, 1.0, batches[0::2]), (b, 3.0, batches[1::2])):
    oracle = tf.Variable(tf.ones(v.shape))
    _accumulated_oracle(snt.optimizers.SGD(0.1), [oracle],
                        [lambda x: _loss_of(oracle, x, scale)], mine)
    np.testing.assert_allclose(v.numpy(), oracle.numpy(), rtol=1e-6)
    assert np.all(v.numpy() < 0.999)

  with repl.context():
    c = tf.Variable(tf.ones([3]), name="c")
  def overlapping(x):
    with tf.GradientTape() as tape:
      loss = _loss_of(a, x) + _loss_of(c, x)
    optimizer.apply(tape.gradient(loss, [a, c]), [a, c])
    return loss
  with pytest.raises(ValueError, match="they share \\[a:0\\].*the same or share none"):
    repl.run(overlapping, input_fn)


@pytest.mark.parametrize("make_optimizer", [lambda: snt.optimizers.Adam(0.1),
                                            lambda: keras.optimizers.Adam(0.1)],
                         ids=["sonnet", "keras"])
def test_accumulating_for_a_variable_frozen_at_first_trains_it_later(make_optimizer):
  """`u`'s gradient is None for the first k steps, then it is trained."""
  repl = catalogue.make("multi_gpu_4")
  n = repl.num_replicas
  data = np.linspace(0.5, 2.0, 8 * n).astype(np.float32)
  w, u, optimizer = _quadratic_setup(repl, make_optimizer, accumulate_steps=2)
  oracle_w, oracle_u = tf.Variable(tf.ones([3])), tf.Variable(tf.ones([2]))

  def loss_fn(w, u, train_u):
    return lambda x: _loss_of(w, x) + (_loss_of(u, x, 5.0) if train_u else 0.0)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(2, drop_remainder=True)

  for train_u in (False, True):
    def step_fn(x, train_u=train_u):
      with tf.GradientTape() as tape:
        loss = loss_fn(w, u, train_u)(x)
      optimizer.apply(tape.gradient(loss, [w, u]), [w, u])
      return loss
    repl.run(step_fn, input_fn, steps=2)
  _accumulated_oracle(make_optimizer(), [oracle_w, oracle_u],
                      [loss_fn(oracle_w, oracle_u, False),
                       loss_fn(oracle_w, oracle_u, True)],
                      [data[2 * n * i:2 * n * (i + 1)] for i in range(4)])
  np.testing.assert_allclose(w.numpy(), oracle_w.numpy(), rtol=1e-5)
  np.testing.assert_allclose(u.numpy(), oracle_u.numpy(), rtol=1e-5)
  assert np.all(u.numpy() < 0.95)  # trained
  repl.assert_replicas_in_sync([w, u] + list(optimizer.variables))
