"""On the device machine: the library's GPU paths against one-device oracles.

    . /root/tfgpu.env && python3 -m benchmarks.checks.gpu_check [--json FILE]

The suite runs on logical CPUs, where a merge between replicas is an `add_n`; on
several GPUs it is NCCL (`nccl_ops.all_sum`) and float moving averages are merged
once at the step's end (deferred merges). Neither runs anywhere but here. The GPU is
split into two logical GPUs, TF32 is off (so that float32 sums compare to 1e-5), and
each check prints PASS or FAIL with its largest error; a check that raises prints
FAIL with the error, and the others still run. `--cpu` runs the same checks on two
logical CPUs, to try the script without a GPU.

Checks:
  one_gpu: GpuReplicator on the first GPU, Sonnet Adam, 4 steps (2 calls of 1 step,
    then one of `steps=2`) against a plain tf.function on the same device.
  two_gpus_{snt,keras}: MultiGpuReplicator on two logical GPUs, a model with
    CrossReplicaBatchNorm and a float variable each replica writes from its own half
    of the batch, 3 steps (one call of 1 step, one of `steps=2`), against one device
    on the whole batch; and the two replicas' copies of every variable against each
    other.
  compressed_sum_{BF16,FP16,"BF16, float32 sum"}: an all_sum compressed on two GPUs
    against NumPy, within the dtype's rounding and not equal to the float32 sum.
  two_gpus_snt, merges deferred: the same with merges as between physical GPUs.
  mirrored: MirroredStrategy's default all-reduce on the same two logical GPUs
    (reference: whether NCCL runs on logical GPUs of one physical GPU at all).
"""

import argparse
import contextlib
import json
import time
import traceback

import numpy as np
import tensorflow as tf

from benchmarks.runs import common

RESULTS = []


def check(name):
  def wrap(fn):
    def run(*args):
      start = time.time()
      try:
        ok, detail = fn(*args)
      except Exception as error:  # pylint: disable=broad-except
        ok, detail = False, f"{type(error).__name__}: {str(error)[:600]}"
        traceback.print_exc()
      label = f"{name}_{args[1]}" if len(args) > 1 else name
      RESULTS.append({"check": label, "ok": bool(ok), "detail": detail,
                      "seconds": round(time.time() - start, 1)})
      print(f"{'PASS' if ok else 'FAIL'} {label}: {detail}", flush=True)
    return run
  return wrap


def batches(global_batch, steps, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.normal(size=[steps, global_batch, 12]).astype(np.float32) * 2 + 1
  y = rng.randint(0, 5, size=[steps, global_batch]).astype(np.int32)
  return x, y


def mlp(seed):
  """A function that builds one MLP (12 -> 32 -> 5) with the same initial values
  each time, drawn from `seed`: the replicated model and its oracle."""
  import sonnet as snt
  rng = np.random.RandomState(seed)
  inits = [rng.normal(size=shape).astype(np.float32) * 0.3 for shape in ([12, 32], [32, 5])]
  return lambda: snt.Sequential([
      snt.Linear(32, w_init=tf.constant_initializer(inits[0])), tf.nn.relu,
      snt.Linear(5, w_init=tf.constant_initializer(inits[1]))])


def max_error(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@check("one_gpu")
def one_gpu(device):
  import sonnet as snt
  import replicator
  x, y = batches(16, 4)
  build = mlp(5)
  repl = replicator.GpuReplicator(device=device)
  with repl.context():
    model = build()
    opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-2))
  def input_fn(ctx):
    return tf.data.Dataset.from_tensor_slices((x, y))
  def step_fn(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels, model(images)))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss
  losses = [float(repl.run(step_fn, input_fn)[0]) for _ in range(2)]
  losses.append(float(repl.run(step_fn, input_fn, steps=2)[0]))
  placed = {v.device for v in model.trainable_variables}

  with tf.device(device):
    oracle = build()
    oracle_opt = snt.optimizers.Adam(1e-2)
    @tf.function
    def plain(images, labels):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels, oracle(images)))
      oracle_opt.apply(tape.gradient(loss, oracle.trainable_variables),
                       oracle.trainable_variables)
      return loss
    oracle_losses = [float(plain(x[i], y[i])) for i in range(4)]
  error = max(max_error(a, b) for a, b in zip(model.trainable_variables,
                                                oracle.trainable_variables))
  loss_error = max_error(losses, [oracle_losses[0], oracle_losses[1], oracle_losses[3]])
  repl.shutdown()
  return (error < 1e-5 and loss_error < 1e-5,
          f"params {error:.1e}, losses {loss_error:.1e}, variables on {sorted(placed)}")


