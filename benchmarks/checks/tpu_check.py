"""On a TPU: `TpuReplicator` (the strategy engine) against one-device oracles.

    python -m benchmarks.checks.tpu_check [--tpu NAME | --stand_in N | --fake_tpu] [--json FILE]

With no flag it builds `replicator.TpuReplicator(tpu=NAME)` (NAME as
`TpuReplicator` takes it: None tries `TPU_NAME`, `COLAB_TPU_ADDR`, then
'local', a TPU VM) and runs every check on it. `--stand_in N` runs the same
checks on `replicator.testing.tpu_engine_on_cpus(N)`, the same engine on a
stand-in strategy over N logical CPUs, so that the script runs without a TPU
(the test suite runs it so, `tests/test_tpu_check.py`). One replicator serves
every check: making a second would initialize the TPU again, which clears its
memory.

`--fake_tpu` builds `replicator.testing.tpu_engine_on_fake_tpu(8)`: TensorFlow's
real `TPUStrategy` over a TPU of 8 cores that exists only as metadata. Every
check makes its models and runs its `run` calls there, and each call is traced
as a TPU host traces it (the loop, `strategy.run` in the TPU's replicate
context, every collective as `cross_replica_sum`, the merged writes, the
optimizer) but not executed: it returns zeros of the traced shapes, and the
variables keep their initial values. So the comparisons of values are skipped,
and each check compares what a trace shows instead: the outputs' structure
(keys, shapes with the 8 replicas, dtypes) against the oracle's, the variables
made by the first trace against a one-device build's (names, shapes, dtypes,
and their initial values where those are seeded), and the traced loop, which
must hold `CrossReplicaSum` ops. It prints `TRACED name: ...` (what was traced,
compared and skipped) or `FAIL name: ...`; the last line is `N/M checks
traced`, and `--json` records each check's runs, outputs and the loop's TPU ops.
What it cannot show: the TPU compiler's verdict (an op with no TPU kernel, a
dynamic shape), memory, numerics and execution (the values, `InputExhausted`,
copies kept in sync); those need a TPU (or `--stand_in`, which executes).

Each check trains or computes on the TPU replicator and compares with an oracle:
`replicator.GpuReplicator(device="/cpu:0")` given the whole global batch, plain
`snt.BatchNorm` on the CPU, or NumPy. It prints `PASS name: largest error ...`
or `FAIL name: ...`; a check that raises prints FAIL with the error (and its
traceback) and the others still run. The last line is `N/M checks passed`; the
exit code is 0 iff all passed. `--json FILE` writes every result, the
replicator, the machine and the precision.

Precision and tolerance. A TPU multiplies float32 matrices with bfloat16 passes
by default (relative error about 1e-3). The script turns TensorFloat-32
execution off before the replicator is made
(`tf.config.experimental.enable_tensor_float_32_execution(False)`), which makes
TensorFlow's XLA bridge ask for precision 'highest' (float32) in every matmul
and convolution; the header line says so. The tolerance is then 1e-5 relative
(of a variable: the largest difference over the largest magnitude of the
oracle's value), on a TPU as on the stand-in. In float32, three steps of these
small models differ from the CPU only by other summation orders and other
exp/log/rsqrt roundings (about 1e-7 on the stand-in; a TPU at 'highest' is
expected within a few times that), while every bug these checks look for is
far larger (a gradient reduced twice is off by the replica count; statistics
of the replica's own batch instead of the global one, by the spread of the
data). A result above 1e-5 fails. On a TPU, one at most 1e-2 (the size of
bfloat16 passes) fails with a NOTE in its line saying so: most likely the
matmuls did not run at 'highest' precision (a TensorFlow build or flag that
ignores the setting), which the numbers alone cannot tell from a small library
error, so it is not passed quietly. Integer results (counters, step counts,
maxima, gathers and broadcasts) and checkpoint round trips must be exact.

Checks (global batch: 8 examples per replica):
  sonnet_adam: a `snt.nets.MLP` built lazily in the first step (its variables
    made on the TPU replicator's first trace; only the optimizer is made in
    `repl.context()`), Sonnet Adam through `repl.wrap_optimizer`, 3 steps (a
    call of 1 step, then one of `steps=2`) on per-replica batches of
    `ctx.per_replica_batch_size(global)`, against the oracle on the global
    batch: every variable and the last loss (`all_mean`).
  keras_sgd: the same with `keras.optimizers.SGD(momentum=0.9)`: gradients
    averaged once (a second reduction, as Keras does under a `tf.distribute`
    strategy, makes the update the replica count times the oracle's; the
    detail gives that ratio).
  cross_replica_batch_norm: `replicator.nn.CrossReplicaBatchNorm` in training
    mode on images whose statistics differ between replicas, 3 steps, against
    `snt.BatchNorm` on the global batch on the CPU: the last step's outputs,
    the moving mean and the moving variance.
  collectives: `all_sum`, `all_mean`, `all_max`, `all_min` (booleans too),
    `all_gather`, `broadcast` (from the last replica) and `replica_id` on
    nests, inside one step, against NumPy, on every replica.
  input_exhausted: an input of 2 steps run with `steps=5` raises
    `replicator.InputExhausted` with `steps_completed == 2`, the last step's
    outputs, and a counter the step advanced once per step.
  checkpoint_roundtrip: 2 steps on the TPU replicator, `Checkpointer.save(2)`,
    `restore_latest()` into a model and optimizer of a `GpuReplicator` (made
    lazily after the restore): the variables equal bit for bit, Adam's step
    count too; then one more step on each side agrees (the optimizer's slots
    came back). With `--fake_tpu` the checkpoint holds the initial values
    (nothing ran), so the same checkpoint is also restored into a model and
    optimizer of the TPU replicator made lazily in a traced step after the
    restore, which must keep the saved values; the last comparison is skipped.
  replicas_in_sync: 2 steps of a model with `CrossReplicaBatchNorm`, a float
    variable each replica writes from its own batch, and Adam, then
    `repl.assert_replicas_in_sync` over every variable (the model's, the
    optimizer's slots and step); the detail gives the largest difference
    between any two replicas' copies.
"""

