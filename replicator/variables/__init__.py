"""What both engines share about variables.

- `registry`: which variables are per-replica copies, and of what.
- `replicated`: `ReplicatedVariable`, the in-graph engine's variable, one
  copy per replica, writes merged.
- `deferred`: the writes whose merge waits for the end of the step, and the
  record of the library's own writes.
- `creation`: the variable factory of `repl.context()` and of a step's first
  trace, and initial values lifted out of that trace.
"""
