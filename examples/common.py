"""What the examples share: the replicator flags, the start line and progress logs.

Every example (`examples.quickstart`, `examples.gan.train` and its sweep,
`examples.resnet.train`) defines these flags with the same names, meanings and
defaults, through `define_replicator_flags` and `define_run_flags`:

  --replicator      gpu | multi_gpu | tpu | tpu_emulated (default multi_gpu)
  --cpu_replicas    replicas on a machine with no GPU, or emulated TPU cores
                    (default 2)
  --tpu             TPU name or address, for --replicator=tpu
  --global_batch_size  examples per step, summed over every replica
  --workdir         checkpoints, summaries and results of the run
  --log_every       steps between progress lines

`make_replicator` builds the replicator the flags name and logs, once, which
one it made: its devices, replicas and workers. `Progress` logs `step n/N`,
the rate over the last interval and an ETA; only the chief logs.
"""

import os
import time
from typing import Callable, Optional

from absl import flags
from absl import logging

import replicator
from replicator import launch

FLAGS = flags.FLAGS

REPLICATORS = ("gpu", "multi_gpu", "tpu", "tpu_emulated")


def define_replicator_flags():
  """--replicator, --cpu_replicas and --tpu."""
  flags.DEFINE_enum(
      "replicator", "multi_gpu", REPLICATORS,
      "gpu: one device; multi_gpu: every local GPU (with none, --cpu_replicas "
      "logical CPU devices), on every worker `replicator.launch` starts; tpu: a "
      "Cloud or Colab TPU; tpu_emulated: the TPU's engine on --cpu_replicas "
      "logical CPU devices, each step compiled with XLA before its first run.")
  flags.DEFINE_integer(
      "cpu_replicas", 2,
      "Replicas on a machine with no GPU (multi_gpu; ignored where a GPU is "
      "visible), or the emulated TPU cores of tpu_emulated (1, 2, 4 or 8, GPU "
      "or not): the CPU is split into this many logical devices.")
  flags.DEFINE_string("tpu", None, "--replicator=tpu: TPU name or address "
                      "(default: TPU_NAME, COLAB_TPU_ADDR, else the local TPU).")


def define_run_flags(*, global_batch_size: Optional[int], workdir: Optional[str],
                     log_every: int = 100, global_batch_help: str = ""):
  """--global_batch_size, --workdir and --log_every, with each example's default."""
  flags.DEFINE_integer("global_batch_size", global_batch_size,
                       "Examples per step, summed over every replica. "
                       + global_batch_help)
  flags.DEFINE_string("workdir", workdir,
                      "Checkpoints, TensorBoard summaries and results of the run.")
  flags.DEFINE_integer("log_every", log_every, "Steps between progress lines.")


def exit_on_flag_errors(run: Callable[[], None]) -> None:
  """Calls `run`; a `ValueError` that names a flag (`--data_dir: ...`) ends the
  program with its message and no traceback: the message says what to change, a
  traceback would only bury it. Other errors propagate as they are."""
  try:
    run()
  except ValueError as error:
    if not str(error).startswith("--"):
      raise
    raise SystemExit(f"error: {error}") from None


