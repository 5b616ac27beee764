"""What both engines share about variables.

- `registry`: which variables are per-replica copies, and of what.
- `merge_rules`: what a write inside a step becomes, on either engine.
- `replicated`: `ReplicatedVariable`, the in-graph engine's variable, one
  copy per replica, writes merged.
- `deferred`: the writes whose merge waits for the end of the step, and the
  record of the library's own writes.
- `lifting`: the variables a step's first trace creates, made outside it and
  initialized after it.
"""
