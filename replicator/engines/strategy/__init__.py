"""The strategy engine: steps that `tf.distribute` replicates (`TpuReplicator`'s),
on a TPU, on a stand-in over logical CPUs or on a fake TPU (docs/design.md, "The
strategy engine")."""