import argparse
import collections
import functools
import json
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np
import tensorflow as tf

from benchmarks.runs import common

TOLERANCE = 1e-5  # relative, float32 (see the docstring)
BFLOAT16_PASSES = 1e-2  # errors up to this on a TPU: most likely matmul precision
PER_REPLICA_BATCH = 8
FAKE_TPU_CORES = 8  # --fake_tpu: one TPU v2/v3 host
FEATURES = 12
CLASSES = 5
CHECKS = ("sonnet_adam", "keras_sgd", "cross_replica_batch_norm", "collectives",
          "input_exhausted", "checkpoint_roundtrip", "replicas_in_sync")


class Setting:
  """What every check runs on: the TPU replicator and how to judge errors."""

  def __init__(self, repl, on_tpu: bool, workdir, trace_only: bool = False):
    self.repl = repl
    self.on_tpu = on_tpu
    self.workdir = workdir
    self.trace_only = trace_only  # --fake_tpu: runs are traced, not executed
    self.num_replicas = repl.num_replicas
    self.global_batch = PER_REPLICA_BATCH * repl.num_replicas

  def judge(self, errors: dict, tolerance: float = TOLERANCE, exact=()):
    """`(ok, detail, largest)` of relative `errors` (name -> error); the names in
    `exact` must be 0."""
    largest = max(errors.values())
    listed = ", ".join(f"{name} {error:.1e}" for name, error in errors.items())
    ok = all(errors[name] == 0 for name in exact) and all(
        error <= tolerance for name, error in errors.items() if name not in exact)
    detail = f"largest error {largest:.1e} ({listed}; tolerance {tolerance:.0e}"
    detail += f", exact: {', '.join(exact)})" if exact else ")"
    inexact = [errors[name] for name in errors if name not in exact]
    if (not ok and self.on_tpu and all(errors[name] == 0 for name in exact)
        and max(inexact) <= BFLOAT16_PASSES):
      detail += (f"; NOTE: above float32's {tolerance:.0e} but within "
                 f"{BFLOAT16_PASSES:.0e}, the error of bfloat16 matmul passes: most "
                 "likely this TPU did not run float32 matmuls at precision 'highest' "
                 "(TensorFloat-32 execution was turned off), rather than a wrong "
                 "reduction, which is off by the replica count")
    return ok, detail, largest


RESULTS = []


def run_check(name, fn, setting):
  """Runs one check; records, prints and returns its result, whatever happens.

  With `setting.trace_only` (`--fake_tpu`) the check runs on a `TracedRuns` of
  the replicator, and its result also holds what was traced ("traced").
  """
  start = time.time()
  largest, tracer = None, None
  try:
    if setting is None:
      ok, detail = False, "not run: no TPU replicator (see the error above)"
    elif setting.trace_only:
      tracer = setting.repl = TracedRuns(getattr(setting.repl, "repl", setting.repl))
      ok, detail, largest = fn(setting)
      ok, detail = tracer.verdict(ok, detail)
    else:
      ok, detail, largest = fn(setting)
  except Exception as error:  # pylint: disable=broad-except
    ok, detail = False, f"{type(error).__name__}: {str(error)[:600]}"
    traceback.print_exc()
  result = {"check": name, "ok": bool(ok), "detail": detail,
            "largest_error": largest, "seconds": round(time.time() - start, 1)}
  if tracer is not None:
    result["traced"] = tracer.record()
  RESULTS.append(result)
  word = ("TRACED" if tracer is not None else "PASS") if ok else "FAIL"
  print(f"{word} {name}: {detail}", flush=True)
  return result


# --fake_tpu: what a check traced.

# The ops of a TPU step that a trace shows: the collectives, the replicated
# inputs and outputs, the loop and the optional batches that end it.
TPU_OPS = ("CrossReplicaSum", "AllToAll", "CollectivePermute", "TPUReplicateMetadata",
           "TPUReplicatedInput", "TPUReplicatedOutput", "While", "OptionalHasValue")


def describe(outputs):
  """`[{"path", "shape", "dtype"}]` of `outputs`' tensor leaves (None leaves:
  dtype None)."""
  from tensorflow.python.util import nest  # pylint: disable=import-outside-toplevel
  leaves = nest.flatten_with_joined_string_paths(outputs)
  return [{"path": path, "shape": None if leaf is None else list(leaf.shape),
           "dtype": None if leaf is None else leaf.dtype.name} for path, leaf in leaves]


def op_types(graph) -> collections.Counter:
  """Op types in `graph` and in every function its library holds."""
  graph_def = graph.as_graph_def()
  counts = collections.Counter(node.op for node in graph_def.node)
  for function in graph_def.library.function:
    counts.update(node.op for node in function.node_def)
  return counts


