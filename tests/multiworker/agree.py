"""A worker of the multi-worker error tests: misuses every worker survives.

Prints one line per case: what `run` raised on this worker (the test checks
every worker's lines), then `DONE`.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import sonnet as snt
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import replicator
from replicator.collectives import between_workers
from replicator.collectives import reductions
from replicator.variables import lifting


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--ckpt", required=True)
  args = parser.parse_args()
  repl = replicator.MultiGpuReplicator()
  worker = repl.mesh.worker_index
  with repl.context():
    v = tf.Variable(tf.ones([3]))

  def step_fn():
    v.assign_add(tf.ones([3]))
    return repl.all_sum(v.read_value())

  repl.run(step_fn)
  if repl.is_chief:  # a slow disk: the pointer moves 0.5 s after the data
    rename = tf.io.gfile.rename
    tf.io.gfile.rename = lambda *a, **k: (time.sleep(0.5), rename(*a, **k))
  checkpointer = replicator.Checkpointer(args.ckpt, v=v)
  restored = []
  for step in (1, 2):  # save, then roll back at once
    checkpointer.save(step)
    restored.append(checkpointer.restore_latest())
  print(f"CKPT {restored}", flush=True)
  try:  # each worker its own directory: only the chief's has checkpoints
    unshared = replicator.Checkpointer(f"{args.ckpt}_{worker}", v=v)
    unshared.save(3)
    print(f"UNSHARED restored {unshared.restore_latest()}", flush=True)
  except ValueError as error:
    print(f"UNSHARED {error}", flush=True)
  try:  # different steps on different workers: an error on each, no hang
    repl.run(step_fn, steps=1 + worker)
    print("STEPS ran", flush=True)
  except ValueError as error:
    print(f"STEPS {error}", flush=True)
  print(f"AFTER {repl.run(step_fn, steps=2).numpy()[0].tolist()}", flush=True)

  def numbers(ctx):  # worker w's elements: 100 w, 100 w + 1, ...
    return tf.data.Dataset.range(100).map(lambda i: tf.cast(i + 100 * worker, tf.float32))

  def sum_of_batches(x):
    return repl.all_sum(x)

  def loops_traced():  # the number of traces of the step's loop on this worker
    compiled = repl._engine._steps[(sum_of_batches, numbers)]  # pylint: disable=protected-access
    return compiled._loop.experimental_get_tracing_count()  # pylint: disable=protected-access

  try:  # the same with input: the one-step function against the loop of two
    repl.run(sum_of_batches, numbers, steps=1 + worker)
    print("INPUT_STEPS ran", flush=True)
  except ValueError as error:
    print(f"INPUT_STEPS {error}", flush=True)
  print(f"INPUT_LOOPS {loops_traced()}", flush=True)
  # the loop, traced now on the chief and before on the other worker
  print(f"INPUT_AFTER {repl.run(sum_of_batches, numbers, steps=2).numpy().tolist()} "
        f"{loops_traced()}", flush=True)

  def numerics_fn():  # v reaches 6 in these steps: inf on every worker
    v.assign_add(tf.ones([3]))
    tf.debugging.check_numerics(v / (v - 6.0), "v hit 6")
    return repl.all_sum(v.read_value())

  try:
    repl.run(numerics_fn, steps=3)
  except Exception as error:  # pylint: disable=broad-except
    print(f"NUMERICS {type(error).__name__}", flush=True)

  def branching_fn():  # the chief alone takes a second collective
    total = repl.all_sum(v.read_value())
    if worker == 0:
      total += repl.all_max(v.read_value())
    return total

  try:  # different programs on different workers: an error on each, no hang
    repl.run(branching_fn)
    print("BRANCH ran", flush=True)
  except ValueError as error:
    print(f"BRANCH {error}", flush=True)
  print(f"THEN {repl.run(step_fn).numpy()[0].tolist()}", flush=True)

  with repl.context():
    linear = snt.Linear(2)  # random initial values, the chief's on every worker
  left = []  # how many drawn initial values each trace's lifting left to the chief's
  initialize = lifting.Lifting.initialize

  def counted_initialize(self, *args, **kwargs):
    running = initialize(self, *args, **kwargs)
    left.append(len(self.left))
    return running

  lifting.Lifting.initialize = counted_initialize

  def lazy_branching_fn():  # the same, in the trace that builds a model
    y = repl.all_sum(linear(tf.ones([1, 3])))
    if worker == 0:
      y += repl.all_max(y)
    return y

  try:  # the chief's initial values travel after the check (a hang before)
    repl.run(lazy_branching_fn)
    print("LAZY ran", flush=True)
  except ValueError as error:
    print(f"LAZY {type(error).__name__}", flush=True)
  out = repl.run(lambda: repl.all_sum(linear(tf.ones([1, 3]))))
  print(f"LAZY_THEN {linear.w.numpy().ravel().tolist()} {out.numpy()[0].tolist()}",
        flush=True)
  print(f"LAZY_LEFT {sum(left)}", flush=True)

  with repl.context():
    own = snt.Linear(2)  # the chief makes one more variable: each keeps its own
  more, left[:] = [], []

  def uneven_model_fn():
    if worker == 0 and not more:
      more.append(tf.Variable(tf.random.normal([2])))
    return repl.all_sum(own(tf.ones([1, 3])))

  try:  # the other worker's drawn values (w), left to the chief's, come from none
    repl.run(uneven_model_fn)
    print("OWN ran", flush=True)
  except ValueError as error:
    print(f"OWN {type(error).__name__}", flush=True)
  lifting.Lifting.initialize = initialize
  copies = [copy.numpy() for copy in own.w.replicas]
  print(f"OWN_WHOLE {sum(left)} {all(np.array_equal(c, copies[0]) for c in copies)} "
        f"{bool(np.std(copies[0]) > 0.05)} {own.b.numpy().tolist()}", flush=True)

  made = []

  def chief_variable_fn():  # the chief alone makes a variable; the same collectives
    if worker == 0 and not made:
      made.append(tf.Variable(tf.fill([2], 5.0)))
    return repl.all_sum(v.read_value())

  try:  # the chief would send 1 initial value and the other worker none (a hang)
    repl.run(chief_variable_fn)
    print("EXTRA ran", flush=True)
  except ValueError as error:
    print(f"EXTRA {error}", flush=True)

  def sum_fn():
    return repl.all_sum(v.read_value())

  print(f"EXTRA_THEN {repl.run(sum_fn).numpy()[0].tolist()}", flush=True)

  if worker == 0:  # a variable made in repl.context() on the chief alone
    with repl.context():
      tf.Variable(tf.fill([3], 7.0))

  def context_fn():  # a new step: the check before its first call catches it
    return repl.all_sum(v.read_value())

  try:  # the chief would send 1 initial value and the other worker none
    repl.run(context_fn)
    print("CONTEXT ran", flush=True)
  except ValueError as error:
    print(f"CONTEXT {error}", flush=True)
  print(f"CONTEXT_THEN {repl.run(sum_fn).numpy()[0].tolist()}", flush=True)
  if worker == 0:  # the same before a step traced before (a hang before)
    with repl.context():
      tf.Variable(tf.fill([4], 7.0))  # made on the chief alone
  try:
    repl.run(sum_fn)
    print("CONTEXT_OLD ran", flush=True)
  except ValueError as error:
    print(f"CONTEXT_OLD {error}", flush=True)
  with repl.context():  # the same variables on every worker: the chief's values
    shared = tf.Variable(tf.fill([2], 10.0 + worker))
  print(f"CONTEXT_SHARED {repl.run(sum_fn).numpy()[0].tolist()} "
        f"{shared.numpy().tolist()}", flush=True)

  # Initial values that every worker computed alike do not travel; the others
  # are the chief's. What crosses eagerly (the sends, and their digests' check):
  sent, across_workers, from_chief = [], between_workers.across_workers, between_workers.from_chief
  def counted(collective):
    def run(value, *args, **kwargs):
      if tf.executing_eagerly():
        sent.append(value.shape.num_elements())
      return collective(value, *args, **kwargs)
    return run
  between_workers.across_workers = counted(across_workers)
  between_workers.from_chief = counted(from_chief)
  with repl.context():
    alike = tf.Variable(tf.zeros([5000]))  # the same bits everywhere: not sent
    mine = tf.Variable(tf.fill([3], 1.0 + worker))  # the chief's: sent

  def alike_fn():
    return repl.all_sum(v.read_value())
  repl.run(alike_fn)
  between_workers.across_workers, between_workers.from_chief = across_workers, from_chief
  print(f"ALIKE_SENT {max(sent) < 5000} {3 in sent} {sum(alike.numpy())} "
        f"{mine.numpy().tolist()}", flush=True)

  # Each dtype takes the chief's values bit for bit: those the broadcast
  # carries, and the others as int32 words (-0.0 and a NaN's payload too).
  special = np.array([-0.0, np.nan, 1.5 + worker], np.float32)
  with repl.context():
    kinds = [tf.Variable(tf.constant(special, dtype)) for dtype in (tf.float32, tf.bfloat16)]
    kinds += [tf.Variable(tf.cast(tf.constant([worker, 1 - worker]), dtype))
              for dtype in (tf.int8, tf.bool, tf.int64, tf.complex64)]
  repl.run(alike_fn)
  bits = lambda k: tf.io.serialize_tensor(k.read_value()).numpy().hex()
  print(f"DTYPES {' '.join(map(bits, kinds))} {kinds[0].numpy()[2]} "
        f"{kinds[2].numpy().tolist()}", flush=True)

  def shapes_fn():  # as many collectives, of another shape on the chief
    return repl.all_sum(v.read_value()[:2] if worker == 0 else v.read_value())

  try:  # run, it would abort every collective of both processes for good
    repl.run(shapes_fn)
    print("SHAPES ran", flush=True)
  except ValueError as error:
    print(f"SHAPES {error}", flush=True)
  print(f"STILL {repl.run(step_fn).numpy()[0].tolist()}", flush=True)

  def mixed_input(ctx):  # batch size static on the chief only: one program still
    ds = tf.data.Dataset.range(4).map(lambda i: tf.cast(i + 10 * worker, tf.float32))
    return ds.batch(2, drop_remainder=worker == 0)

  gathered, summed = repl.run(lambda x: (repl.all_gather(x), repl.all_sum(x)),
                              mixed_input)
  print(f"MIXED {gathered.numpy()[0].tolist()} {summed.numpy()[0].tolist()}", flush=True)

  def static_on_chief(ctx):  # static 2 on the chief; 2, then 1 on the other
    ds = tf.data.Dataset.range(4 - worker).map(lambda i: tf.cast(i, tf.float32))
    return replicator.allow_uneven_batches(ds.batch(2, drop_remainder=worker == 0))

  def gather_and_grad(x):  # the gradient reduces parts of either shape too
    with tf.GradientTape() as tape:
      tape.watch(x)
      gathered = repl.all_gather(x)
      loss = tf.reduce_sum(gathered * (1.0 + tf.range(tf.cast(tf.size(gathered),
                                                              tf.float32))))
    return gathered, tape.gradient(loss, x)

  # a size static on the chief only, that the other worker's last batch lacks
  gathered, grad = repl.run(gather_and_grad, static_on_chief, steps=2)
  print(f"STATIC {gathered.numpy()[0].tolist()} {grad.numpy()[0].tolist()}", flush=True)
  print(f"AGAIN {repl.run(step_fn).numpy()[0].tolist()}", flush=True)
  # 1024 then 378 elements: one key each (their hashes collided, an abort)
  collide = lambda ctx: tf.data.Dataset.range(1402).map(
      lambda i: tf.cast(i, tf.float32)).batch(1024)
  print(f"COLLIDE {repl.run(lambda x: repl.all_sum(x), collide, steps=2).numpy()[0][:2]}",
        flush=True)
  collide2 = lambda ctx: tf.data.Dataset.range(784).map(  # 488, then 296
      lambda i: tf.cast(i, tf.float32)).batch(488)
  print(f"COLLIDE2 {repl.run(lambda x: repl.all_sum(x), collide2, steps=2).numpy()[0][:2]}",
        flush=True)
  # [1, 17] then [7, 123]: the shapes' old 16-bit hashes collided (an abort)
  collide3 = lambda ctx: tf.data.Dataset.range(2).map(lambda i: tf.fill(
      tf.where(i == 0, [1, 17], [7, 123]), tf.cast(i + 1, tf.float32)))
  total = repl.run(lambda x: repl.all_sum(x), collide3, steps=2).numpy()[0]
  print(f"COLLIDE3 {total.shape} {np.unique(total).tolist()}", flush=True)

  def unknown_rank(x):  # a reduction of unknown rank, of either shape
    total = repl.all_sum(tf.reshape(x, tf.boolean_mask(tf.shape(x), tf.shape(x) > 0)))
    return tf.ensure_shape(total, [None, None])

  repl.reset_input(collide3)
  total = repl.run(unknown_rank, collide3, steps=2).numpy()[0]
  print(f"UNKNOWN_RANK {total.shape} {np.unique(total).tolist()}", flush=True)
  def swapped_fn():  # two parts, static on one worker and not on the other, swapped
    a, b = tf.ones([4, 3]), 2 * tf.ones([4, 3])
    if worker == 0:
      b = tf.boolean_mask(b, b[:, 0] > 0)
    else:
      a = tf.boolean_mask(a, a[:, 0] > 0)
    return repl.all_gather([a, b])

  try:  # the parts paired wrongly, silently (the same collectives in all)
    repl.run(swapped_fn)
    print("SWAPPED ran", flush=True)
  except ValueError as error:  # ProgramsDiffer
    print(f"SWAPPED {'(run-time shape)' in str(error)}", flush=True)
  # ragged and sparse batches of a static size on the chief only (the ragged
  # one traced other collectives on each worker: ProgramsDiffer)
  lengths = lambda ctx: tf.data.Dataset.range(6).map(
      lambda i: tf.range(i % 3 + 1)).ragged_batch(2, drop_remainder=worker == 0)
  gathered, total = repl.run(
      lambda x: (repl.all_gather(x.row_lengths()), repl.all_sum(tf.reduce_sum(x))),
      lengths, steps=3)
  print(f"RAGGED {gathered.numpy()[0].tolist()} {total.numpy()[0]}", flush=True)
  # a ragged batch of [1, None] elements: its static 1 kept on every worker
  # (lost where the batch dim was relaxed, another trace on each worker)
  uniform = lambda ctx: tf.data.Dataset.range(6).map(
      lambda i: tf.RaggedTensor.from_row_lengths(tf.range(i % 3 + 1), [i % 3 + 1])).batch(
          2, drop_remainder=worker == 0)
  total = repl.run(lambda x: repl.all_sum(tf.reduce_sum(
      tf.reshape(x.to_tensor(), [-1, x.shape[1]]))), uniform, steps=3)
  print(f"UNIFORM {total.numpy()[0]}", flush=True)
  sparse = lambda ctx: tf.data.Dataset.range(6).map(lambda i: tf.sparse.from_dense(
      tf.range(4, dtype=tf.int64) * (i % 2))).batch(2, drop_remainder=worker == 0)
  gathered = repl.run(
      lambda x: repl.all_gather(tf.reduce_sum(tf.sparse.to_dense(x), 1)), sparse, steps=3)
  print(f"SPARSE {gathered.numpy()[0].tolist()}", flush=True)
  # parts empty on every worker (TensorFlow's gather of them crashed)
  empty = repl.run(lambda: repl.all_gather(tf.zeros([0, 3])))
  print(f"EMPTY {empty.numpy().shape}", flush=True)
  # ... or empty in another dim, of a static or a run-time shape (crashed too)
  empty = repl.run(lambda: repl.all_gather(tf.zeros([2, 0])))
  no_columns = lambda ctx: replicator.allow_uneven_batches(tf.data.Dataset.range(1).map(
      lambda i: tf.zeros(tf.stack([i + 2 + worker, i]))))
  uneven = repl.run(lambda x: repl.all_gather(x), no_columns)
  print(f"EMPTY_COLUMNS {empty.numpy().shape} {uneven.numpy().shape}", flush=True)

  def uneven_sum(ctx):  # batches of 2 on the chief, of 1 on the other worker
    ds = tf.data.Dataset.range(4).map(lambda i: tf.cast(i, tf.float32))
    return replicator.allow_uneven_batches(ds.batch(2 - worker))

  wide = replicator.AllReduceOptions(compression=replicator.Compression.BF16,
                                     sum_in_float32=True)
  for name, reduce in [("REDUCE", repl.all_sum),
                       ("WIDE", lambda x: repl.all_reduce(x, options=wide))]:
    try:  # a reduction of batches whose sizes differ: an error on each, no hang
      repl.run(lambda x: reduce(x), uneven_sum)  # pylint: disable=cell-var-from-loop
      print(f"{name} ran", flush=True)
    except tf.errors.InvalidArgumentError as error:
      print(f"{name} {'got values of different shapes on different workers' in str(error)}",
            flush=True)
  print(f"ONWARD {repl.run(step_fn).numpy()[0].tolist()}", flush=True)

  merges = []  # the merges traced from here on
  for kind in ("all_reduce", "broadcast"):
    real = getattr(reductions, kind)
    setattr(reductions, kind, lambda *a, real=real, kind=kind, **k: (
        merges.append(kind), real(*a, **k))[1])
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64)
    doubled = tf.Variable(0, dtype=tf.int64)
    from_worker = tf.Variable(0, dtype=tf.int64)
    from_replica = tf.Variable(0, dtype=tf.int64)
    mean = tf.Variable(0.0)
    hidden = tf.Variable([0.5, 0.25])
    debiased = tf.Variable([0.0, 0.0])

  def counting_fn():  # as snt.BatchNorm's counters; what differs still merged
    counter.assign_add(1)
    doubled.assign(doubled * 2 + counter)
    from_worker.assign(counter * 0 + tf.cast(
        repl.all_sum(tf.cast(repl.replica_id, tf.float32)) - float(worker), tf.int64))
    from_replica.assign(tf.cast(repl.replica_id, tf.int64) + 5)  # the chief's
    # floats computed alike from every worker's copies: merged all the same
    debiased.assign(hidden / (1.0 - tf.pow(0.9, tf.cast(counter, tf.float32))))
    mean.assign(tf.cast(counter, tf.float32) * 0.0 + tf.cast(repl.replica_id, tf.float32))
    return repl.all_sum(v.read_value())

  repl.run(counting_fn, steps=3)
  print(f"COUNTING {sorted(merges)} {counter.numpy()} {doubled.numpy()} "
        f"{from_worker.numpy()} {from_replica.numpy()} {mean.numpy()}", flush=True)
  print(f"ALIKE {debiased.numpy().tobytes().hex()} "
        f"{debiased.numpy().tolist()}", flush=True)

  def reread_fn():  # read after its write, into the output: merged at the write
    mean.assign(tf.cast(repl.replica_id, tf.float32) + 1.0)
    return mean * 2.0 + tf.cast(counter, tf.float32) * 0.0

  print(f"REREAD {repl.run(reread_fn).numpy().tolist()} {mean.numpy()}", flush=True)

  def per_worker_fn():  # a Python number that differs: the chief's wins
    counter.assign_add(1 + worker)
    return repl.all_sum(v.read_value())

  try:
    repl.run(per_worker_fn)
    print("PER_WORKER ran", flush=True)
  except ValueError as error:
    print(f"PER_WORKER {error}", flush=True)
  print(f"PER_WORKER_THEN {counter.numpy()} {repl.run(sum_fn).numpy()[0].tolist()}",
        flush=True)
  print("DONE", flush=True)


if __name__ == "__main__":
  main()
