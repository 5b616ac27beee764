"""Runs the benchmarks (or reads their JSON) and writes benchmarks/RESULTS.md.

  python -m benchmarks.report            # run all, then write RESULTS.md
  python -m benchmarks.report --no-run   # rewrite RESULTS.md from results/*.json

Every figure in RESULTS.md comes from the JSON files under benchmarks/results/,
each written by the command shown next to its table.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys

from benchmarks import allreduce
from benchmarks import scaling

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

COMMANDS = {
    "step_rate": "python -m benchmarks.step_rate --replicas 2 --rounds 10",
    "allreduce": "python -m benchmarks.allreduce --workers 2,4 --rounds 3",
    "allreduce_lanes": ("python -m benchmarks.allreduce --workers 2,4 --rounds 3 --variants "
                        "'ours fp32 packed;ours fp32, 8MB buckets, 4 in flight;"
                        "ours fp32, 16MB buckets, 2 in flight;ours bf16;"
                        "ours bf16, 8MB buckets, 4 in flight;ours bf16, 16MB buckets, 2 in flight;"
                        "MWMS RING, bytes_per_pack=0;MWMS RING, bytes_per_pack=32MB;"
                        "transfer alone: one bf16 tensor'"),
    "scaling": "python -m benchmarks.scaling --workers 1,2,4 --rounds 3 --iters 10",
    "scaling_compute": ("python -m benchmarks.scaling --workers 1,2,4 --batch 5120 "
                        "--rounds 2 --iters 5"),
    "gan_step": "python -m benchmarks.gan_step --batch 64 --rounds 5",
    "checkpoint_roundtrip": "python -m benchmarks.checkpoint_roundtrip",
    "gather_step": "python -m benchmarks.gather_step --workers 2,4 --rounds 3",
    "first_step": "python -m benchmarks.first_step --replicas 1,2 --rounds 3",
    "bn_step": "python -m benchmarks.bn_step --workers 2,4 --rounds 3",
    "bn_step_per_worker": ("python -m benchmarks.bn_step --workers 2,4 --rounds 3 "
                           "--statistics per-worker"),
}
# Run on the device machine by benchmarks/device/run.sh (DEVICE.md), not by `run_all`:
# their JSON comes back from there into results/, each naming the command that made it.
DEVICE_COMMANDS = {
    "resnet50": "python -m benchmarks.resnet50 --batch 128 --rounds 3 --calls 2",
    "allreduce_box": "CUDA_VISIBLE_DEVICES= python -m benchmarks.allreduce --workers 8,4,2 --rounds 2",
    "allreduce_box_lanes": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.allreduce --workers 8 "
                            "--rounds 3"),
    "allreduce_box_sizes": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.allreduce --workers 8 "
                            "--rounds 2"),
    "allreduce_box_grpc": ("BENCH_GRPC=channels=4 CUDA_VISIBLE_DEVICES= "
                           "python -m benchmarks.allreduce --workers 8 --rounds 2"),
    "step_rate_box_threads": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.step_rate "
                              "--replicas 2 --rounds 10 --threads 2,2"),
    "scaling_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.scaling --workers 1,8 "
                    "--rounds 2 --iters 10"),
    "scaling_box_compute": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.scaling --workers 1,8 "
                            "--batch 5120 --rounds 2 --iters 3"),
    "step_rate_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.step_rate --replicas 2 "
                      "--rounds 10"),
    "allreduce_box_default": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.allreduce "
                              "--workers 8 --rounds 2"),
    "bn_step_per_worker_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.bn_step --workers 8 "
                               "--rounds 1 --iters 8 --statistics per-worker"),
    "step_rate_gpu": ("python -m benchmarks.step_rate --gpus --replicas 2 --rounds 2 "
                      "--steps 200"),
    "gpu_check": "python3 -m benchmarks.device.gpu_check",
}


def run_all(names):
  os.makedirs(RESULTS, exist_ok=True)
  for name in names:
    command = shlex.split(COMMANDS[name]) + ["--json", os.path.join(RESULTS, f"{name}.json")]
    print("+", " ".join(command), flush=True)
    subprocess.run([sys.executable] + command[1:], check=True,
                   cwd=os.path.dirname(HERE))


def _load(name):
  path = os.path.join(RESULTS, f"{name}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _median(values):
  """The middle value (the upper one of an even count), as the verdicts take it."""
  return sorted(values)[len(values) // 2]


def _verdict(value, target, higher_is_better=True):
  met = value >= target if higher_is_better else value <= target
  return "met" if met else "**missed**"


def _table(rows, header):
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def step_rate_section(r, command=COMMANDS["step_rate"]):
  ms = r["ms_per_step (best of rounds)"]
  ratio_ms = r["ratios"]["MirroredStrategy / replicator, 1 step/call"]
  ratio_loop = r["ratios"]["replicator 50 steps/call / plain 50-step loop"]
  ratio_one = r["ratios"].get("replicator 1 replica 50 steps/call / plain 50-step loop",
                              float("nan"))
  busy = r.get("cores busy (process CPU time / wall time, mean of rounds)", {})
  rows = [[name, f"{value:.3f}", f"{busy[name]:.2f}" if name in busy else ""]
          for name, value in ms.items()]
  return "\n\n".join([
      f"## 1-2. Step rate of a tiny MLP, {r['replicas']} "
      + ("logical GPUs of one GPU" if "GPU" in str(r.get("devices", "")) else
         "logical CPU devices")
      + (f", {r['threads (intra,inter)']} intra-op,inter-op threads"
         if r.get("threads (intra,inter)", "TensorFlow's defaults") != "TensorFlow's defaults"
         else ""),
      f"`{command}`",
      _table(rows, ["variant", "ms/step (best of rounds)",
                    "cores busy (CPU time / wall)"]),
      _table([
          ["MirroredStrategy / replicator, 1 step/call", f"{ratio_ms:.2f}x", ">= 1.5x",
           _verdict(ratio_ms, 1.5)],
          ["replicator 50 steps/call / plain 1-device 50-step loop", f"{ratio_loop:.2f}x",
           "<= 1.1x", _verdict(ratio_loop, 1.1, higher_is_better=False)],
          ["replicator 50 steps/call / hand-written in-graph 2-replica 50-step loop (the floor for 2 replicas)",
           f"{r['ratios'].get('replicator 50 steps/call / hand-written in-graph 50-step loop', float('nan')):.2f}x",
           "", ""],
          ["replicator on 1 replica, 50 steps/call / plain 50-step loop (the same work: the loop's own cost)",
           f"{ratio_one:.2f}x", "<= 1.1x", _verdict(ratio_one, 1.1, higher_is_better=False)],
          ["replicator 1 step/call / 50 steps/call",
           f"{r['ratios']['replicator 1 step/call / replicator 50 steps/call']:.2f}x", "", ""],
      ], ["ratio", "measured", "target", ""])])


# The library's default bucket options (`AllReduceOptions().pack_bytes` in MiB,
# `.lanes(crowded=False)`: 1 where a host runs more workers than cores);
# tests/test_collectives.py keeps them equal.
DEFAULT_BUCKETS = (16, 2)
# What the benchmark's older variant names mean.
_ALLREDUCE_LABELS = {
    "ours fp32 packed": "ours fp32 packed (32MB buckets, 1 in flight: the default until 2026-11-26)",
    "ours bf16": "ours bf16 (32MB buckets, 1 in flight)",
}


def _variant_label(variant: str) -> str:
  tuned = allreduce.TUNED.match(variant)
  if tuned and (int(tuned.group(2)), int(tuned.group(3) or 1)) == DEFAULT_BUCKETS:
    return variant + " (the default)"
  return _ALLREDUCE_LABELS.get(variant, variant)


def _allreduce_label(name: str) -> str:
  """`name` ("W workers: BASE / VARIANT" or a variant) with its variant labelled."""
  head, sep, variant = name.rpartition(" / ")
  return head + sep + _variant_label(variant)


def _grpc_note(settings) -> str:
  """What a job's servers ran with, where an experiment changed TensorFlow's defaults."""
  if not settings or not any(settings.values()):
    return ""
  chunk = settings["recv_buf_max_chunk"]
  chunks = ("unchunked" if chunk < 0 else f"in chunks of {chunk} bytes" if chunk
            else "in 4 KB chunks")
  return (f"; both sides' servers: {settings['num_channels_per_target'] or 1} gRPC "
          f"channel(s) per peer, responses {chunks}")


def _allreduce_target(variant: str):
  """(the MWMS baseline, item 3's target) `variant` is judged by; the target is
  None for a bound. None for a variant that is not judged."""
  if variant == "transfer alone: one fp32 tensor":
    return "MWMS packed", None
  if variant == "transfer alone: one bf16 tensor":
    return "best MWMS fp32", None
  if variant == "ours fp32 packed" or variant.startswith("ours fp32, "):
    return "MWMS packed", 1.0
  if variant == "ours bf16" or variant.startswith("ours bf16, "):
    return "best MWMS fp32", 1.8
  return None


def allreduce_section(r, command=None):
  command = command or r.get("command", COMMANDS["allreduce"])
  ms = r["ms_per_all_reduce (best of rounds)"]
  workers = sorted({int(k.rsplit(", ", 1)[1].split()[0]) for k in ms})
  variants = list(dict.fromkeys(k.rsplit(", ", 1)[0] for k in ms))
  rows = [[_allreduce_label(v)]
          + [f"{ms.get(f'{v}, {w} workers', float('nan')):.1f}" for w in workers]
          for v in variants]
  targets = {}  # (baseline, variant): target, or None for a bound; in the table's order
  for variant in variants:
    judged = _allreduce_target(variant)
    if judged is not None:
      targets[(judged[0], variant)] = judged[1]
  checks = []
  for w in workers:
    for (base, variant), target in targets.items():
      name = f"{w} workers: {base} / {variant}"
      if name not in r["ratios (best of rounds)"]:
        continue
      each = r["ratios (each round)"][name]
      middle = _median(each)
      row = [_allreduce_label(name), f"{middle:.2f}x", f"{min(each):.2f}x - {max(each):.2f}x",
             f"{r['ratios (best of rounds)'][name]:.2f}x"]
      if target is None:
        row += ["(bound: no packing, no casting)", ""]
      else:
        row += [f">= {target}x", _verdict(middle, target)]
      checks.append(row)
  return "\n\n".join([
      f"## 3. All-reduce of a ResNet-50-like gradient set ({r['tensors']} tensors, "
      f"{r['megabytes_fp32']:.1f} MB in float32) across local worker processes",
      f"`{command}` (each round one job per W, in which MWMS and ours share the "
      "worker processes and their calls alternate; each worker process: cores / W "
      "intra-op threads; ms: worker 0's median call of 20, best of the rounds; the "
      "verdict goes by the median of the rounds' ratios, each taken within one job; "
      "MWMS `bytes_per_pack=0`, its default, is one pack of every tensor"
      + _grpc_note(r.get("grpc settings")) + ")",
      _table(rows, ["variant"] + [f"{w} workers, ms" for w in workers]),
      _table(checks, ["ratio", "median of the rounds", "round by round",
                      "best times of the rounds", "target", ""])])


def scaling_section(r, command=None):
  command = command or r.get("command", COMMANDS["scaling"])
  eps = r["examples_per_s (best of rounds)"]
  eff = scaling.efficiency(eps)  # from the figures: JSON of older runs divided by W too
  rows = [[k, f"{v:.0f}", f"{100 * eff[k]:.0f}%"] for k, v in eps.items()]
  counts = sorted({int(k.split(", ")[1].split()[0]) for k in eps})
  each = r["ours / MWMS (each round)"]
  versus = []
  for w in counts:
    if f"MWMS, {w} workers" not in eps:
      continue
    ratios = each[f"{w} workers"]
    versus.append([f"{w} workers", f"{_median(ratios):.2f}x",
                   f"{min(ratios):.2f}x - {max(ratios):.2f}x",
                   f"{eps[f'ours, {w} workers'] / eps[f'MWMS, {w} workers']:.2f}x"])
  target = []
  if "ours, 8 workers" in eps and "MWMS, 8 workers" in eps and 1 in counts:
    ratio = _median(each["8 workers"])
    target = [_table([["8 workers: ours' efficiency", f"{100 * eff['ours, 8 workers']:.0f}%",
                       ">= 95%", _verdict(eff["ours, 8 workers"], 0.95)],
                      ["8 workers: ours / MWMS, median of the rounds", f"{ratio:.2f}x",
                       ">= 1.0x", _verdict(ratio, 1.0)]],
                     ["target", "measured", "", ""])]
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
      _table(rows, ["variant", "examples/s",
                    "per-worker efficiency (examples/s over ours on 1 worker: "
                    "the W workers share its cores)"]),
      _table(versus, ["same W", "ours / MWMS, median of the rounds (each within one job)",
                      "round by round", "best of rounds"]),
      *target,
      "Target: >= 95% per-worker efficiency at 8 workers and not below MWMS."
      + (" **Needs the 16-core box**: here more workers than cores share them (a thread "
         "each, 4 on 2 cores), so what carries over is ours against MWMS at the same W."
         if _cores(r["machine"]) < 16 else "")])


def _cores(machine: str) -> int:
  """The core count in `common.machine()`'s "host (N cores, CPU)"."""
  try:
    return int(machine.split("(", 1)[1].split(" cores", 1)[0])
  except (IndexError, ValueError):
    return 0


def gan_section(r):
  ms = r["ms_per_D+G_step (best of rounds)"]
  ratio = r["ratios"]["GpuReplicator / plain"]
  rows = [[k, f"{v:.1f}"] for k, v in ms.items()]
  return "\n\n".join([
      f"## 5. SN-GAN training step (`small` config, batch {r['batch']}), one replica",
      f"`{COMMANDS['gan_step']}`",
      _table(rows, ["variant", "ms per D+G step"]),
      _table([["GpuReplicator / plain tf.function", f"{ratio:.3f}x", "<= 1.05x",
               _verdict(ratio, 1.05, higher_is_better=False)]],
             ["ratio", "measured", "target", ""])])


def checkpoint_section(r):
  return "\n\n".join([
      f"## Checkpoint round trip ({r['parameters'] / 1e6:.1f} M parameters + Adam slots, "
      f"{r['checkpoint_MB']} MB)",
      f"`{COMMANDS['checkpoint_roundtrip']}`",
      _table([["save (2 replicas)", r["save_s"], r["plain tf.train.Checkpoint write_s"],
               f"{r['ratios']['save: ours / plain']:.2f}x"],
              ["restore (on 1 replica)", r["restore_s (on 1 replica)"],
               r["plain tf.train.Checkpoint read_s"],
               f"{r['ratios']['restore: ours / plain']:.2f}x"]],
             ["", "replicator.Checkpointer, s", "tf.train.Checkpoint, s", "ours / plain"])])


def _mwms_over_ours_table(r):
  each = r["MWMS / ours (each round)"]
  return _table([[w, f"{_median(each[w]):.2f}x",
                  f"{min(each[w]):.2f}x - {max(each[w]):.2f}x", f"{value:.2f}x"]
                 for w, value in r["MWMS / ours (best of rounds)"].items()],
                ["same W", "MWMS / ours, median of the rounds (each within one job)",
                 "round by round", "best of rounds"])


_SAME_JOB = ("each round one job per W, in which MWMS and ours share the worker "
             "processes and their calls alternate; ")


def gather_section(r):
  ms = r["ms_per_step (best of rounds)"]
  losses = r.get("loss of worker 0 after the same steps (last round)", {})
  rows = [[k, f"{v:.2f}", f"{losses[k]:.6f}" if k in losses else ""]
          for k, v in ms.items()]
  return "\n\n".join([
      "## All-gather in a training step (contrastive loss over the global batch, "
      f"{r['batch_per_worker']} x {r['dim']} embeddings per worker, differentiated)",
      f"`{COMMANDS['gather_step']}` ({_SAME_JOB}each worker process: cores / W "
      "intra-op threads; "
      "ms: worker 0's median call, 5 steps a call, best of the rounds)",
      _table(rows, ["variant", "ms/step", "worker 0's loss after the same steps"]),
      _mwms_over_ours_table(r)])


def bn_step_section(r, command=None):
  ms = r["ms_per_step (best of rounds)"]
  first = r.get("first_call_s (best of rounds)", {})
  to_loss = r.get("to_first_loss_s (best of rounds)")  # since 2026-11-26
  losses = r.get("loss of worker 0 after the same steps (last round)", {})
  alike = r.get("moving averages the same bits on every worker (every round)")  # since 6a4c86c
  rows = [[k, f"{v:.1f}", f"{first[k]:.1f}" if k in first else ""]
          + ([f"{to_loss[k]:.1f}"] if to_loss else [])
          + [f"{losses[k]:.4f}" if k in losses else ""]
          + (["yes" if alike.get(k) else "**no**"] if alike else []) for k, v in ms.items()]
  parameters = ", ".join(f"{k} {v:,}" for k, v in r["trainable parameters"].items())
  synchronized = r.get("statistics", "global") == "global"
  return "\n\n".join([
      ("## Synchronized batch norm in a training step (ResNet-50 v1.5, " if synchronized else
       "## Per-worker batch norm in a training step (ResNet-50 v1.5, ")
      + f"{r['image_size']}x{r['image_size']}, {r['batch_per_worker']} images per worker, "
      + ("statistics over the global batch)" if synchronized else
         "statistics over each worker's batch, moving averages kept the same everywhere "
         "by ours)"),
      f"`{command or COMMANDS['bn_step' if synchronized else 'bn_step_per_worker']}` "
      f"({_SAME_JOB}"
      "each worker process: cores / W intra-op threads; "
      + ("ours: Sonnet with `CrossReplicaBatchNorm`; MWMS: Keras with "
         "`BatchNormalization(synchronized=True)`; " if synchronized else
         "ours: Sonnet with `snt.BatchNorm`, whose moving averages the replicator "
         "averages over the workers where they differ; MWMS: Keras with "
         "`BatchNormalization(synchronized=False)`; ")
      + f"trainable parameters: {parameters}; ms: worker 0's median call of {r['iters']}, "
      "one step a call, best of the rounds; first call: ours builds the model in it, "
      "MWMS before it, the two timed one after the other, ours first in odd rounds; "
      "the losses differ because the initial values do"
      + ("; the moving averages: whether every worker held the same bits after the "
         "timed calls, in every round (a CRC of their bytes, gathered)" if alike else "")
      + ")",
      _table(rows, ["variant", "ms/step", "first call, s"]
             + (["build (MWMS: eagerly, before its step) + first call, s"] if to_loss else [])
             + ["worker 0's loss after the same steps"]
             + (["moving averages the same on every worker"] if alike else [])),
      _mwms_over_ours_table(r)])


def gpu_check_section(r, command=None):
  """The GPU paths' checks against one-device oracles (not a benchmark)."""
  rows = [[row["check"], "pass" if row["ok"] else "**FAIL**", row["detail"]]
          for row in r["results"]]
  before = r.get("before a0abd90 (26763b3)")
  failed_before = [row["check"] for row in before or () if not row["ok"]]
  return "\n\n".join([
      "## The GPU paths against one-device oracles (correctness, not speed)",
      f"`{command or r['command']}` at {r.get('commit', '?')} (benchmarks/device/gpu_check.py "
      "says what each check trains and compares; TF32 off)",
      _table(rows, ["check", "", "largest differences"]),
      *([f"The same checks before {r.get('commit')}: "
         + ", ".join(failed_before) + " failed (NCCL between logical GPUs of one GPU: "
         "'NCCL: invalid usage'; bfloat16: NcclAllReduce takes no bfloat16)."]
        if failed_before else [])])


def first_step_section(r):
  rows, ratios = [], []
  for n, figures in r["replicas"].items():
    for variant, seconds in figures["first_step_s"].items():
      rows.append([f"{variant}, {n} replica(s)", f"{seconds:.2f}"])
    for name, ratio in figures["ratios"].items():
      ratios.append([f"{n} replica(s): {name}", f"{ratio['best_of_rounds']:.2f}x",
                     f"{min(ratio['rounds']):.2f}x - {max(ratio['rounds']):.2f}x"])
  return "\n\n".join([
      "## Time to the first training step (Sonnet ResNet-50, "
      f"{r['image_size']}x{r['image_size']}, {r['per_replica_batch']} images per replica)",
      f"`{COMMANDS['first_step']}` (each figure a fresh process: building the model and "
      "optimizer, tracing, Grappler and the first step; MirroredStrategy's model and "
      "optimizer built eagerly first, as it requires; best of the rounds)",
      _table(rows, ["variant", "s to the end of the first step"]),
      _table(ratios, ["ratio (> 1: ours is faster)", "best of rounds", "round by round"])])


def resnet50_section(r, bf16=None):
  """Item 6. `bf16`: a run of the bf16 + XLA variant alone, when `r` lacks it."""
  best = dict(r["images_per_second (best of rounds)"])
  ratios = dict(r["ratios (best of rounds)"])
  each = dict(r["ratios (each round)"])
  separate = ""
  name = "GpuReplicator bf16 + XLA"
  if bf16 is not None and name not in best and "Keras fp32" in best:
    # Not the same run: the ratio divides by r's Keras fp32 rounds.
    best[f"{name} (separate run)"] = bf16["images_per_second (best of rounds)"][name]
    key = f"{name} (separate run) / Keras fp32"
    keras = r["images_per_second (each round)"]
    ratios[key] = best[f"{name} (separate run)"] / best["Keras fp32"]
    each[key] = [x[name] / k["Keras fp32"] for x in bf16["images_per_second (each round)"]
                 for k in keras]
    separate = (f" The separate run: `{bf16['command']}`, in another process on the same "
                "warm machine right after; its ratio divides by the first run's Keras "
                "fp32 rounds (every pair), so it is not a same-run figure.")
  rows = [[k, f"{v:.0f}"] for k, v in best.items()]
  targets = {"GpuReplicator fp32 / Keras fp32": 1.0,
             "GpuReplicator bf16 + XLA / Keras fp32": 2.0,
             "GpuReplicator bf16 + XLA (separate run) / Keras fp32": 2.0,
             "Keras bf16 + XLA / Keras fp32": None}
  checks = []
  for key, target in targets.items():
    if key not in ratios:
      continue
    verdict = _verdict(ratios[key], target) if target else ""
    if target and "separate run" in key:
      verdict += " (not in one run)"
    checks.append([key, f"{ratios[key]:.2f}x", f"{min(each[key]):.2f}x - {max(each[key]):.2f}x"]
                  + ([f">= {target}x", verdict] if target
                     else ["(Keras' own bf16 + XLA, for reference)", ""]))
  return "\n\n".join([
      f"## 6. ResNet-50 training on {r['device']} (batch {r['batch']}, "
      f"{r['image_size']}x{r['image_size']}, synthetic data)",
      f"`{r.get('command', DEVICE_COMMANDS['resnet50'])}` on {r['machine']}, "
      f"TensorFlow {r['tensorflow']}.{separate}",
      _table(rows, ["variant", "images/s (best of rounds)"]),
      _table(checks, ["ratio", "best of rounds", "round by round", "target", ""])])


def _where(r) -> str:
  """The machine a result was measured on, in a word."""
  if r.get("device") and r["device"] != "CPU":
    return r["device"]
  return "16-core box" if _cores(r.get("machine", "")) >= 16 else "2-core VM"


def _allreduce_rows(name, r):
  """Item 3's rows of one all-reduce result: the library's default buckets where
  the run had them, else its side-by-side variant (8 MB, 4 in flight)."""
  each = r["ratios (each round)"]
  default = f"{DEFAULT_BUCKETS[0]}MB buckets, {DEFAULT_BUCKETS[1]} in flight"
  rows = []
  counts = sorted({int(key.split(" ")[0]) for key in each})
  for workers in counts:
    for dtype in ("fp32", "bf16"):
      for buckets in (default, "8MB buckets, 4 in flight"):
        mwms, target = _allreduce_target(f"ours {dtype}, {buckets}")
        key = f"{workers} workers: {mwms} / ours {dtype}, {buckets}"
        if key in each:
          ratio = _median(each[key])
          label = "the default" if buckets == default else buckets
          rows.append([f"3. all-reduce, {dtype}, {workers} workers ({label}): "
                       f"{mwms} / ours", f">= {target:g}x", f"{ratio:.2f}x",
                       f"{_where(r)}, `{name}.json`", _verdict(ratio, target)])
          break
  return rows


def summary_section() -> str:
  """Every target of issue 7 with the figure that judges it, from the results."""
  rows = []
  for name in ("step_rate", "step_rate_box"):
    r = _load(name)
    if r is None:
      continue
    ratios = r["ratios"]
    where = f"{_where(r)}, `{name}.json`"
    one = ratios["MirroredStrategy / replicator, 1 step/call"]
    rows.append(["1. step rate, 1 step a call: MirroredStrategy / ours", ">= 1.5x",
                 f"{one:.2f}x", where, _verdict(one, 1.5)])
    same = ratios.get("replicator 1 replica 50 steps/call / plain 50-step loop")
    if same is not None:
      rows.append(["2. 50 steps a call, 1 replica / the plain 50-step loop", "<= 1.1x",
                   f"{same:.2f}x", where, _verdict(same, 1.1, higher_is_better=False)])
    two = ratios["replicator 50 steps/call / plain 50-step loop"]
    floor = ratios.get("replicator 50 steps/call / hand-written in-graph 50-step loop")
    rows.append(["2. 50 steps a call, 2 replicas / the plain 1-device loop", "<= 1.1x",
                 f"{two:.2f}x" + (f" (the hand-written 2-replica floor: {two / floor:.2f}x; "
                                  f"ours {floor:.2f}x the floor)" if floor else ""),
                 where, _verdict(two, 1.1, higher_is_better=False)])
  for name in ("allreduce", "allreduce_box", "allreduce_box_default"):
    r = _load(name)
    if r is not None:
      rows.extend(_allreduce_rows(name, r))
  for name in ("scaling_box", "scaling_box_compute"):
    r = _load(name)
    if r is None or "ours, 8 workers" not in r["examples_per_s (best of rounds)"]:
      continue
    eff = scaling.efficiency(r["examples_per_s (best of rounds)"])["ours, 8 workers"]
    versus = _median(r["ours / MWMS (each round)"]["8 workers"])
    label = f"batch {r['batch_per_worker']} a worker"
    rows.append([f"4. scaling, 8 workers, {label}: efficiency", ">= 95%",
                 f"{100 * eff:.0f}%", f"{_where(r)}, `{name}.json`", _verdict(eff, 0.95)])
    rows.append([f"4. scaling, 8 workers, {label}: ours / MWMS", ">= 1.0x",
                 f"{versus:.2f}x", f"{_where(r)}, `{name}.json`", _verdict(versus, 1.0)])
  r = _load("gan_step")
  if r is not None:
    ratio = r["ratios"]["GpuReplicator / plain"]
    rows.append(["5. SN-GAN step, GpuReplicator / plain tf.function", "<= 1.05x",
                 f"{ratio:.2f}x", f"{_where(r)}, `gan_step.json`",
                 _verdict(ratio, 1.05, higher_is_better=False)])
  r = _load("resnet50")
  if r is not None and r.get("device") != "CPU":
    for key, target in (("GpuReplicator fp32 / Keras fp32", 1.0),
                        ("GpuReplicator bf16 + XLA / Keras fp32", 2.0)):
      if key in r["ratios (each round)"]:
        ratio = _median(r["ratios (each round)"][key])
        rows.append([f"6. ResNet-50 images/s, {key}", f">= {target:g}x", f"{ratio:.2f}x",
                     f"{_where(r)}, `resnet50.json`", _verdict(ratio, target)])
  return "\n\n".join([
      "## Issue 7's targets at a glance",
      "Each target with the figure that judges it (the median of the rounds where a "
      "result has rounds), the machine and the result file; the tables below have the "
      "commands, and NOTES at the end says why each miss is what it is.",
      _table(rows, ["target", "wanted", "measured", "where", ""])])


def write_report(notes_path=os.path.join(HERE, "NOTES.md")):
  sections = []
  machine = None
  for name, section in (("step_rate", step_rate_section), ("allreduce", allreduce_section),
                        ("allreduce_lanes", allreduce_section),
                        ("scaling", scaling_section),
                        ("scaling_compute", scaling_section), ("gan_step", gan_section),
                        ("checkpoint_roundtrip", checkpoint_section),
                        ("gather_step", gather_section),
                        ("first_step", first_step_section),
                        ("bn_step", bn_step_section),
                        ("bn_step_per_worker", bn_step_section)):
    result = _load(name)
    if result is None:
      sections.append(f"## {name}\n\nNot run yet: `{COMMANDS[name]}`.")
      continue
    machine = machine or result.get("machine")
    sections.append(section(result))
  for name, section in (("step_rate_box", step_rate_section),
                        ("allreduce_box", allreduce_section),
                        ("allreduce_box_lanes", allreduce_section),
                        ("allreduce_box_sizes", allreduce_section),
                        ("allreduce_box_grpc", allreduce_section),
                        ("step_rate_box_threads", step_rate_section),
                        ("scaling_box", scaling_section),
                        ("scaling_box_compute", scaling_section),
                        ("allreduce_box_default", allreduce_section),
                        ("bn_step_per_worker_box", bn_step_section),
                        ("step_rate_gpu", step_rate_section),
                        ("gpu_check", gpu_check_section)):
    result = _load(name)
    if result is not None:  # from the device machine (DEVICE.md)
      sections.append(section(result, result.get("command", DEVICE_COMMANDS[name])).replace(
          "\n\n", f" on {result['machine']}\n\n", 1))
  resnet = _load("resnet50")
  if resnet is not None and resnet.get("device") != "CPU":
    sections.append(resnet50_section(resnet, _load("resnet50_bf16")))
  else:
    sections.append(
        "## 6. ResNet-50 on the H100 (GPU build)\n\nNot run: no device machine was "
        "lent to the sessions that wrote these results. **Needs the GPU box**: "
        f"`{DEVICE_COMMANDS['resnet50']}` there, as benchmarks/DEVICE.md says.")
  notes = ""
  if os.path.exists(notes_path):
    with open(notes_path) as f:
      notes = "\n\n" + f.read().strip()
  header = (
      "# Benchmark results\n\n"
      f"Machine: {machine or platform.node()}; written "
      f"{datetime.date.today().isoformat()} by `python -m benchmarks.report`. Every "
      "comparison ran ours and the `tf.distribute` (or plain) equivalent in the same "
      "run, alternating"
      + (", but where a table says otherwise (item 6's bf16 + XLA)"
         if any("(separate run)" in section for section in sections) else "")
      + "; absolute times on this shared machine are noise, the ratios are the result. "
      "The device machine's tables name it. Raw figures: `benchmarks/results/*.json`.")
  sections.insert(0, summary_section())
  with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
    f.write(header + "\n\n" + "\n\n".join(sections) + notes + "\n")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--no-run", action="store_true")
  parser.add_argument("--only", default=",".join(COMMANDS))
  args = parser.parse_args()
  if not args.no_run:
    run_all(args.only.split(","))
  write_report()
  print(os.path.join(HERE, "RESULTS.md"))


if __name__ == "__main__":
  main()
