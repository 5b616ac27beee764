"""Runs the benchmarks (or reads their JSON) and writes benchmarks/RESULTS.md.

  python -m benchmarks.report            # run all, then write RESULTS.md
  python -m benchmarks.report --no-run   # rewrite RESULTS.md from results/*.json

The work is in three places: benchmarks/runs/run_all.py runs the commands, each
writing its JSON under benchmarks/results/; render.py here (with sections.py
and other_sections.py) turns those into RESULTS.md; and targets.json here holds
every target the tables judge by.
"""

import argparse

from benchmarks.report import render
from benchmarks.runs import run_all


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--no-run", action="store_true",
                      help="only rewrite RESULTS.md from the JSON under results/")
  parser.add_argument("--only", default=",".join(run_all.COMMANDS),
                      help="comma-separated names of the benchmarks to run (default: all)")
  args = parser.parse_args()
  if not args.no_run:
    run_all.run(args.only.split(","))
  print(render.write_report())


if __name__ == "__main__":
  main()
