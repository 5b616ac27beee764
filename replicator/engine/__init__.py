"""The in-graph engine: replicated variables and the compiled step.

- `registry`: which variables are per-replica copies.
- `variables`: `ReplicatedVariable`, one copy per replica, writes merged.
- `merges`: the writes whose merge waits for the end of the step, and the
  record of the library's own writes.
- `creation`: the variable factory of `repl.context()` and of a step's first trace.
- `step_args`: how `run`'s `args` reach the step.
- `step_checks`: the errors of a step that cannot run, and the program check.
- `effects`: what in a traced step has effects, and the gate that holds them.
- `steps`: `CompiledStep`, k steps of every replica in one call.
- `interrupts`: SIGINT and SIGTERM end a call of several steps between two steps.
- `divergence`: whether the copies still agree.
- `generators`: `ReplicaGenerator`, a random generator per replica.
- `engine`: `InGraphEngine`, what `Replicator` runs the steps on (the
  interface `strategy_engine.StrategyEngine` shares).
"""
