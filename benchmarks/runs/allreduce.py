"""All-reduce of a ResNet-50-like gradient set across local worker processes.

Ours (packed float32, bfloat16 on the wire, bfloat16 with a float32 sum) against
`MultiWorkerMirroredStrategy` (RING; `bytes_per_pack=0`, its default, puts every
tensor in one pack; 32MB packs of at least 32 MB). Each round is one job of
worker processes on 127.0.0.1, started through `replicator.launch`, in which
MWMS starts each worker's server, the replicator joins it, and every variant
is called in turn (the order rotating from pass to pass): all variants share
the job's luck, where on this shared machine one job can run 20-40% slower
than the next. The gradient set has ResNet-50's 161 tensors with their sizes
scaled by `--scale` (0.25: 6.4 M floats, 25.6 MB in float32; 1.0 is the real
102 MB). Two more variants reduce one tensor that already holds every value,
in float32 and in bfloat16: the transfer alone, with no packing or casting,
which bounds what packing and compression can reach.

  python -m benchmarks.runs.allreduce [--workers 2,4] [--rounds 3] [--op sum|mean]
      [--json out.json]

`--op mean` averages, as a training step's gradients are averaged, on both
sides (MWMS divides the sum after its collective; ours lets the ring divide
where each worker has one replica).

Prints ms per all-reduce (worker 0's median call; best of the rounds) and the
ratios to MWMS, best of rounds and the range of the ratios taken round by
round (each round's ratios compare calls of one job). Each worker gets cores/W intra-op threads.
"""

import argparse
import functools
import json
import re

from benchmarks.runs import common

VARIANTS = ("ours fp32, 16MB buckets, 2 in flight", "ours bf16, 16MB buckets, 2 in flight",
            "ours bf16, float32 sum",
            "MWMS RING, bytes_per_pack=0", "MWMS RING, bytes_per_pack=32MB",
            "transfer alone: one fp32 tensor", "transfer alone: one bf16 tensor")
# Ours is named "ours DTYPE, NMB buckets[, K in flight]" (pack_bytes N MiB,
# buckets_in_flight K; any N and K are taken): the first two above are the
# library's default `AllReduceOptions` (sections.py marks them, and a test keeps
# them so). "ours bf16, float32 sum" runs the default bucket options.
# Older names, kept so that earlier commands still run: "ours fp32 packed" and
# "ours bf16" are one 32 MB bucket at a time, the library's earlier default.
MORE_VARIANTS = ("ours fp32 packed", "ours bf16", "ours fp32, 8MB buckets, 4 in flight",
                 "ours bf16, 8MB buckets, 4 in flight", "ours bf16, 32MB buckets, 1 in flight")
TUNED = re.compile(r"ours (fp32|bf16), (\d+)MB buckets(?:, (\d+) in flight)?$")


def resnet50_sizes():
  """Element counts of ResNet-50 v1.5's 161 trainable tensors (25.56 M)."""
  sizes = [7 * 7 * 3 * 64, 64, 64]
  channels = 64
  for blocks, mid, out in ((3, 64, 256), (4, 128, 512), (6, 256, 1024), (3, 512, 2048)):
    for block in range(blocks):
      if block == 0:
        sizes += [channels * out, out, out]
      sizes += [channels * mid, mid, mid, 9 * mid * mid, mid, mid, mid * out, out, out]
      channels = out
  return sizes + [2048 * 1000, 1000]


def _gradients(scale):
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(0)
  return [rng.randn(max(1, int(n * scale))).astype(np.float32)
          for n in resnet50_sizes()]


