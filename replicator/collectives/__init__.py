"""Reductions between replicas and workers: the all-reduce core.

- `reduce_options`: `ReduceOp`, `Compression`, `AllReduceOptions`, and the checks of a value.
- `replica_context`: which replica is being traced, and where the replicas meet at a collective.
- `packing`: many tensors reduced as one bucket.
- `between_workers`: TensorFlow's collective ops over gRPC, between worker processes.
- `reductions`: all-reduce and broadcast over the local replicas (then the workers).
- `gathering`: all-gather, with parts of different sizes between workers.
- `in_step`: the collectives as `step_fn` calls them (nests in, nests out, gradients).
"""
