"""The job's other worker processes.

- `cluster`: connecting to the workers, naming collectives.
- `liveness`: whether they are alive (the heartbeat), and which one was lost.
- `peers`: talking to them outside a step (joining, initial values, counters).
"""
