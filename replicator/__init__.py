"""replicator: write the step for one device, run it on many.

>>> import replicator
>>> repl = replicator.GpuReplicator(device="/cpu:0")
>>> repl.num_replicas
1
"""

from replicator import _tf_check  # noqa: F401  (first: a clear error for a missing or old TF)

from replicator import nn
from replicator import testing
from replicator.base import Replicator
from replicator.errors import ReplicasDiverged
from replicator.checkpoint import Checkpointer
from replicator.errors import CheckpointCorrupted
from replicator.errors import WorkerLost
from replicator.collectives.reduce_options import AllReduceOptions
from replicator.collectives.reduce_options import Compression
from replicator.collectives.reduce_options import ReduceOp
from replicator.errors import InputExhausted
from replicator.gpu import GpuReplicator
from replicator.gpu import MultiGpuReplicator
from replicator.inputs.input_context import InputContext
from replicator.inputs.input_context import allow_uneven_batches
from replicator.inputs.input_context import pad_to_global_batch
from replicator.inputs.input_context import skipped_by_input_fn
from replicator.mesh import Mesh
from replicator.optimizers import ReplicatedOptimizer
from replicator.tpu import TpuReplicator
from replicator.variables.replicated import ReplicatedVariable

__version__ = "0.1.0"

__all__ = (
    "AllReduceOptions",
    "CheckpointCorrupted",
    "Checkpointer",
    "Compression",
    "GpuReplicator",
    "InputContext",
    "InputExhausted",
    "Mesh",
    "MultiGpuReplicator",
    "ReduceOp",
    "ReplicasDiverged",
    "ReplicatedOptimizer",
    "ReplicatedVariable",
    "Replicator",
    "TpuReplicator",
    "WorkerLost",
    "allow_uneven_batches",
    "nn",
    "pad_to_global_batch",
    "skipped_by_input_fn",
    "testing",
)