class TracedRuns:
  """A replicator whose `run` records what it traced and returned.

  Everything but `run` is the replicator's. `run` calls it with `step_fn`
  wrapped (one wrapper per step_fn, so the replicator's traces are reused),
  so that each trace of step_fn notes its graph; `runs` holds each call's
  steps and outputs (`describe`), and `loop_ops()` counts the ops of the
  traced loops (the outermost graphs that hold a `While`), nested functions
  included. A `GpuReplicator` oracle can be wrapped too, for its outputs.
  """

  def __init__(self, repl):
    self.repl = repl
    self.runs = []
    self._graphs = []
    self._wrapped = {}

  def __getattr__(self, name):
    return getattr(self.repl, name)

  def run(self, step_fn, input_fn=None, *, args=(), steps=1):
    wrapped = self._wrapped.get(step_fn)
    if wrapped is None:
      def wrapped(*inputs):
        from tensorflow.python.framework import func_graph  # pylint: disable=import-outside-toplevel
        graph = tf.compat.v1.get_default_graph()
        while isinstance(getattr(graph, "outer_graph", None), func_graph.FuncGraph):
          graph = graph.outer_graph
        if not any(graph is seen for seen in self._graphs):
          self._graphs.append(graph)
        return step_fn(*inputs)
      wrapped = functools.wraps(step_fn)(wrapped)
      self._wrapped[step_fn] = wrapped
    outputs = self.repl.run(wrapped, input_fn, args=args, steps=steps)
    self.runs.append({"steps": steps, "outputs": describe(outputs)})
    return outputs

  def loop_graphs(self):
    """The graphs of the traced loops (a trace of step_fn alone holds no loop)."""
    return [graph for graph in self._graphs if op_types(graph)["While"]]

  def loop_ops(self) -> collections.Counter:
    counts = collections.Counter()
    for graph in self.loop_graphs():
      counts.update(op_types(graph))
    return counts

  def record(self):
    ops = self.loop_ops()
    return {"runs": self.runs, "loop_ops": {op: ops[op] for op in TPU_OPS if ops[op]}}

  def verdict(self, ok, detail):
    """`(ok, detail)` of a check's own `(ok, detail)` and what it traced."""
    ops = self.loop_ops()
    runs = "; ".join(f"run(steps={r['steps']}) -> " + ", ".join(
        f"{o['path'] or 'output'} {o['dtype']}{o['shape']}" for o in r["outputs"])
                     for r in self.runs)
    listed = ", ".join(f"{op} x{ops[op]}" for op in TPU_OPS if ops[op])
    summary = f"traced {runs or 'no run'}; the loop's TPU ops: {listed or 'none'}"
    if not self.runs:
      ok, summary = False, summary + " (FAILED: nothing traced)"
    elif not ops["CrossReplicaSum"]:
      ok, summary = False, summary + (" (FAILED: no CrossReplicaSum in the traced "
                                      "loop, though every check reduces over replicas)")
    return ok, f"{summary}; {detail}"


def same_outputs(traced, oracle, num_replicas):
  """Problems (a list) between `TracedRuns.runs`' outputs and an oracle's
  (`GpuReplicator`, one replica): the same paths, dtypes and shapes, but for
  the leading replica dimension."""
  problems = []
  for mine, theirs in zip(traced, oracle):
    want = [dict(o, shape=None if o["shape"] is None else [num_replicas] + o["shape"][1:])
            for o in theirs["outputs"]]
    if mine["outputs"] != want:
      problems.append(f"run(steps={mine['steps']}) returned {mine['outputs']}, the "
                      f"oracle's with {num_replicas} replicas {want}")
  return problems


def same_variables(what, mine, theirs, values=True):
  """Problems between two lists of variables: names, shapes, dtypes and (with
  `values`) values, the first copy's on the TPU replicator."""
  mine, theirs = list(mine), list(theirs)
  if len(mine) != len(theirs):
    return [f"{what}: {len(mine)} variables, the one-device build's {len(theirs)}"]
  problems = []
  for a, b in zip(mine, theirs):
    if (a.name, tuple(a.shape), a.dtype) != (b.name, tuple(b.shape), b.dtype):
      problems.append(f"{what}: {a.name} {a.dtype.name}{a.shape.as_list()}, the "
                      f"one-device build's {b.name} {b.dtype.name}{b.shape.as_list()}")
    elif values and not np.array_equal(a.numpy(), b.numpy()):
      problems.append(f"{what}: {a.name}'s initial value differs from the one-device "
                      "build's")
  return problems


def traced_result(problems, compared: str, skipped: str):
  """A `--fake_tpu` check's `(ok, detail, None)`."""
  if problems:
    return False, f"{'; '.join(problems)[:1500]} (skipped: {skipped})", None
  return True, f"{compared}; skipped: {skipped}", None


# Models and data, the same on the TPU replicator and the oracle.


def seeded(seed: int, scale: float):
  """A Sonnet initializer whose values depend on `seed` and the shape only."""
  import sonnet as snt  # pylint: disable=import-outside-toplevel

  class Seeded(snt.initializers.Initializer):

    def __call__(self, shape, dtype):
      rng = np.random.RandomState([seed] + [int(d) for d in shape])
      return tf.constant(rng.normal(size=shape) * scale, dtype)

  return Seeded()


