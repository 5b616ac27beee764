"""The two engines a `Replicator` runs its steps on, behind one `Engine`.

- `protocol`: `Engine`, the interface `base.Replicator` calls.
- `step_args`, `step_checks`: what both share: how `run`'s `args` reach the
  step, and the errors of a step that cannot run.
- `in_graph`: the in-graph engine (`GpuReplicator`, `MultiGpuReplicator`):
  every local replica traced into one graph, collectives built between the
  traces, several workers, deferred merges and interrupts.
- `strategy`: the strategy engine (`TpuReplicator`): `tf.distribute` (a
  `TPUStrategy`) traces one step for every replica.

Both build on `variables` (which variables are copies, how writes merge,
initial values lifted out of the first trace) and on the replica interface
of `collectives.replica_context`; docs/design.md sets them side by side.
"""