@check("two_gpus")
def two_gpus_check(devices, optimizer_kind):
  import sonnet as snt
  import keras
  import replicator
  steps, global_batch = 3, 16
  x, y = batches(global_batch, steps, seed=1)
  build = mlp(7)

  def optimizer():
    if optimizer_kind.startswith("snt"):
      return snt.optimizers.Momentum(0.05, 0.9)
    return keras.optimizers.Adam(1e-2)

  def make_step(norm_layer, trunk, ema, opt, all_mean):
    def step_fn(images, labels):
      ema.assign(0.9 * ema + 0.1 * tf.reduce_max(images, 0))
      with tf.GradientTape() as tape:
        logits = trunk(norm_layer(images, is_training=True))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
      variables = norm_layer.trainable_variables + trunk.trainable_variables
      grads = tape.gradient(loss, variables)
      if optimizer_kind.startswith("snt"):
        opt.apply(grads, variables)
      else:
        opt.apply_gradients(zip(grads, variables))
      return all_mean(loss)
    return step_fn

  repl = replicator.MultiGpuReplicator(devices=devices)
  with repl.context():
    trunk = build()
    norm = replicator.nn.CrossReplicaBatchNorm(create_scale=True, create_offset=True,
                                               decay_rate=0.9)
    ema = tf.Variable(tf.zeros([12]), trainable=False, name="ema")
    opt = repl.wrap_optimizer(optimizer())
  step = make_step(norm, trunk, ema, opt, repl.all_mean)

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).unbatch()
    return ds.batch(ctx.per_replica_batch_size(global_batch), drop_remainder=True)

  step_fn = lambda batch: step(*batch)  # one object, so that every call reuses its trace
  # One step, then the rest in one call (the on-device loop): the last step's loss.
  losses = [float(repl.run(step_fn, input_fn)[0]),
            float(repl.run(step_fn, input_fn, steps=steps - 1)[0])]

  with tf.device(devices[0]):
    o_trunk = build()
    o_norm = snt.BatchNorm(create_scale=True, create_offset=True, decay_rate=0.9)
    o_ema = tf.Variable(tf.zeros([12]))
    o_opt = optimizer()
    half = global_batch // 2
    o_step = tf.function(make_step(o_norm, o_trunk, tf.Variable(tf.zeros([12])), o_opt,
                                   lambda v: v))
    o_losses, o_ema_value = [], np.zeros([12], np.float32)
    for i in range(steps):
      o_losses.append(float(o_step(x[i], y[i])))
      o_ema_value = np.mean([0.9 * o_ema_value + 0.1 * x[i][r * half:(r + 1) * half].max(0)
                             for r in range(2)], 0)
    o_ema.assign(o_ema_value)
  mine = norm.trainable_variables + trunk.trainable_variables
  theirs = o_norm.trainable_variables + o_trunk.trainable_variables
  errors = {
      "params": max(max_error(a, b) for a, b in zip(mine, theirs)),
      "losses": max_error(losses, [o_losses[0], o_losses[-1]]),
      "moving mean/var": max(max_error(norm.moving_mean.value, o_norm.moving_mean.value),
                             max_error(norm.moving_variance.value,
                                       o_norm.moving_variance.value)),
      "ema": max_error(ema, o_ema),
  }
  spread, compared = 0.0, 0
  for variable in list(norm.variables) + list(trunk.variables) + [ema]:
    copies = getattr(variable, "replicas", None)
    if copies:
      spread = max(spread, max(max_error(c, copies[0]) for c in copies))
      compared += 1
  errors["replicas apart"] = spread
  deferred = getattr(ema, "_merge_at_write", None)
  repl.shutdown()
  ok = all(e < 2e-5 for e in errors.values()) and spread == 0.0
  detail = ", ".join(f"{k} {v:.1e}" for k, v in errors.items())
  ok = ok and compared == len(norm.variables) + len(trunk.variables) + 1
  return ok, (f"{detail} ({compared} variables' copies compared); ema merged at "
              f"write: {deferred}")