def mlp(seed: int):
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  return snt.nets.MLP([32, CLASSES], w_init=seeded(seed, 0.3),
                      b_init=seeded(seed + 1, 0.1))


def classification_data(rows: int, seed: int):
  rng = np.random.RandomState(seed)
  x = (rng.normal(size=[rows, FEATURES]) * 2 + 1).astype(np.float32)
  y = rng.randint(0, CLASSES, size=[rows]).astype(np.int32)
  return x, y


# tf.data's autotuning thread of an input on the stand-in's distributed iterator
# is not woken when the iterator is deleted: `shutdown` waited up to its
# period, which doubles while the input lives (40 s for these inputs on 2
# replicas, 200 s on 4). Nothing here needs autotuning.
NO_AUTOTUNE = tf.data.Options()
NO_AUTOTUNE.autotune.enabled = False


def input_fn_for(name: str, arrays, global_batch: int):
  """An input_fn of `arrays`' rows in order, `global_batch` rows a step.

  The TPU engine gives consecutive per-replica batches to consecutive
  replicas, so step s's global batch is rows [s * global_batch, (s + 1) *
  global_batch) on every replicator. `name` tells the inputs apart in a
  checkpoint's record.
  """
  def input_fn(ctx):
    assert name  # a constant of the closure: part of the input's name
    ds = tf.data.Dataset.from_tensor_slices(arrays).with_options(NO_AUTOTUNE)
    return ds.batch(ctx.per_replica_batch_size(global_batch), drop_remainder=True)
  return input_fn


def classifier_step(model, optimizer, all_mean):
  """A step_fn: one optimizer step on the mean cross-entropy; the global mean loss."""
  def step_fn(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, model(images)))
    optimizer.apply(tape.gradient(loss, model.trainable_variables),
                    model.trainable_variables)
    return all_mean(loss)
  return step_fn


def train(repl, model, make_optimizer, input_fn, calls):
  """Trains `model` with `calls` runs (their step counts); `(optimizer, the last
  loss of each call)`. Only the optimizer is made in `repl.context()`."""
  with repl.context():
    optimizer = repl.wrap_optimizer(make_optimizer())
  step_fn = classifier_step(model, optimizer, repl.all_mean)
  losses = [float(repl.run(step_fn, input_fn, steps=k)[0]) for k in calls]
  return optimizer, losses


def oracle():
  import replicator  # pylint: disable=import-outside-toplevel
  return replicator.GpuReplicator(device="/cpu:0")


def relative(mine, theirs) -> float:
  """Largest difference over the largest magnitude of `theirs`."""
  mine, theirs = np.asarray(mine, np.float64), np.asarray(theirs, np.float64)
  if mine.shape != theirs.shape:
    raise ValueError(f"shapes differ: {mine.shape} and {theirs.shape}")
  return float(np.max(np.abs(mine - theirs), initial=0.0)
               / max(np.max(np.abs(theirs), initial=0.0), 1e-30))


def variables_error(mine, theirs) -> float:
  mine, theirs = list(mine), list(theirs)
  if len(mine) != len(theirs) or not mine:
    raise ValueError(f"{len(mine)} variables against the oracle's {len(theirs)}")
  return max(relative(a.numpy(), b.numpy()) for a, b in zip(mine, theirs))


def copies_apart(variables):
  """`(largest difference between two replicas' copies, variables compared)`."""
  spread, compared = 0.0, 0
  for variable in variables:
    inner = getattr(variable, "value", None)  # a Keras variable wraps ours
    inner = inner if isinstance(inner, tf.Variable) else variable
    copies = [np.asarray(c.numpy(), np.float64) for c in getattr(inner, "values", ())]
    compared += bool(copies)
    for copy in copies[1:]:
      spread = max(spread, float(np.max(np.abs(copy - copies[0]), initial=0.0)))
  return spread, compared


# The checks.


def _trained_with_oracle(setting, make_optimizer, seed, make_oracle):
  """The same training on the TPU replicator and on `make_oracle()`'s, and the
  model's initial values: `(model, optimizer, losses)`, the oracle's
  `(model, optimizer, losses)`, the initial model and the oracle's replicator
  (shut down)."""
  g = setting.global_batch
  arrays = classification_data(3 * g, seed)
  model = mlp(seed)
  optimizer, losses = train(setting.repl, model, make_optimizer,
                            input_fn_for(f"optimizer_{seed}", arrays, g), calls=[1, 2])
  one = make_oracle()
  reference = mlp(seed)
  reference_optimizer, o_losses = train(one, reference, make_optimizer,
                                        input_fn_for(f"oracle_{seed}", arrays, g),
                                        calls=[1, 2])
  one.shutdown()
  initial = mlp(seed)
  initial(tf.zeros([1, FEATURES]))
  return ((model, optimizer, losses), (reference, reference_optimizer, o_losses),
          initial, one)


def optimizer_check(setting, make_optimizer, seed):
  """Trains on the TPU replicator and on the oracle; `(errors, updates ratio)`."""
  (model, _, losses), (reference, _, o_losses), initial, _ = _trained_with_oracle(
      setting, make_optimizer, seed, oracle)
  moved = np.sqrt(sum(np.sum((a.numpy() - b.numpy()) ** 2) for a, b in zip(
      model.variables, initial.variables)))
  o_moved = np.sqrt(sum(np.sum((a.numpy() - b.numpy()) ** 2) for a, b in zip(
      reference.variables, initial.variables)))
  errors = {"variables": variables_error(model.variables, reference.variables),
            "loss": relative(losses[-1], o_losses[-1])}
  return errors, float(moved / max(o_moved, 1e-30))