def make_replicator(kind: Optional[str] = None, cpu_replicas: Optional[int] = None,
                    tpu: Optional[str] = None, **kwargs) -> replicator.Replicator:
  """The replicator the flags (or the arguments) name; logs what it made.

  `kwargs` go to the replicator's constructor (for example `jit_compile`).
  On a CPU-only machine the logical devices share the cores: each replica's
  ops get cores // cpu_replicas threads, and the replicas run side by side.
  """
  kind = FLAGS.replicator if kind is None else kind
  if cpu_replicas is None:
    cpu_replicas = FLAGS.cpu_replicas
    # `replicator.launch --devices-per-worker N` gives each worker its count, which
    # the flag's default must not override (a --cpu_replicas typed out still does).
    launched = os.environ.get(launch.LOGICAL_CPUS_ENV)
    if launched and not FLAGS["cpu_replicas"].present:
      cpu_replicas = int(launched)
  tpu = FLAGS.tpu if tpu is None and "tpu" in FLAGS else tpu
  if kind not in REPLICATORS:
    raise ValueError(f"--replicator: expected one of {', '.join(REPLICATORS)}, "
                     f"got {kind!r}.")
  if cpu_replicas < 1:
    raise ValueError(f"--cpu_replicas: must be >= 1, got {cpu_replicas}.")
  import tensorflow as tf  # after the flags are parsed: TF reads its env at import
  on_cpu = not tf.config.list_physical_devices("GPU")
  if (kind == "tpu_emulated" or (on_cpu and kind == "multi_gpu")) and cpu_replicas > 1:
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // cpu_replicas))
    tf.config.threading.set_inter_op_parallelism_threads(cpu_replicas)
  if kind == "gpu":
    repl = replicator.GpuReplicator(**kwargs)
  elif kind == "multi_gpu":
    repl = replicator.MultiGpuReplicator(cpu_replicas=cpu_replicas, **kwargs)
  elif kind == "tpu_emulated":
    repl = replicator.TpuReplicator(num_tpu_cores_per_worker=cpu_replicas,
                                    emulate_on_cpu=True, **kwargs)
  else:
    repl = replicator.TpuReplicator(tpu=tpu, **kwargs)
  if not repl.is_chief:  # workers other than the chief log warnings and errors only
    logging.set_verbosity(logging.WARNING)
  logging.info("%s", describe(repl))
  return repl


def describe(repl: replicator.Replicator) -> str:
  """One line: which replicator, its replicas, workers and this worker's devices."""
  devices = ", ".join(repl.mesh.local_devices)
  return (f"{type(repl).__name__}: {repl.num_replicas} replica(s) on "
          f"{repl.num_workers} worker(s); this worker's devices: {devices}")


def format_duration(seconds: float) -> str:
  seconds = max(0, int(round(seconds)))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return f"{hours}h{minutes:02d}m"
  if minutes:
    return f"{minutes}m{seconds:02d}s"
  return f"{seconds}s"


def _format_rate(rate: float) -> str:
  """`26670`, not `2.667e+04`; three significant digits below 100."""
  return f"{rate:.0f}" if rate >= 100 else f"{rate:.3g}"


class Progress:
  """Logs `step n/N`, the rate over the last interval, and an ETA.

  The first interval after the start (or a restore) includes tracing the step,
  and says so: its ETA is only a bound ("at most"), since tracing does not come
  again. Later ETAs use the intervals after the first.

  >>> p = Progress(total=100, items_per_step=64, clock=iter(range(0, 1000, 10)).__next__)
  >>> p.line(10)
  'step 10/100  64 images/s (first interval, tracing included)  ETA at most 1m30s'
  >>> p.line(20)
  'step 20/100  64 images/s  ETA 1m20s'
  """

  def __init__(self, total: int, *, start: int = 0, items_per_step: Optional[int] = None,
               items: str = "images", clock=time.monotonic):
    self.total = total
    self._clock = clock
    self._items_per_step = items_per_step
    self._items = items
    self._first = True
    self._last_step = start
    self._last_time = clock()
    self._steady = None  # (steps, seconds) after the first interval

  def line(self, step: int, **metrics: float) -> str:
    """The progress line at `step` (steps completed); moves the interval on."""
    now = self._clock()
    steps, seconds = step - self._last_step, max(now - self._last_time, 1e-9)
    rate = steps / seconds
    if not self._first:
      done, spent = self._steady or (0, 0.0)
      self._steady = (done + steps, spent + seconds)
    eta_rate = (self._steady[0] / self._steady[1]) if self._steady else rate
    parts = [f"step {step}/{self.total}"]
    parts += [f"{k} {v:.4g}" for k, v in metrics.items()]
    if self._items_per_step:
      parts.append(f"{_format_rate(rate * self._items_per_step)} {self._items}/s")
    else:
      parts.append(f"{_format_rate(rate)} steps/s")
    if self._first:
      parts[-1] += " (first interval, tracing included)"
    if eta_rate > 0 and step < self.total:
      bound = "at most " if self._first else ""
      parts.append(f"ETA {bound}{format_duration((self.total - step) / eta_rate)}")
    self._first = False
    self._last_step, self._last_time = step, now
    return "  ".join(parts)

  def log(self, step: int, **metrics: float) -> None:
    logging.info("%s", self.line(step, **metrics))