# Compression -> (options, the largest relative error of the sum: every value rounded
# once to the narrow dtype, and each partial sum too unless summed in float32).
COMPRESSIONS = {
    "BF16": (dict(compression="BF16"), 2.0 ** -8 * 2),
    "FP16": (dict(compression="FP16"), 2.0 ** -11 * 2),
    "BF16, float32 sum": (dict(compression="BF16", sum_in_float32=True), 2.0 ** -8),
}


@check("compressed_sum")
def compressed_sum(devices, kind):
  import replicator
  repl = replicator.MultiGpuReplicator(devices=devices)
  rng = np.random.RandomState(3)
  values = rng.uniform(1, 2, size=[2, 1000]).astype(np.float32)
  settings, relative = COMPRESSIONS[kind]
  options = replicator.AllReduceOptions(
      compression=replicator.Compression[settings["compression"]],
      sum_in_float32=settings.get("sum_in_float32", False))
  def step_fn():
    mine = tf.gather(tf.constant(values), repl.replica_id)
    return repl.all_reduce(mine, replicator.ReduceOp.SUM, options=options)
  out = repl.run(step_fn).numpy()
  exact = values.sum(0)
  error = max_error(out[0], exact)
  bound = float(np.max(np.abs(exact))) * relative
  same = max_error(out[0], out[1])
  repl.shutdown()
  return (error <= bound and error > 0 and same == 0.0,
          f"error {error:.2e} (bound {bound:.2e}), replicas apart {same:.1e}")


@check("mirrored")
def mirrored(devices):
  strategy = tf.distribute.MirroredStrategy(devices)
  with strategy.scope():
    tf.Variable(1.0)  # a variable in the strategy's scope, as a model would make
  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      return ctx.all_reduce("sum", tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0)
    return strategy.run(replica_fn)
  out = strategy.experimental_local_results(step())
  values = [float(o) for o in out]
  return values == [3.0, 3.0], (f"{values} with "
                                f"{type(strategy.extended._cross_device_ops).__name__}")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--cpu", action="store_true", help="two logical CPUs instead")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  tf.config.experimental.enable_tensor_float_32_execution(False)
  if args.cpu:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    devices = ["/device:CPU:0", "/device:CPU:1"]
  else:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
      raise SystemExit("gpu_check: no GPU (use --cpu to try the script without one)")
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=8192)] * 2)
    devices = ["/device:GPU:0", "/device:GPU:1"]
  print("tf", tf.__version__, "devices", tf.config.list_logical_devices(), flush=True)
  import replicator  # pylint: disable=g-import-not-at-top
  # On logical CPUs merge as between physical GPUs throughout (at the step's end);
  # logical GPUs of one GPU merge by add_n, as logical CPUs do, but for one check.
  with (replicator.testing.merges_as_collectives() if args.cpu
        else contextlib.nullcontext()):
    one_gpu(devices[0])
    two_gpus_check(devices, "snt")
    two_gpus_check(devices, "keras")
    with replicator.testing.merges_as_collectives():
      two_gpus_check(devices, "snt, merges deferred")
    for kind in COMPRESSIONS:
      compressed_sum(devices, kind)
    mirrored(devices)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"command": "python3 -m benchmarks.checks.gpu_check"
                            + (" --cpu" if args.cpu else ""),
                 "machine": common.machine() + ("" if args.cpu else
                                                ", its GPU split into 2 logical GPUs of 8 GiB"),
                 "results": RESULTS}, f, indent=1)
  failed = [r["check"] for r in RESULTS if not r["ok"]]
  print("failed:", failed or "none", flush=True)
  if failed:
    raise SystemExit(1)


if __name__ == "__main__":
  main()
