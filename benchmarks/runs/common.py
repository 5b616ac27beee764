"""What every benchmark shares: timing, the machine's name, writing results, workers."""

import io
import json
import os
import platform
import shlex
import sys
import time


def machine() -> str:
  """Host name, cores and CPU (one host name has stood for several CPUs here)."""
  try:
    with open("/proc/cpuinfo") as f:
      first_cpu = f.read().split("\n\n")[0]
  except OSError:
    first_cpu = ""
  fields = {k.strip(): v.strip() for k, v in
            (line.split(":", 1) for line in first_cpu.splitlines() if ":" in line)}
  cpu = platform.machine()
  if "model name" in fields:
    cpu = (f"{fields['model name']} family {fields.get('cpu family', '?')} "
           f"model {fields.get('model', '?')}")
  if "flags" in fields:
    cpu += ", AVX-512" if "avx512f" in fields["flags"].split() else ", no AVX-512"
  return f"{platform.node()} ({os.cpu_count()} cores, {cpu})"


def seconds_per_call(fn, calls: int, warmup: int = 1) -> float:
  """Mean seconds of `calls` calls of `fn`, after `warmup` untimed ones.

  The last output is fetched to the host before the clock stops.
  """
  for _ in range(warmup):
    fn()
  start = time.perf_counter()
  for _ in range(calls):
    out = fn()
  getattr(out, "numpy", lambda: out)()
  return (time.perf_counter() - start) / calls


