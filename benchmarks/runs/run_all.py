"""Runs the benchmarks that this machine can, each writing benchmarks/results/NAME.json.

  python -m benchmarks.runs.run_all [--only step_rate,gan_step]

`python -m benchmarks.report` runs them and then renders RESULTS.md. The
commands are here, apart from the rendering, so that a table of RESULTS.md can
name the command behind a result that does not record it.
"""

import argparse
import os
import shlex
import subprocess
import sys

# benchmarks/, and the project root the commands run in.
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(BENCHMARKS, "results")

COMMANDS = {
    "step_rate": "python -m benchmarks.runs.step_rate --replicas 2 --rounds 20",
    "allreduce": "python -m benchmarks.runs.allreduce --workers 2,4 --rounds 3",
    "allreduce_lanes": ("python -m benchmarks.runs.allreduce --workers 2,4 --rounds 3 --variants "
                        "'ours fp32 packed;ours fp32, 8MB buckets, 4 in flight;"
                        "ours fp32, 16MB buckets, 2 in flight;ours bf16;"
                        "ours bf16, 8MB buckets, 4 in flight;ours bf16, 16MB buckets, 2 in flight;"
                        "MWMS RING, bytes_per_pack=0;MWMS RING, bytes_per_pack=32MB;"
                        "transfer alone: one bf16 tensor'"),
    "scaling": "python -m benchmarks.runs.scaling --workers 1,2,4 --rounds 3 --iters 10",
    "scaling_compute": ("python -m benchmarks.runs.scaling --workers 1,2,4 --batch 5120 "
                        "--rounds 2 --iters 5"),
    "gan_step": "python -m benchmarks.runs.gan_step --batch 64 --rounds 5",
    "checkpoint_roundtrip": "python -m benchmarks.runs.checkpoint_roundtrip",
    "gather_step": "python -m benchmarks.runs.gather_step --workers 2,4 --rounds 3",
    "first_step": "python -m benchmarks.runs.first_step --replicas 1,2 --rounds 3",
    "bn_step": "python -m benchmarks.runs.bn_step --workers 2,4 --rounds 3",
    "bn_step_per_worker": ("python -m benchmarks.runs.bn_step --workers 2,4 --rounds 3 "
                           "--statistics per-worker"),
}
# Run on the device machine by benchmarks/device/run.sh (DEVICE.md), not by `run`:
# their JSON comes back from there into results/, each naming the command that made it.
DEVICE_COMMANDS = {
    "resnet50": "python -m benchmarks.runs.resnet50 --batch 128 --rounds 3 --calls 2",
    "allreduce_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.allreduce --workers 8,4,2 "
                      "--rounds 2"),
    "allreduce_box_lanes": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.allreduce --workers 8 "
                            "--rounds 3"),
    "allreduce_box_sizes": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.allreduce --workers 8 "
                            "--rounds 2"),
    "allreduce_box_grpc": ("BENCH_GRPC=channels=4 CUDA_VISIBLE_DEVICES= "
                           "python -m benchmarks.runs.allreduce --workers 8 --rounds 2"),
    "step_rate_box_threads": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.step_rate "
                              "--replicas 2 --rounds 10 --threads 2,2"),
    "scaling_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.scaling --workers 1,8 "
                    "--rounds 2 --iters 10"),
    "scaling_box_compute": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.scaling --workers 1,8 "
                            "--batch 5120 --rounds 2 --iters 3"),
    "step_rate_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.step_rate --replicas 2 "
                      "--rounds 10"),
    "allreduce_box_default": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.allreduce "
                              "--workers 8 --rounds 2"),
    "bn_step_per_worker_box": ("CUDA_VISIBLE_DEVICES= python -m benchmarks.runs.bn_step "
                               "--workers 8 --rounds 1 --iters 8 --statistics per-worker"),
    "step_rate_gpu": ("python -m benchmarks.runs.step_rate --gpus --replicas 2 --rounds 2 "
                      "--steps 200"),
    "gpu_check": "python3 -m benchmarks.checks.gpu_check",
}


def run(names):
  """Runs COMMANDS[name] for each of `names`, one after another (they share the
  machine's cores), each writing its JSON into results/."""
  os.makedirs(RESULTS, exist_ok=True)
  for name in names:
    command = shlex.split(COMMANDS[name]) + ["--json", os.path.join(RESULTS, f"{name}.json")]
    print("+", " ".join(command), flush=True)
    subprocess.run([sys.executable] + command[1:], check=True,
                   cwd=os.path.dirname(BENCHMARKS))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--only", default=",".join(COMMANDS),
                      help="comma-separated names of COMMANDS (default: all)")
  run(parser.parse_args().only.split(","))


if __name__ == "__main__":
  main()