def optimizer_trace(setting, make_optimizer, seed):
  """--fake_tpu: the runs of `optimizer_check` traced, against the oracle's
  structure and the model's initial values."""
  (model, optimizer, _), (reference, reference_optimizer, _), initial, one = (
      _trained_with_oracle(setting, make_optimizer, seed, lambda: TracedRuns(oracle())))
  problems = same_outputs(setting.repl.runs, one.runs, setting.num_replicas)
  problems += same_variables("model", model.variables, reference.variables, values=False)
  problems += same_variables("model (initial values)", model.variables,
                             initial.variables)
  problems += same_variables("optimizer", optimizer.variables,
                             reference_optimizer.variables, values=False)
  return traced_result(
      problems, f"outputs as the oracle's; the {len(model.variables)} model variables "
      "made in the first trace as the oracle's, holding the initial values; the "
      f"optimizer's {len(optimizer.variables)} as the oracle's",
      "the trained variables and the loss against the oracle (nothing executed)")


def sonnet_adam(setting):
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  if setting.trace_only:
    return optimizer_trace(setting, lambda: snt.optimizers.Adam(1e-2), seed=10)
  errors, ratio = optimizer_check(setting, lambda: snt.optimizers.Adam(1e-2), seed=10)
  ok, detail, largest = setting.judge(errors)
  return ok, f"{detail}; update / oracle's update {ratio:.4f}", largest


def keras_sgd(setting):
  import keras  # pylint: disable=import-outside-toplevel
  make = lambda: keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
  if setting.trace_only:
    return optimizer_trace(setting, make, seed=20)
  errors, ratio = optimizer_check(setting, make, seed=20)
  ok, detail, largest = setting.judge(errors)
  return ok, (f"{detail}; update / oracle's update {ratio:.4f} (gradients reduced "
              f"twice: about {setting.num_replicas})"), largest


def cross_replica_batch_norm(setting):
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  import replicator  # pylint: disable=import-outside-toplevel
  repl, g, steps = setting.repl, setting.global_batch, 3
  rng = np.random.RandomState(30)
  images = rng.normal(size=[steps * g, 4, 4, 3]) * [1.0, 2.0, 5.0] + [0.0, 1.0, -3.0]
  # Each replica's rows are shifted and scaled by its own amounts, so that its
  # own statistics are not the global batch's.
  owner = (np.arange(steps * g) // PER_REPLICA_BATCH) % setting.num_replicas
  images = (images * (1 + 0.5 * owner[:, None, None, None])
            + 2.0 * owner[:, None, None, None]).astype(np.float32)
  with repl.context():
    norm = replicator.nn.CrossReplicaBatchNorm(create_scale=True, create_offset=True,
                                               decay_rate=0.9)
  step_fn = lambda x: norm(x, is_training=True)
  input_fn = input_fn_for("batch_norm", images, g)
  repl.run(step_fn, input_fn)
  out = repl.run(step_fn, input_fn, steps=steps - 1).numpy()
  if setting.trace_only:
    return batch_norm_trace(setting, norm, images)
  with tf.device("/cpu:0"):
    reference = snt.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)
    for s in range(steps):
      want = reference(tf.constant(images[s * g:(s + 1) * g]), is_training=True).numpy()
  errors = {
      "outputs": relative(out.reshape(want.shape), want),
      "moving mean": relative(norm.moving_mean.value.numpy(),
                              reference.moving_mean.value.numpy()),
      "moving variance": relative(norm.moving_variance.value.numpy(),
                                  reference.moving_variance.value.numpy()),
  }
  return setting.judge(errors)


def batch_norm_trace(setting, norm, images):
  """--fake_tpu: `cross_replica_batch_norm`'s traced runs against the same
  layer on the oracle, in an evaluation step (made, not moved)."""
  import replicator  # pylint: disable=import-outside-toplevel
  one = TracedRuns(oracle())
  with one.context():
    reference = replicator.nn.CrossReplicaBatchNorm(
        create_scale=True, create_offset=True, decay_rate=0.9)
  one.run(lambda x: reference(x, is_training=False),
          input_fn_for("batch_norm_oracle", images, setting.global_batch))
  one.shutdown()
  per_replica = list(images.shape)
  per_replica[0] = PER_REPLICA_BATCH
  want = [{"outputs": [{"path": "", "shape": [1] + per_replica, "dtype": "float32"}]}]
  problems = same_outputs(setting.repl.runs, want * 2, setting.num_replicas)
  problems += same_variables("batch norm", norm.variables, reference.variables)
  return traced_result(
      problems, "each replica's outputs of its batch's shape; the layer's "
      f"{len(norm.variables)} variables (scale, offset, moving statistics) as on one "
      "device, holding their initial values",
      "the outputs and the moving statistics against snt.BatchNorm on the global "
      "batch (nothing executed)")