def median_seconds_alternating(calls: dict, iters: int, warmup: int) -> dict:
  """Median seconds of each of `calls` (name -> function), called in turn.

  Each name's calls alternate with the others', so all share the machine's
  luck of the moment. Every call is fetched to the host before the clock
  stops. The order rotates from one pass to the next, so no variant always
  follows the same one; in a job of several workers every worker makes the
  same calls in the same order, as collectives require.
  """
  names = list(calls)
  fetch = lambda out: getattr(out, "numpy", lambda: out)()
  for name in names:
    for _ in range(warmup):
      fetch(calls[name]())
  times = {name: [] for name in names}
  for i in range(iters):
    for name in names[i % len(names):] + names[:i % len(names)]:
      start = time.perf_counter()
      fetch(calls[name]())
      times[name].append(time.perf_counter() - start)
  return {name: sorted(t)[len(t) // 2] for name, t in times.items()}


def command_line() -> str:
  """The command that runs this benchmark as it was run, less `--json PATH`."""
  module = os.path.splitext(os.path.basename(sys.argv[0]))[0]
  args, skip = [], False
  for arg in sys.argv[1:]:
    if skip or arg == "--json":
      skip = not skip
      continue
    if not arg.startswith("--json="):
      args.append(shlex.quote(arg))
  command = " ".join([f"python -m {__package__}.{module}"] + args)
  if os.environ.get("BENCH_GRPC"):  # an experiment's setting (`_tune_grpc`)
    command = f"BENCH_GRPC={shlex.quote(os.environ['BENCH_GRPC'])} {command}"
  return command


def write_result(result: dict, json_path=None, quiet: bool = False) -> None:
  """Prints `result` as JSON (unless `quiet`), and writes it to `json_path` when given.

  The result records the command that made it (`command_line`), unless it names one.
  """
  result.setdefault("command", command_line())
  if not quiet:
    print(json.dumps(result, indent=2))
  if json_path:
    with open(json_path, "w") as f:
      json.dump(result, f, indent=2)


def ratio_by_workers(best: dict, rounds: list, counts, top: str, bottom: str):
  """`top`'s figure over `bottom`'s at each worker count: (best of rounds, each round).

  `best` and each of `rounds` map "NAME, W workers" to a figure; each is a
  dict keyed "W workers".
  """
  ratio = lambda figures, w: figures[f"{top}, {w} workers"] / figures[f"{bottom}, {w} workers"]
  return ({f"{w} workers": ratio(best, w) for w in counts},
          {f"{w} workers": [ratio(r, w) for r in rounds] for w in counts})


def mwms_over_ours(best: dict, rounds: list, counts) -> dict:
  """MWMS's time over ours at each worker count: best of rounds, and each round.

  `best` and each of `rounds` map "ours, W workers" / "MWMS, W workers" to a
  time (lower is better), so a ratio over 1 means ours is faster.
  """
  best_ratio, each = ratio_by_workers(best, rounds, counts, "MWMS", "ours")
  return {"MWMS / ours (best of rounds)": best_ratio, "MWMS / ours (each round)": each}


def start_worker(threads: int) -> int:
  """In a worker `run_job` started: quiet logs, `threads` intra-op threads.

  Returns the job's number of workers (from TF_CONFIG, set by the launcher).
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(threads)
  _tune_grpc(os.environ.get("BENCH_GRPC", ""))
  return len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])


def _tune_grpc(spec: str) -> None:
  """An experiment: `BENCH_GRPC="channels=4,chunk=-1"` sets the worker server's
  `rpc_options.num_channels_per_target` and `experimental.recv_buf_max_chunk`
  (as DTensor's multi-client setup does; TensorFlow's defaults are 1 and 4 KB).

  Whoever starts the server (MWMS here) gets them, so both sides of a job share
  them: compare a job with them against one without. Neither library sets them.
  """
  if not spec:
    return
  settings = dict(item.split("=") for item in spec.split(","))
  unknown = set(settings) - {"channels", "chunk"}
  if unknown:
    raise ValueError(f"BENCH_GRPC: unknown {sorted(unknown)}; e.g. 'channels=4,chunk=-1'.")
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  enable = context.Context.enable_collective_ops

  def enable_tuned(self, server_def):
    config = server_def.default_session_config
    if "channels" in settings:
      config.rpc_options.num_channels_per_target = int(settings["channels"])
    if "chunk" in settings:
      config.experimental.recv_buf_max_chunk = int(settings["chunk"])
    return enable(self, server_def)
  context.Context.enable_collective_ops = enable_tuned


def server_grpc_settings() -> dict:
  """The gRPC settings of this worker's running server (what `_tune_grpc` set)."""
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  server_def = context.context()._collective_ops_server_def  # pylint: disable=protected-access
  config = server_def.default_session_config
  return {"num_channels_per_target": config.rpc_options.num_channels_per_target,
          "recv_buf_max_chunk": config.experimental.recv_buf_max_chunk}


def mwms_and_replicator(pack_bytes=None):
  """In a worker: MWMS (RING), which starts the worker's server, and a replicator.

  The replicator joins MWMS's server, so both run side by side in the same
  processes. Call before TensorFlow runs anything. Both use CPU:0;
  `pack_bytes`, if given, sets both sides' bucket size.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import replicator  # pylint: disable=g-import-not-at-top
  options = {"implementation": tf.distribute.experimental.CommunicationImplementation.RING}
  if pack_bytes is not None:
    options["bytes_per_pack"] = pack_bytes
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=tf.distribute.experimental.CommunicationOptions(**options))
  all_reduce = (replicator.AllReduceOptions(pack_bytes=pack_bytes)
                if pack_bytes is not None else None)
  return strategy, replicator.MultiGpuReplicator(devices=["CPU:0"], all_reduce=all_reduce)


def run_job(module: str, worker_args, workers: int) -> dict:
  """Runs `python -m module WORKER_ARGS --threads T` as `workers` local workers.

  Each worker gets cores / workers intra-op threads. Returns the dict worker 0
  printed after "RESULT ".
  """
  from replicator import launch  # pylint: disable=g-import-not-at-top
  threads = max(1, (os.cpu_count() or 1) // workers)
  out = io.StringIO()
  code = launch.launch([sys.executable, "-m", module, *worker_args,
                        "--threads", str(threads)], workers, out=out)
  for line in out.getvalue().splitlines():
    if line.startswith("[worker 0] RESULT "):
      return json.loads(line[len("[worker 0] RESULT "):])
  raise RuntimeError(f"{module} {worker_args} on {workers} workers failed "
                     f"({code}):\n" + out.getvalue()[-3000:])
