"""Replica-safe state: aggregated assignments, counters, per-replica randomness."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import catalogue
import replicator
from replicator.collectives import reductions


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_replicas_stay_bit_identical_and_the_check_fires(name):
  x, y = catalogue.classification_data()
  repl = catalogue.make(name)
  with repl.context():
    model = catalogue.mlp()
    bn = snt.BatchNorm(True, True)
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

  def step_fn(batch):
    with tf.GradientTape() as tape:
      hidden = bn(batch[0], is_training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          batch[1], model(hidden)))
    variables = model.trainable_variables + bn.trainable_variables
    optimizer.apply(tape.gradient(loss, variables), variables)
    return loss

  repl.run(step_fn, catalogue.input_fn_for(x, y, 32, repeat=True), steps=200)
  everything = list(model.variables) + list(bn.variables) + list(optimizer.variables)
  repl.assert_replicas_in_sync(everything)
  target = model.variables[1]
  target.replicas[-1].assign_add(tf.ones_like(target.replicas[-1]) * 1e-7)
  with pytest.raises(replicator.ReplicasDiverged, match=target.name.split(":")[0]):
    repl.assert_replicas_in_sync(everything)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_float_assignments_average_and_integers_advance_once(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    stat = tf.Variable(tf.zeros([3]))
    counter = tf.Variable(0, dtype=tf.int64)
    total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

  def step_fn():
    r = tf.cast(repl.replica_id, tf.float32)
    stat.assign(tf.fill([3], r))
    counter.assign_add(1)
    total.assign(r)
    return stat.read_value()

  out = repl.run(step_fn, steps=3)
  mean_id = np.mean(np.arange(n))
  np.testing.assert_allclose(out.numpy(), np.full((n, 3), mean_id))
  for copy in stat.replicas:
    np.testing.assert_allclose(copy.numpy(), [mean_id] * 3)
  for copy in counter.replicas:
    assert copy.numpy() == 3
  for copy in total.replicas:
    assert copy.numpy() == np.sum(np.arange(n))
  repl.assert_replicas_in_sync([stat, counter, total])


# Merged as collectives, or as sums in the graph: the in-graph engine's two
# ways (the strategy engine has one, tf.distribute's collectives).
_MERGE_CASES = [(name, collective) for name in catalogue.MULTI
                for collective in (True, False)
                if catalogue.in_graph(name) or collective]
_MERGE_IDS = [f"{name}-{'collectives' if collective else 'in-graph sums'}"
              for name, collective in _MERGE_CASES]


@pytest.mark.parametrize("name,collective", _MERGE_CASES, ids=_MERGE_IDS)
def test_every_aggregated_write_is_merged(name, collective, monkeypatch):
  # snt.BatchNorm's step counter and debiased average are updates every
  # replica computes alike: they are merged all the same (no write is assumed
  # equal on every replica). Where merges are collectives every one of them
  # waits for the end of the step: the means in one packed all-reduce, the
  # integer in another (a sum in which every replica but the first gives
  # zeros); in the graph each merges at its write (the integer by broadcast).
  if collective:
    _merged_by_collectives(monkeypatch)
  repl = catalogue.make(name)
  n = repl.num_replicas
  merges = _recorded_merges(monkeypatch)
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)
    scaled = tf.Variable(1.0)
    hidden = tf.Variable([0.5, 0.25])
    debiased = tf.Variable([0.0, 0.0])
    per_replica = tf.Variable(tf.zeros([3]))
    from_sum = tf.Variable(0.0)

  def step_fn():
    counter.assign_add(1)
    scaled.assign(scaled * 2.0 + tf.cast(counter, tf.float32))
    debiased.assign(hidden / (1.0 - tf.pow(0.9, tf.cast(counter, tf.float32))))
    per_replica.assign(tf.fill([3], tf.cast(repl.replica_id, tf.float32)))
    from_sum.assign(repl.all_sum(tf.cast(repl.replica_id, tf.float32)))

  repl.run(step_fn, steps=3)
  if not catalogue.in_graph(name):
    pass  # merged at each write, by tf.distribute's collectives
  elif collective:  # the all_sum; at the end, the four means, then the counter
    assert merges == [("all_reduce", 1), ("all_reduce", 4), ("all_reduce", 1)]
  else:  # each at its write, in step_fn's order
    assert merges == [("broadcast", 1), ("all_reduce", 1), ("all_reduce", 1),
                      ("all_reduce", 1), ("all_reduce", 1), ("all_reduce", 1)]
  # (deferred, `scaled` reads the counter its own replica wrote: the same)
  assert int(counter) == 3 and float(scaled) == 19.0  # 1 -> 3 -> 8 -> 19
  np.testing.assert_allclose(debiased.numpy(), np.array([0.5, 0.25]) / (1 - 0.9 ** 3),
                             rtol=1e-6)
  np.testing.assert_allclose(per_replica.numpy(), [np.mean(np.arange(n))] * 3)
  assert float(from_sum) == np.sum(np.arange(n))
  repl.assert_replicas_in_sync([counter, scaled, debiased, per_replica, from_sum])


def _recorded_merges(monkeypatch):
  """The `(kind, tensors a replica gives)` of each all-reduce and broadcast
  traced from here on, in order."""
  merges = []
  for kind in ("all_reduce", "broadcast"):
    real = getattr(reductions, kind)
    monkeypatch.setattr(reductions, kind, lambda *a, real=real, kind=kind, **k: (
        merges.append((kind, len(a[0][0]))), real(*a, **k))[1])
  return merges


def _merged_by_collectives(monkeypatch):
  """Local replicas on logical CPUs merged as on GPUs or several workers, where
  a merge is a collective and waits for the end of the step (the same code
  but for the kernel; test_multiworker's agree.py runs it between workers)."""
  monkeypatch.setattr(reductions, "merged_by_collectives", lambda devices, workers: True)


@pytest.mark.parametrize("name,collective", _MERGE_CASES, ids=_MERGE_IDS)
def test_float_writes_merge_once_at_the_end_of_the_step(name, collective, monkeypatch):
  # snt.BatchNorm's moving averages: a hidden average written, then read into
  # the debiased one. Where merges are collectives both wait for the step's
  # end and are averaged there together, in one all-reduce (between workers:
  # one round trip, not two a statistic); where they are sums in the graph,
  # each merges at its write.
  if collective:
    _merged_by_collectives(monkeypatch)
  repl = catalogue.make(name)
  n = repl.num_replicas
  merges = _recorded_merges(monkeypatch)
  with repl.context():
    hidden = tf.Variable([1.0, 2.0])
    debiased = tf.Variable([0.0, 0.0])
    other = tf.Variable(0.0)

  def step_fn():
    r = tf.cast(repl.replica_id, tf.float32)
    hidden.assign_sub((hidden - r) * 0.5)  # read before the write: the merged value
    debiased.assign(hidden / 0.75)  # read after: this replica's, merged at the end
    other.assign(r * r)

  repl.run(step_fn, steps=2)
  # one all-reduce of the three variables, once in the trace; or one at each write
  if catalogue.in_graph(name):
    assert merges == ([("all_reduce", 3)] if collective
                      else [("all_reduce", 1)] * 3)
  h, d = np.array([1.0, 2.0]), None
  for _ in range(2):  # the mean of what each replica's writes leave
    finals = [h - (h - r) * 0.5 for r in range(n)]
    h, d = np.mean(finals, 0), np.mean([f / 0.75 for f in finals], 0)
  np.testing.assert_allclose(hidden.numpy(), h, rtol=1e-6)
  np.testing.assert_allclose(debiased.numpy(), d, rtol=1e-6)
  np.testing.assert_allclose(float(other), np.mean(np.arange(n) ** 2), rtol=1e-6)
  repl.assert_replicas_in_sync([hidden, debiased, other])


READS_AFTER_A_WRITE = {
    "returned": lambda v, loss, repl: v.read_value(),
    "into the loss's gradient": lambda v, loss, repl: loss(v.read_value()),
    "into a collective": lambda v, loss, repl: repl.all_max(v.read_value()),
    "inside a tf.cond": lambda v, loss, repl: tf.cond(
        tf.constant(True), lambda: v * 1.0, lambda: v * 2.0),
    "by its handle": lambda v, loss, repl: tf.raw_ops.ReadVariableOp(
        resource=v.handle, dtype=tf.float32),
}


@pytest.mark.parametrize("read", sorted(READS_AFTER_A_WRITE))
@pytest.mark.parametrize("name", catalogue.MULTI)
def test_a_read_after_a_write_that_reaches_the_step_sees_the_merged_value(
    name, read, monkeypatch):
  # Where a read after the write reaches anything but another deferred write,
  # the step is traced again with that variable merged where it is written:
  # every replica reads the mean, as a merge at the write gives. (Deferred,
  # each replica would read its own value, and the outputs would differ.)
  _merged_by_collectives(monkeypatch)
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    stat = tf.Variable(tf.zeros([2]))
    weight = tf.Variable(3.0)
    optimizer = repl.wrap_optimizer(snt.optimizers.SGD(0.5))
  later = READS_AFTER_A_WRITE[read]

  def loss_of(value):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(value) * weight
    optimizer.apply(tape.gradient(loss, [weight]), [weight])
    return tf.fill([2], loss)

  def step_fn():
    stat.assign(tf.fill([2], tf.cast(repl.replica_id, tf.float32) + 1.0))
    return tf.convert_to_tensor(later(stat, loss_of, repl)) * 1.0

  out = repl.run(step_fn).numpy()
  mean = np.mean(np.arange(n) + 1.0)
  expected = {"into the loss's gradient": 2 * mean * 3.0}.get(read, mean)
  np.testing.assert_allclose(out, np.full((n, 2), expected), rtol=1e-6)
  np.testing.assert_allclose(stat.numpy(), [mean, mean], rtol=1e-6)
  if read == "into the loss's gradient":  # the gradient of sum(stat) * weight
    np.testing.assert_allclose(float(weight), 3.0 - 0.5 * 2 * mean, rtol=1e-6)
  repl.assert_replicas_in_sync([stat, weight])


def test_a_variable_made_in_the_first_step_and_read_after_its_write_is_made_once(
    monkeypatch):
  # The second trace (merging at the write) finds the module built by the first.
  _merged_by_collectives(monkeypatch)
  repl = catalogue.make("multi_gpu_2")

  class Stat(snt.Module):

    @snt.once
    def _initialize(self):
      self.value = tf.Variable(tf.zeros([2]), trainable=False)

    def __call__(self, x):
      self._initialize()
      self.value.assign(x)
      return self.value.read_value() + 0.0  # returned

  with repl.context():
    stat = Stat()
  out = repl.run(lambda: stat(tf.fill([2], tf.cast(repl.replica_id, tf.float32))))
  np.testing.assert_allclose(out.numpy(), [[0.5, 0.5]] * 2)
  assert len(stat.variables) == 1
  np.testing.assert_allclose(stat.value.numpy(), [0.5, 0.5])
  repl.assert_replicas_in_sync(stat.variables)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_batch_norm_statistics_are_the_mean_over_replicas(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  rng = np.random.RandomState(0)
  data = (rng.randn(n * 8, 5) * np.arange(1, 6) + 3).astype(np.float32)
  with repl.context():
    bn = snt.BatchNorm(True, True, decay_rate=0.9)

  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices(data).batch(8, drop_remainder=True)

  repl.run(lambda x: bn(x, is_training=True), input_fn)
  shards = data.reshape(n, 8, 5)
  local_means = shards.mean(axis=1)  # snt.BatchNorm uses local statistics
  # The first EMA update is debiased: average == the (aggregated) value.
  for copy in bn.moving_mean.average.replicas:
    np.testing.assert_allclose(copy.numpy().ravel(), local_means.mean(0), rtol=1e-5)
  repl.assert_replicas_in_sync(bn.variables)


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_random_draws_differ_between_replicas_and_repeat_with_the_seed(name):
  def draw():
    tf.random.set_seed(7)
    repl = catalogue.make(name)
    generator = repl.random_generator(seed=3)
    with repl.context():  # its state is replicated; each replica hashes in its id
      made_in_context = tf.random.Generator.from_seed(4)

    def step_fn():
      return {"op": tf.random.normal([4]), "op_seeded": tf.random.uniform([4], seed=5),
              "generator": generator.normal([4]),
              "tf.random.Generator": made_in_context.normal([4])}
    return {k: v.numpy() for k, v in repl.run(step_fn).items()}

  first, second = draw(), draw()
  # Replica 0 draws what the same generator draws on one device.
  one_device = tf.random.Generator.from_seed(4)
  np.testing.assert_allclose(
      first["tf.random.Generator"][0], tf.function(lambda: one_device.normal([4]))(),
      rtol=1e-6)
  # Every stream is reproducible: the strategy engine's stand-in (the TPU
  # emulator) checks that XLA compiles the step, then runs TensorFlow's
  # kernels, which honour the seeds of stateful tf.random ops (on a TPU,
  # XLA ignores them; the generators' streams are reproducible there too).
  for key, values in first.items():
    n = values.shape[0]
    for a in range(n):
      for b in range(a + 1, n):
        assert not np.allclose(values[a], values[b]), (key, a, b)
    np.testing.assert_array_equal(values, second[key])


def test_a_generator_in_an_xla_compiled_step_draws_what_one_device_draws_compiled():
  # XLA's normal draws differ from TensorFlow's kernel's: compiled alike,
  # a generator made in the context draws what it draws on one device; XLA
  # ignores the seeds of stateful tf.random ops, the generators' streams are
  # reproducible.
  def draw():
    repl = replicator.GpuReplicator(device="/cpu:0", jit_compile=True)
    generator = repl.random_generator(seed=3)
    with repl.context():
      made_in_context = tf.random.Generator.from_seed(4)
    return {k: v.numpy() for k, v in repl.run(lambda: {
        "generator": generator.normal([4]),
        "tf.random.Generator": made_in_context.normal([4])}).items()}

  first, second = draw(), draw()
  one_device = tf.random.Generator.from_seed(4)
  np.testing.assert_allclose(
      first["tf.random.Generator"][0],
      tf.function(lambda: one_device.normal([4]), jit_compile=True)(), rtol=1e-6)
  for key, values in first.items():
    np.testing.assert_array_equal(values, second[key], err_msg=key)


@pytest.mark.parametrize("name", list(catalogue.REPLICATORS))
def test_sparse_and_slice_writes_keep_every_copy_equal(name):
  repl = catalogue.make(name)
  n = repl.num_replicas
  with repl.context():
    bank = tf.Variable(tf.zeros([2 * n, 3]))  # a memory bank: MEAN, the default
    histogram = tf.Variable(tf.zeros([4]), aggregation=tf.VariableAggregation.SUM)
    peak = tf.Variable(tf.zeros([4]))
    seen = tf.Variable(tf.zeros([4], tf.int32))
    grid = tf.Variable(tf.zeros([n, 2]))
    sliced = tf.Variable(tf.zeros([2, 3]))

  def step_fn():
    r = repl.replica_id
    rf = tf.cast(r, tf.float32)
    bank.scatter_update(tf.IndexedSlices(tf.fill([2, 3], rf + 1), tf.stack([2 * r, 2 * r + 1])))
    bank.scatter_add(tf.IndexedSlices(tf.fill([1, 3], rf + 1), tf.constant([0])))
    histogram.scatter_add(tf.IndexedSlices(tf.fill([2], rf + 1), tf.constant([0, 3])))
    peak.scatter_max(tf.IndexedSlices(tf.reshape(rf, [1]), tf.reshape(r % 4, [1])))
    seen.scatter_add(tf.IndexedSlices(tf.reshape(r + 1, [1]), tf.constant([1])))
    grid.scatter_nd_update(tf.reshape(tf.stack([r, 1]), [1, 2]), tf.reshape(rf + 5, [1]))
    sliced[1, 1:].assign(tf.fill([2], rf))  # a slice assignment: averaged like assign
    return bank.read_value()

  out = repl.run(step_fn)
  ids = np.arange(n)
  want_bank = np.repeat(ids + 1.0, 2)[:, None] * np.ones([1, 3])
  want_bank[0] += np.mean(ids + 1.0)  # a MEAN variable adds the mean delta
  want_peak = np.zeros(4)
  for r in ids:
    want_peak[r % 4] = max(want_peak[r % 4], r)
  want_grid = np.stack([np.zeros(n), ids + 5.0], axis=1)
  np.testing.assert_allclose(out.numpy(), np.stack([want_bank] * n), rtol=1e-6)
  for copies, want in [(bank, want_bank), (peak, want_peak), (grid, want_grid),
                       (histogram, [np.sum(ids + 1.0), 0, 0, np.sum(ids + 1.0)]),
                       (sliced, [[0, 0, 0], [0, np.mean(ids), np.mean(ids)]]),
                       (seen, [0, 1, 0, 0])]:  # integers: replica 0's rows alone
    for copy in copies.replicas:
      np.testing.assert_allclose(copy.numpy(), want, rtol=1e-6, err_msg=copies.name)
  repl.assert_replicas_in_sync([bank, histogram, peak, seen, grid, sliced])

  bank.scatter_update(tf.IndexedSlices(tf.fill([1, 3], -1.0), tf.constant([1])))
  for copy in bank.replicas:  # outside a step: every copy
    np.testing.assert_array_equal(copy.numpy()[1], [-1.0] * 3)
  with pytest.raises(TypeError, match="sparse_delta.*IndexedSlices"):
    bank.scatter_add(tf.ones([2, 3]))


@pytest.mark.parametrize("name", catalogue.MULTI)
def test_keras_random_layers_draw_differently_per_replica_and_reproducibly(name):
  keras = pytest.importorskip("keras")

  def draw():
    repl = catalogue.make(name)
    with repl.context():
      dropout = keras.layers.Dropout(0.5, seed=11)
      noise = keras.random.SeedGenerator(3)

    def step_fn():
      return {"dropout": dropout(tf.ones([64]), training=True),
              "normal": keras.random.normal([16], seed=noise),
              "int_seed": keras.random.uniform([16], seed=5)}
    out = {k: v.numpy() for k, v in repl.run(step_fn, steps=2).items()}
    repl.assert_replicas_in_sync([noise.state.value])
    return out

  first, second = draw(), draw()
  for key, values in first.items():
    for a in range(len(values)):
      for b in range(a + 1, len(values)):
        assert not np.array_equal(values[a], values[b]), (key, a, b)
    np.testing.assert_array_equal(values, second[key])
