"""What every benchmark shares: timing, the machine's name, writing results, workers."""

import io
import json
import os
import platform
import sys
import time


def machine() -> str:
  """Host name, cores and CPU model: the same host name has been different CPUs."""
  model, wide = platform.processor() or platform.machine(), ""
  try:
    with open("/proc/cpuinfo") as f:
      info = f.read()
    names = [l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")]
    fields = {l.split(":", 1)[0].strip(): l.split(":", 1)[1].strip()
              for l in info.splitlines()[:30] if ":" in l}
    model = names[0] if names else model
    if "cpu family" in fields:
      model += f" family {fields['cpu family']} model {fields.get('model', '?')}"
    wide = ", AVX-512" if " avx512f " in f" {fields.get('flags', '')} " else ", no AVX-512"
  except OSError:
    pass
  return f"{platform.node()} ({os.cpu_count()} cores, {model}{wide})"


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


def median_seconds_per_call(fn, calls: int, warmup: int = 1) -> float:
  """Median seconds of `calls` calls of `fn`, each fetched to the host.

  For calls long enough (milliseconds) that fetching each result costs
  little: the median keeps one call that the shared machine stalled from
  moving the figure, where a mean over the calls would not.
  """
  for _ in range(warmup):
    getattr(fn(), "numpy", lambda: None)()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    out = fn()
    getattr(out, "numpy", lambda: out)()
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def write_result(result: dict, json_path=None) -> None:
  """Prints `result` as JSON, and writes it to `json_path` when one is given."""
  print(json.dumps(result, indent=2))
  if json_path:
    with open(json_path, "w") as f:
      json.dump(result, f, indent=2)


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
