"""RESULTS.md's section for each benchmark, from the JSON that benchmark wrote.

Each `*_section(r)` turns one result (benchmarks/results/NAME.json) into
markdown: the command that made it, its figures and, where benchmarks/report/targets.json
has a target for a figure, its verdict. Only presentation is decided here; what
is judged, against what, is the targets file's.
"""

from benchmarks.report import targets
from benchmarks.runs import allreduce
from benchmarks.runs import run_all
from benchmarks.runs import scaling

COMMANDS = run_all.COMMANDS
DEVICE_COMMANDS = run_all.DEVICE_COMMANDS


def table(rows, header) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def cores(machine: str) -> int:
  """The core count in `common.machine()`'s "host (N cores, CPU)"."""
  try:
    return int(machine.split("(", 1)[1].split(" cores", 1)[0])
  except (IndexError, ValueError):
    return 0


def where(r) -> str:
  """The machine a result was measured on, in a word."""
  if r.get("device") and r["device"] != "CPU":
    return r["device"]
  return "16-core box" if cores(r.get("machine", "")) >= 16 else "2-core VM"


# The step rate's ratios in its table's order, each with the row that shows it.
_STEP_RATE_ROWS = {
    "MirroredStrategy / replicator, 1 step/call":
        "MirroredStrategy / replicator, 1 step/call",
    "replicator 1 step/call / hand-written in-graph 1 step/call":
        "replicator 1 step/call / hand-written in-graph 2-replica call "
        "(the floor for 2 replicas)",
    "replicator 50 steps/call / plain 50-step loop":
        "replicator 50 steps/call / plain 1-device 50-step loop",
    "replicator 50 steps/call / hand-written in-graph 50-step loop":
        "replicator 50 steps/call / hand-written in-graph 2-replica 50-step loop "
        "(the floor for 2 replicas)",
    "replicator 1 replica 50 steps/call / plain 50-step loop":
        "replicator on 1 replica, 50 steps/call / plain 50-step loop "
        "(the same work: the loop's own cost)",
    "replicator 1 step/call / replicator 50 steps/call":
        "replicator 1 step/call / 50 steps/call",
}


def step_rate_section(r, command=COMMANDS["step_rate"]):
  ms = r["ms_per_step (best of rounds)"]
  busy = r.get("cores busy (process CPU time / wall time, mean of rounds)", {})
  rows = [[name, f"{value:.3f}", f"{busy[name]:.2f}" if name in busy else ""]
          for name, value in ms.items()]
  ratios = []
  for key, label in _STEP_RATE_ROWS.items():
    value = r["ratios"].get(key, float("nan"))
    ratios.append([label, f"{value:.2f}x",
                   *targets.columns(value, targets.by_ratio("step_rate", key))])
  return "\n\n".join([
      f"## 1-2. Step rate of a tiny MLP, {r['replicas']} "
      + ("logical GPUs of one GPU" if "GPU" in str(r.get("devices", "")) else
         "logical CPU devices")
      + (f", {r['threads (intra,inter)']} intra-op,inter-op threads"
         if r.get("threads (intra,inter)", "TensorFlow's defaults") != "TensorFlow's defaults"
         else ""),
      f"`{command}`",
      table(rows, ["variant", "ms/step (best of rounds)", "cores busy (CPU time / wall)"]),
      table(ratios, ["ratio", "measured", "target", ""])])


# The library's default bucket options (`AllReduceOptions().pack_bytes` in MiB,
# `.lanes(crowded=False)`: 1 where a host runs more workers than cores);
# tests/collectives/test_collectives.py keeps them equal.
DEFAULT_BUCKETS = (16, 2)
# What the benchmark's older variant names mean.
_ALLREDUCE_LABELS = {
    "ours fp32 packed":
        "ours fp32 packed (32MB buckets, 1 in flight: the default until 2026-11-26)",
    "ours bf16": "ours bf16 (32MB buckets, 1 in flight)",
}


def default_buckets() -> str:
  """The library's default buckets as the all-reduce benchmark names them."""
  return f"{DEFAULT_BUCKETS[0]}MB buckets, {DEFAULT_BUCKETS[1]} in flight"


def variant_label(variant: str) -> str:
  tuned = allreduce.TUNED.match(variant)
  if tuned and (int(tuned.group(2)), int(tuned.group(3) or 1)) == DEFAULT_BUCKETS:
    return variant + " (the default)"
  return _ALLREDUCE_LABELS.get(variant, variant)


def _allreduce_label(name: str) -> str:
  """`name` ("W workers: BASE / VARIANT" or a variant) with its variant labelled."""
  head, sep, variant = name.rpartition(" / ")
  return head + sep + variant_label(variant)