def worker(variants, scale: float, iters: int, threads: int, op: str = "sum"):
  """One worker of the job (TF_CONFIG set by the launcher): every variant.

  MWMS starts the worker's server and the replicator joins it, so both run
  in the same processes, their calls alternating: they share the job's luck
  (on a shared machine one job can run 20-40% slower than the next).
  """
  num_workers = common.start_worker(threads)
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import replicator  # pylint: disable=g-import-not-at-top
  grads = _gradients(scale)
  ring = tf.distribute.experimental.CommunicationImplementation.RING
  strategy, repl = common.mwms_and_replicator()
  with strategy.scope():
    mwms_variables = [tf.Variable(g) for g in grads]
  with repl.context():
    variables = [tf.Variable(g) for g in grads]
  starts = np.cumsum([0] + [g.size for g in grads[:-1]])
  mwms_op = tf.distribute.ReduceOp.SUM if op == "sum" else tf.distribute.ReduceOp.MEAN
  ours_op = replicator.ReduceOp.SUM if op == "sum" else replicator.ReduceOp.MEAN

  def mwms_call(packing):
    options = tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=packing, implementation=ring)

    def replica_fn():
      reduced = tf.distribute.get_replica_context().all_reduce(
          mwms_op, [v.read_value() for v in mwms_variables],
          options=options)
      return tf.add_n([r[0] for r in reduced])

    step = tf.function(lambda: strategy.run(replica_fn))
    return lambda: strategy.experimental_local_results(step())[0]

  def ours_call(compression, sum_in_float32=False, pack_mb=None, in_flight=None):
    """Ours with `AllReduceOptions`' defaults where `pack_mb` / `in_flight` are None."""
    buckets = {}
    if pack_mb is not None:
      buckets["pack_bytes"] = pack_mb * 2**20
    if in_flight is not None:
      buckets["buckets_in_flight"] = in_flight
    options = replicator.AllReduceOptions(
        compression=compression, sum_in_float32=sum_in_float32, **buckets)

    def step_fn():
      reduced = repl.all_reduce([v.read_value() for v in variables], ours_op,
                                options=options)
      return tf.add_n([r[0] for r in reduced])
    return lambda: repl.run(step_fn)[0]

  def transfer_call(dtype):
    with repl.context():  # made only for the transfer variants asked for
      flat = tf.Variable(tf.cast(np.concatenate(grads), dtype))

    def step_fn():
      total = repl.all_reduce(flat.read_value(), ours_op)
      return tf.reduce_sum(tf.cast(tf.gather(total, starts), tf.float32))
    return lambda: repl.run(step_fn)[0]

  makers = {
      "ours fp32 packed": lambda: ours_call(replicator.Compression.NONE, False, 32, 1),
      "ours bf16": lambda: ours_call(replicator.Compression.BF16, False, 32, 1),
      "ours bf16, float32 sum": lambda: ours_call(replicator.Compression.BF16, True),
      "MWMS RING, bytes_per_pack=0": lambda: mwms_call(0),
      "MWMS RING, bytes_per_pack=32MB": lambda: mwms_call(32 * 2**20),
      "transfer alone: one fp32 tensor": lambda: transfer_call(tf.float32),
      "transfer alone: one bf16 tensor": lambda: transfer_call(tf.bfloat16)}
  for name in variants:
    tuned = TUNED.match(name)
    if tuned:
      dtype, pack_mb, in_flight = tuned.groups()
      makers[name] = functools.partial(
          ours_call, replicator.Compression.BF16 if dtype == "bf16"
          else replicator.Compression.NONE, pack_mb=int(pack_mb),
          in_flight=int(in_flight or 1))
  calls = {name: makers[name]() for name in variants}
  # Untimed: the traces, the first rendezvous, and calls that still set up
  # connections and buffers (in some jobs the first 3 to 5 ran 1.5x to 4x
  # slower than the rest).
  ms = {name: 1e3 * t for name, t in
        common.median_seconds_alternating(calls, iters, warmup=5).items()}
  # Every worker started from worker 0's values (ours syncs them; MWMS too).
  expected = (num_workers if op == "sum" else 1) * sum(float(g[0]) for g in grads)
  errors = {name: abs(float(call()) - expected) / sum(abs(float(g[0])) for g in grads)
            for name, call in calls.items()}
  print("RESULT " + json.dumps({"ms": ms, "relative_error": errors,
                                "grpc": common.server_grpc_settings()}), flush=True)
  repl.shutdown()