def collectives(setting):
  repl, n = setting.repl, setting.num_replicas
  rng = np.random.RandomState(40)
  floats = rng.normal(size=[n, 2, 3]).astype(np.float32)
  more = rng.uniform(1, 2, size=[n, 5]).astype(np.float32)
  ints = rng.randint(-50, 50, size=[n, 4]).astype(np.int32)
  flags = rng.uniform(size=[n, 6]) > 0.5
  last = n - 1

  def step_fn():
    r = repl.replica_id
    mine = {"f": tf.gather(floats, r), "i": tf.gather(ints, r)}
    return {
        "replica_id": r,
        "all_sum": repl.all_sum(mine),
        "all_mean": repl.all_mean((tf.gather(floats, r), [tf.gather(more, r)])),
        "all_max": repl.all_max(dict(mine, b=tf.gather(flags, r))),
        "all_min": repl.all_min(dict(mine, b=tf.gather(flags, r))),
        "all_gather": repl.all_gather(mine),
        "broadcast": repl.broadcast(mine, source_replica=last),
    }

  got = repl.run(step_fn)
  want = {
      "replica_id": None,
      "all_sum": {"f": floats.sum(0), "i": ints.sum(0)},
      "all_mean": (floats.mean(0), [more.mean(0)]),
      "all_max": {"f": floats.max(0), "i": ints.max(0), "b": flags.any(0)},
      "all_min": {"f": floats.min(0), "i": ints.min(0), "b": flags.all(0)},
      "all_gather": {"f": floats.reshape(2 * n, 3), "i": ints.reshape(4 * n)},
      "broadcast": {"f": floats[last], "i": ints[last]},
  }
  if setting.trace_only:
    # NumPy's results, as one replica returns them (its sums of int32 are int64).
    one_replica = tf.nest.map_structure(
        lambda a: np.asarray(a, np.int32 if np.asarray(a).dtype == np.int64 else None)[None],
        dict(want, replica_id=np.int32(0)))
    problems = same_outputs(setting.repl.runs, [{"outputs": describe(one_replica)}], n)
    return traced_result(
        problems, "every collective's outputs of NumPy's shapes and dtypes on each "
        "replica", "the values against NumPy (nothing executed)")
  errors, exact = {}, ["replica_id"]
  ids = got["replica_id"].numpy()
  errors["replica_id"] = float(np.max(np.abs(ids - np.arange(n))))
  for name in want:
    if name == "replica_id":
      continue
    got_leaves = tf.nest.flatten(got[name])
    want_leaves = tf.nest.flatten(want[name])
    if len(got_leaves) != len(want_leaves):
      raise ValueError(f"{name}: {len(got_leaves)} leaves, expected {len(want_leaves)}")
    error, integral = 0.0, True
    for leaf, expected in zip(got_leaves, want_leaves):
      stacked = leaf.numpy()
      integral = integral and expected.dtype.kind in "ib"
      for r in range(n):  # every replica has the result
        error = max(error, relative(stacked[r].astype(np.float64),
                                    expected.astype(np.float64)))
    errors[name] = error
    if name in ("all_max", "all_min", "all_gather", "broadcast"):
      exact.append(name)  # a copy of some replica's value: no rounding
  return setting.judge(errors, exact=exact)


def input_exhausted(setting):
  import replicator  # pylint: disable=import-outside-toplevel
  repl, g, k = setting.repl, setting.global_batch, 2
  x = np.random.RandomState(50).normal(size=[k * g, FEATURES]).astype(np.float32)
  with repl.context():
    counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_taken")

  def step_fn(batch):
    counter.assign_add(1)
    return repl.all_sum(tf.reduce_sum(batch))

  if setting.trace_only:
    repl.run(step_fn, input_fn_for("exhausted", x, g), steps=k + 3)
    problems = []
    want = {"path": "", "shape": [setting.num_replicas], "dtype": "float32"}
    if repl.runs[-1]["outputs"] != [want]:
      problems.append(f"outputs {repl.runs[-1]['outputs']}, expected [{want}]")
    if not repl.loop_ops()["OptionalHasValue"]:
      problems.append("the loop does not take its batches as optionals "
                      "(get_next_as_optional), which is how running out ends it")
    if (counter.dtype, counter.shape, int(counter.numpy())) != (tf.int64, (), 0):
      problems.append(f"counter {counter.dtype.name}{counter.shape} = "
                      f"{int(counter.numpy())}, expected int64[] = 0")
    return traced_result(
        problems, f"run(steps={k + 3}) on an input of {k} steps: the loop takes "
        "each batch as an optional (OptionalHasValue), the counter's merged write "
        "traced", "InputExhausted, steps_completed, the counter and the last outputs "
        "(a traced call completes its steps: running out needs execution)")
  try:
    repl.run(step_fn, input_fn_for("exhausted", x, g), steps=k + 3)
  except replicator.InputExhausted as error:
    raised = error
  else:
    return False, f"run(steps={k + 3}) on an input of {k} steps returned", None
  completed = raised.steps_completed
  last = None if raised.outputs is None else raised.outputs.numpy()
  errors = {"steps_completed": float(abs(completed - k)),
            "counter": float(abs(int(counter.numpy()) - k))}
  if last is None:
    return False, f"steps_completed {completed} (expected {k}), outputs None", None
  errors["last outputs"] = max(relative(v, x[(k - 1) * g:].sum(dtype=np.float64))
                               for v in last)
  ok, detail, largest = setting.judge(errors, exact=("steps_completed", "counter"))
  return ok, (f"{detail}; InputExhausted after {completed} of {k + 3} steps, "
              f"counter {int(counter.numpy())}"), largest