def _grpc_note(settings) -> str:
  """What a job's servers ran with, where an experiment changed TensorFlow's defaults."""
  if not settings or not any(settings.values()):
    return ""
  chunk = settings["recv_buf_max_chunk"]
  chunks = ("unchunked" if chunk < 0 else f"in chunks of {chunk} bytes" if chunk
            else "in 4 KB chunks")
  return (f"; both sides' servers: {settings['num_channels_per_target'] or 1} gRPC "
          f"channel(s) per peer, responses {chunks}")


def allreduce_section(r, command=None):
  command = command or r.get("command", COMMANDS["allreduce"])
  ms = r["ms_per_all_reduce (best of rounds)"]
  workers = sorted({int(k.rsplit(", ", 1)[1].split()[0]) for k in ms})
  variants = list(dict.fromkeys(k.rsplit(", ", 1)[0] for k in ms))
  rows = [[_allreduce_label(v)]
          + [f"{ms.get(f'{v}, {w} workers', float('nan')):.1f}" for w in workers]
          for v in variants]
  judged = {}  # (baseline, variant): its entry in targets.json, in the table's order
  for variant in variants:
    entry = targets.for_variant(variant)
    if entry is not None:
      judged[(entry["baseline"], variant)] = entry
  checks = []
  for w in workers:
    for (base, variant), entry in judged.items():
      name = f"{w} workers: {base} / {variant}"
      if name not in r["ratios (best of rounds)"]:
        continue
      each = r["ratios (each round)"][name]
      middle = targets.median(each)
      checks.append([_allreduce_label(name), f"{middle:.2f}x",
                     f"{min(each):.2f}x - {max(each):.2f}x",
                     f"{r['ratios (best of rounds)'][name]:.2f}x",
                     *targets.columns(middle, entry)])
  return "\n\n".join([
      f"## 3. All-reduce of a ResNet-50-like gradient set ({r['tensors']} tensors, "
      f"{r['megabytes_fp32']:.1f} MB in float32) across local worker processes",
      f"`{command}` (each round one job per W, in which MWMS and ours share the "
      "worker processes and their calls alternate; each worker process: cores / W "
      "intra-op threads; ms: worker 0's median call of 20, best of the rounds; the "
      "verdict goes by the median of the rounds' ratios, each taken within one job; "
      "MWMS `bytes_per_pack=0`, its default, is one pack of every tensor"
      + _grpc_note(r.get("grpc settings")) + ")",
      table(rows, ["variant"] + [f"{w} workers, ms" for w in workers]),
      table(checks, ["ratio", "median of the rounds", "round by round",
                     "best times of the rounds", "target", ""])])


def scaling_figure(r, measure: str, workers: int) -> float:
  """What a scaling target in targets.json measures ("efficiency" or "ours /
  MWMS") at `workers`, from result `r`."""
  if measure == "efficiency":  # from the figures: JSON of older runs divided by W too
    return scaling.efficiency(r["examples_per_s (best of rounds)"])[f"ours, {workers} workers"]
  return targets.median(r["ours / MWMS (each round)"][f"{workers} workers"])


_SCALING_ROWS = {"efficiency": "{workers} workers: ours' efficiency",
                 "ours / MWMS": "{workers} workers: ours / MWMS, median of the rounds"}


def _scaling_goal(workers: int) -> str:
  """The scaling targets of targets.json in a line."""
  goal = {t["measure"]: t for t in targets.of("scaling")}
  versus = goal["ours / MWMS"]
  return (f"Target: {targets.wanted(goal['efficiency'])} per-worker efficiency at "
          f"{workers} workers and "
          + ("not below MWMS" if versus.get("at_least") == 1 else
             f"ours / MWMS {targets.wanted(versus)}") + ".")


