"""The job's other worker processes.

- `cluster`: connecting to the workers, naming collectives, the heartbeat.
- `peers`: talking to them outside a step (joining, initial values, counters).
"""