def checkpoint_roundtrip(setting):
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  import replicator  # pylint: disable=import-outside-toplevel
  repl, g = setting.repl, setting.global_batch
  x, y = classification_data(3 * g, 60)
  model = mlp(60)
  optimizer, _ = train(repl, model, lambda: snt.optimizers.Adam(1e-2),
                       input_fn_for("checkpoint", (x[:2 * g], y[:2 * g]), g), calls=[2])
  directory = tempfile.mkdtemp(prefix="tpu_check_", dir=setting.workdir)
  try:
    saver = replicator.Checkpointer(directory, model=model, optimizer=optimizer)
    saver.save(2)
    one = oracle()
    restored = mlp(61)  # other initial values: the restore must replace them
    with one.context():
      restored_optimizer = one.wrap_optimizer(snt.optimizers.Adam(1e-2))
    step = replicator.Checkpointer(directory, model=restored,
                                   optimizer=restored_optimizer).restore_latest()
    if step != 2:
      return False, f"restore_latest() returned {step!r}, expected 2", None
    # Made after the restore, on the GpuReplicator: they get the saved values.
    one.run(lambda: restored(tf.zeros([1, FEATURES])))
    errors = {
        "variables": max(float(np.max(np.abs(a.numpy() - b.numpy())))
                         for a, b in zip(restored.variables, model.variables)),
        "adam step": float(abs(int(restored_optimizer.step.numpy())
                               - int(optimizer.step.numpy()))),
    }
    if len(restored.variables) != len(model.variables):
      return False, (f"{len(restored.variables)} variables restored of "
                     f"{len(model.variables)}"), None
    # One more step on each side (Adam's slots restored when first applied).
    following = (x[2 * g:], y[2 * g:])
    repl.run(classifier_step(model, optimizer, repl.all_mean),
             input_fn_for("after_save", following, g))
    one.run(classifier_step(restored, restored_optimizer, one.all_mean),
            input_fn_for("after_restore", following, g))
    if setting.trace_only:
      one.shutdown()
      return checkpoint_trace(setting, directory, model, optimizer, errors)
    errors["next step"] = variables_error(restored.variables, model.variables)
    one.shutdown()
  finally:
    shutil.rmtree(directory, ignore_errors=True)
  return setting.judge(errors, exact=("variables", "adam step"))


def checkpoint_trace(setting, directory, model, optimizer, errors):
  """--fake_tpu: the checkpoint (of initial values: nothing ran) restored into a
  model and optimizer of the TPU replicator, made lazily in a traced step after
  the restore: they keep the saved values, as does the GpuReplicator's."""
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  import replicator  # pylint: disable=import-outside-toplevel
  repl, g = setting.repl, setting.global_batch
  problems = [f"{name} restored on the GpuReplicator differs by {error}"
              for name, error in errors.items() if error]
  restored = mlp(62)  # other initial values: the restore must replace them
  with repl.context():
    restored_optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
  step = replicator.Checkpointer(directory, model=restored,
                                 optimizer=restored_optimizer).restore_latest()
  if step != 2:
    problems.append(f"restore_latest() on the TPU replicator returned {step!r}")
  x, y = classification_data(g, 63)
  repl.run(classifier_step(restored, restored_optimizer, repl.all_mean),
           input_fn_for("restored_on_tpu", (x, y), g))
  problems += same_variables("restored on the TPU replicator", restored.variables,
                             model.variables)
  problems += same_variables("restored optimizer", restored_optimizer.variables,
                             optimizer.variables)
  return traced_result(
      problems, "saved, restored on a GpuReplicator (equal bit for bit, Adam's step "
      "too), and restored on the TPU replicator into a model and Adam made in a "
      f"traced step after the restore: their {len(restored.variables)} and "
      f"{len(restored_optimizer.variables)} variables kept the saved values",
      "the trained values and the step after the restore against the oracle "
      "(nothing executed: the checkpoint holds the initial values)")


def in_sync_steps(repl, g, steps):
  """`replicas_in_sync`'s model, writes and Adam, trained `steps` steps on
  `repl`; every variable, in creation order."""
  import sonnet as snt  # pylint: disable=import-outside-toplevel
  import replicator  # pylint: disable=import-outside-toplevel
  x, y = classification_data(2 * g, 70)
  model = mlp(70)
  with repl.context():
    norm = replicator.nn.CrossReplicaBatchNorm(create_scale=True, create_offset=True)
    ema = tf.Variable(tf.zeros([FEATURES]), trainable=False, name="ema")
    optimizer = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))

  def step_fn(batch):
    images, labels = batch
    ema.assign(0.9 * ema + 0.1 * tf.reduce_max(images, 0))  # each replica its own max
    with tf.GradientTape() as tape:
      logits = model(norm(images, is_training=True))
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    variables = norm.trainable_variables + model.trainable_variables
    optimizer.apply(tape.gradient(loss, variables), variables)
    return loss

  repl.run(step_fn, input_fn_for("in_sync", (x, y), g), steps=steps)
  return (list(model.variables) + list(norm.variables) + [ema]
          + list(optimizer.variables))


def in_sync_trace(setting, variables):
  """--fake_tpu: `replicas_in_sync`'s variables against the same steps on the
  oracle (one step of the global batch)."""
  one = TracedRuns(oracle())
  reference = in_sync_steps(one, setting.global_batch, 1)
  one.shutdown()
  problems = same_outputs(setting.repl.runs, one.runs, setting.num_replicas)
  problems += same_variables("variables", variables, reference, values=False)
  return traced_result(
      problems, f"outputs as the oracle's; the {len(variables)} variables (the "
      "model's, the batch norm's, the written one, Adam's) as the oracle's",
      "assert_replicas_in_sync and the copies' differences (nothing executed; on "
      "the fake TPU every copy sits on the CPU)")