def scaling_section(r, command=None):
  command = command or r.get("command", COMMANDS["scaling"])
  eps = r["examples_per_s (best of rounds)"]
  eff = scaling.efficiency(eps)
  rows = [[k, f"{v:.0f}", f"{100 * eff[k]:.0f}%"] for k, v in eps.items()]
  counts = sorted({int(k.split(", ")[1].split()[0]) for k in eps})
  each = r["ours / MWMS (each round)"]
  versus = []
  for w in counts:
    if f"MWMS, {w} workers" not in eps:
      continue
    ratios = each[f"{w} workers"]
    versus.append([f"{w} workers", f"{targets.median(ratios):.2f}x",
                   f"{min(ratios):.2f}x - {max(ratios):.2f}x",
                   f"{eps[f'ours, {w} workers'] / eps[f'MWMS, {w} workers']:.2f}x"])
  target = []
  workers = targets.TARGETS["scaling"]["workers"]
  if f"ours, {workers} workers" in eps and f"MWMS, {workers} workers" in eps and 1 in counts:
    checks = []
    for t in targets.of("scaling"):
      value = scaling_figure(r, t["measure"], workers)
      checks.append([_SCALING_ROWS[t["measure"]].format(workers=workers),
                     targets.shown(value, t), *targets.columns(value, t)])
    target = [table(checks, ["target", "measured", "", ""])]
  batch = r["batch_per_worker"]
  return "\n\n".join([
      "## 4. Scaling over local workers (model with ResNet-sized gradients, "
      f"batch {batch} per worker: per byte of gradient, the compute of ResNet-50 at "
      f"{scaling.resnet50_images(batch):.1f} images per worker)",
      f"`{command}` (each round one job per W, in which MWMS and ours share the worker "
      "processes, each training a model of its own, their calls of 5 steps alternating; "
      "examples/s: every worker's examples over worker 0's median call, best of the "
      "rounds; "
      + (f"both sides' buckets {r['pack_mb']:g} MB)" if r.get("pack_mb")
         else f"each side's default buckets: ours {DEFAULT_BUCKETS[0]} MB, "
              f"{DEFAULT_BUCKETS[1]} in flight; MWMS one pack)"),
      table(rows, ["variant", "examples/s",
                   "per-worker efficiency (examples/s over ours on 1 worker: "
                   "the W workers share its cores)"]),
      table(versus, ["same W", "ours / MWMS, median of the rounds (each within one job)",
                     "round by round", "best of rounds"]),
      *target,
      _scaling_goal(workers)
      + (" **Needs the 16-core box**: here more workers than cores share them (a thread "
         "each, 4 on 2 cores), so what carries over is ours against MWMS at the same W."
         if cores(r["machine"]) < 16 else "")])


_GAN_ROWS = {"GpuReplicator / plain": "GpuReplicator / plain tf.function"}


def gan_section(r):
  ms = r["ms_per_D+G_step (best of rounds)"]
  rows = [[k, f"{v:.1f}"] for k, v in ms.items()]
  checks = []
  for t in targets.of("gan_step"):
    ratio = r["ratios"][t["ratio"]]
    checks.append([_GAN_ROWS.get(t["ratio"], t["ratio"]), f"{ratio:.3f}x",
                   *targets.columns(ratio, t)])
  return "\n\n".join([
      f"## 5. SN-GAN training step (`small` config, batch {r['batch']}), one replica",
      f"`{COMMANDS['gan_step']}`",
      table(rows, ["variant", "ms per D+G step"]),
      table(checks, ["ratio", "measured", "target", ""])])


def resnet50_section(r, bf16=None):
  """`bf16`: a run of the bf16 + XLA variant alone, where `r` lacks it: its
  ratio is shown as a separate run's, judged by the same target."""
  best = dict(r["images_per_second (best of rounds)"])
  ratios = dict(r["ratios (best of rounds)"])
  each = dict(r["ratios (each round)"])
  separate = ""
  checks = []
  for t in targets.of("resnet50"):
    keys = [t["ratio"]]
    name, _, base = t["ratio"].partition(" / ")
    if (bf16 is not None and name not in best and base in best
        and name in bf16["images_per_second (best of rounds)"]):
      # Not the same run: the ratio divides by r's rounds of the baseline.
      best[f"{name} (separate run)"] = bf16["images_per_second (best of rounds)"][name]
      key = f"{name} (separate run) / {base}"
      ratios[key] = best[f"{name} (separate run)"] / best[base]
      each[key] = [x[name] / k[base] for x in bf16["images_per_second (each round)"]
                   for k in r["images_per_second (each round)"]]
      keys.append(key)
      separate = (f" The separate run: `{bf16['command']}`, in another process on the same "
                  f"warm machine right after; its ratio divides by the first run's {base} "
                  "rounds (every pair), so it is not a same-run figure.")
    for key in keys:
      if key not in ratios:
        continue
      cells = targets.columns(ratios[key], t)
      if targets.judged(t) and key != t["ratio"]:
        cells[1] += " (not in one run)"
      checks.append([key, f"{ratios[key]:.2f}x",
                     f"{min(each[key]):.2f}x - {max(each[key]):.2f}x", *cells])
  rows = [[k, f"{v:.0f}"] for k, v in best.items()]
  return "\n\n".join([
      f"## 6. ResNet-50 training on {r['device']} (batch {r['batch']}, "
      f"{r['image_size']}x{r['image_size']}, synthetic data)",
      f"`{r.get('command', DEVICE_COMMANDS['resnet50'])}` on {r['machine']}, "
      f"TensorFlow {r['tensorflow']}.{separate}",
      table(rows, ["variant", "images/s (best of rounds)"]),
      table(checks, ["ratio", "best of rounds", "round by round", "target", ""])])
