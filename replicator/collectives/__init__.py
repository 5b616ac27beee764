"""Reductions between replicas and workers: the all-reduce core.

- `reduce_options`: `ReduceOp`, `Compression`, `AllReduceOptions`, and the checks of a value.
- `replica_context`: the replica interface (`Replica`, `current()`) of both engines; the
  in-graph engine's replica, and where its replicas meet at a collective.
- `in_graph`: the in-graph replica's collectives and their gradients.
- `packing`: many tensors reduced as one bucket.
- `between_workers`: TensorFlow's collective ops over gRPC, between worker processes.
- `reductions`: all-reduce and broadcast over the local replicas (then the workers).
- `gathering`: all-gather, with parts of different sizes between workers.
- `in_step`: the collectives as `step_fn` calls them (nests in, nests out, the checks).
"""