def replicas_in_sync(setting):
  repl, g = setting.repl, setting.global_batch
  variables = in_sync_steps(repl, g, 2)
  if setting.trace_only:
    return in_sync_trace(setting, variables)
  repl.assert_replicas_in_sync(variables)
  spread, compared = copies_apart(variables)
  return (spread == 0.0, f"largest error {spread:.1e} between two replicas' copies "
          f"(exact); assert_replicas_in_sync passed on {len(variables)} variables, "
          f"copies of {compared} compared here", spread)


FUNCTIONS = {"sonnet_adam": sonnet_adam, "keras_sgd": keras_sgd,
             "cross_replica_batch_norm": cross_replica_batch_norm,
             "collectives": collectives, "input_exhausted": input_exhausted,
             "checkpoint_roundtrip": checkpoint_roundtrip,
             "replicas_in_sync": replicas_in_sync}


def replica_count(text: str) -> int:
  try:
    count = int(text)
  except ValueError:
    count = None
  if count is None or count < 1:
    raise argparse.ArgumentTypeError(
        f"expected an int >= 1 (logical CPUs, one replica each), got {text!r}")
  return count


def parse_args(argv=None):
  parser = argparse.ArgumentParser(
      prog="python -m benchmarks.checks.tpu_check",
      description="Checks TpuReplicator on a TPU (or its stand-in) against "
                  "one-device oracles.")
  where = parser.add_mutually_exclusive_group()
  where.add_argument("--tpu", default=None,
                     help="TPU name or address (default: TPU_NAME, COLAB_TPU_ADDR, "
                          "then 'local', a TPU VM)")
  where.add_argument("--stand_in", type=replica_count, default=None, metavar="N",
                     help="no TPU: the same engine on N logical CPUs")
  where.add_argument("--fake_tpu", action="store_true",
                     help="no TPU: trace every check on TensorFlow's TPUStrategy over "
                          "a fake TPU of 8 cores (nothing executes; values unchecked)")
  parser.add_argument("--json", default=None, metavar="FILE",
                      help="write the results to FILE")
  parser.add_argument("--workdir", default=None,
                      help="where checkpoint_roundtrip writes (default: a temporary "
                           "directory; on a TPU Node, give a gs:// path)")
  return parser.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  started = time.time()
  if args.stand_in is not None:
    import replicator  # pylint: disable=import-outside-toplevel
    replicator.testing.configure_logical_cpus(args.stand_in)  # before any op
  # On a TPU: float32 matmuls and convolutions at precision 'highest'.
  if not args.fake_tpu:  # (a fake TPU computes nothing)
    tf.config.experimental.enable_tensor_float_32_execution(False)
  import replicator  # pylint: disable=import-outside-toplevel
  setting, made = None, None
  try:
    if args.stand_in is not None:
      repl = replicator.testing.tpu_engine_on_cpus(args.stand_in)
      device = f"stand-in: {args.stand_in} logical CPUs"
      precision = "float32 (CPU)"
    elif args.fake_tpu:
      repl = replicator.testing.tpu_engine_on_fake_tpu(FAKE_TPU_CORES)
      device = (f"fake TPU: TPUStrategy over {FAKE_TPU_CORES} cores that exist only "
                "as metadata (traced, not run)")
      precision = "n/a (traced, not run)"
    else:
      repl = replicator.TpuReplicator(tpu=args.tpu)
      device = (f"TPU {args.tpu or 'from the environment'}: "
                f"{len(tf.config.list_logical_devices('TPU'))} TPU cores")
      precision = "highest (TensorFloat-32 execution off)"
    setting = Setting(repl, on_tpu=args.stand_in is None and not args.fake_tpu,
                      workdir=args.workdir, trace_only=args.fake_tpu)
    made = repr(repl)
    print(f"tpu_check: {made} on {device}; precision {precision}; tf "
          f"{tf.__version__}", flush=True)
  except Exception as error:  # pylint: disable=broad-except
    traceback.print_exc()
    device, precision = "none", "n/a"
    print(f"tpu_check: could not make the replicator: {type(error).__name__}: "
          f"{str(error)[:600]} (--stand_in N runs the checks without a TPU)",
          flush=True)
  for name in CHECKS:
    run_check(name, FUNCTIONS[name], setting)
  if setting is not None:
    setting.repl.shutdown()
  passed = sum(r["ok"] for r in RESULTS)
  seconds = round(time.time() - started, 1)
  if args.json:
    report = {"command": "python -m benchmarks.checks.tpu_check " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "machine": common.machine(), "device": device, "replicator": made,
              "precision": precision, "tolerance": TOLERANCE,
              "tensorflow": tf.__version__, "passed": passed, "total": len(RESULTS),
              "seconds": seconds, "results": RESULTS}
    if args.fake_tpu:  # "passed" counts the checks that traced
      report.update(traced_only=True, tolerance=None)
    with open(args.json, "w") as f:
      json.dump(report, f, indent=1)
  verb = "traced" if args.fake_tpu else "passed"
  print(f"{passed}/{len(RESULTS)} checks {verb} ({seconds} s)", flush=True)
  return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
  sys.exit(main())