def _ratios(best, rounds, counts, variants):
  """MWMS's time / ours, best of rounds and round by round.

  Two baselines: MWMS with 32 MB packs (the fp32 target) and the faster of the
  two MWMS variants in each round (the compression target).
  """
  def mwms(timings, workers, which):
    found = [timings.get(f"MWMS RING, bytes_per_pack={p}, {workers} workers")
             for p in which]
    found = [x for x in found if x]
    return min(found) if found else None

  bases = {"MWMS packed": ("32MB",), "best MWMS fp32": ("32MB", "0")}
  ratios, per_round = {}, {}
  for workers in counts:
    for variant in (v for v in variants if not v.startswith("MWMS")):
      mine = f"{variant}, {workers} workers"
      for base, which in bases.items():
        base_ms = mwms(best, workers, which)
        if base_ms is None:
          continue
        name = f"{workers} workers: {base} / {variant}"
        ratios[name] = base_ms / best[mine]
        per_round[name] = [mwms(r, workers, which) / r[mine] for r in rounds]
  return ratios, per_round


def _run_job(variants, workers, scale, iters, op):
  return common.run_job("benchmarks.runs.allreduce", ["--worker", ";".join(variants),
                                                 "--scale", str(scale),
                                                 "--iters", str(iters), "--op", op],
                        workers)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--workers", default="2,4")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--iters", type=int, default=20)
  parser.add_argument("--scale", type=float, default=0.25)
  parser.add_argument("--variants", default=";".join(VARIANTS),
                      help="';'-separated names from VARIANTS and MORE_VARIANTS")
  parser.add_argument("--op", choices=("sum", "mean"), default="sum")
  parser.add_argument("--json", default=None)
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args.worker.split(";"), args.scale, args.iters, args.threads, args.op)
    return
  sizes = resnet50_sizes()
  floats = sum(max(1, int(n * args.scale)) for n in sizes)
  variants = args.variants.split(";")
  unknown = [v for v in variants
             if v not in VARIANTS + MORE_VARIANTS and not TUNED.match(v)]
  if unknown:
    raise SystemExit(f"--variants: unknown {unknown}; choose from "
                     f"{list(VARIANTS + MORE_VARIANTS)}")
  counts = [int(w) for w in args.workers.split(",")]
  rounds = []  # one {"variant, W workers": ms} per round
  errors, grpc = {}, {}

  def summary():
    best = {key: min(r[key] for r in rounds) for key in rounds[0]}
    ratios, per_round = _ratios(best, rounds, counts, variants)
    return {"machine": common.machine(),
            "op": args.op, "tensors": len(sizes), "floats": floats, "megabytes_fp32": 4 * floats / 1e6,
            "ms_per_all_reduce (best of rounds)": best,
            "ms_per_all_reduce (each round)": rounds,
            "relative_error_of_checksum": errors,
            # worker 0's server; 0 and 0 are TensorFlow's defaults (1 channel, 4 KB)
            "grpc settings": grpc,
            "ratios (best of rounds)": ratios, "ratios (each round)": per_round}

  for _ in range(args.rounds):
    rounds.append({})
    for workers in counts:
      result = _run_job(variants, workers, args.scale, args.iters, args.op)
      grpc = result["grpc"]
      for variant in variants:
        key = f"{variant}, {workers} workers"
        rounds[-1][key] = result["ms"][variant]
        errors[key] = result["relative_error"][variant]
        print(f"{key}: {rounds[-1][key]:.1f} ms", flush=True)
    # Written after every round, in case the device machine's time runs out.
    common.write_result(summary(), args.json, quiet=len(rounds) < args.rounds)


if __name__ == "__main__":
  main()
